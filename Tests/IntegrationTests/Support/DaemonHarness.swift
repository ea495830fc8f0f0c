import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// Starts the real `keychaind` binary on a temporary socket, data dir and config, with registered apps.
///
/// By default the test runner's own executable is registered as app `TEAM.tests` with groups
/// `TEAM.tests` and `TEAM.shared`, so in-process clients are allowed.
final class DaemonHarness: @unchecked Sendable {
    struct App {
        var id: String
        var groups: [String]
        var executables: [String]
        var admin = false
    }

    /// The folder holding the built products (keychaind, keychainctl, the test bundle).
    static let productsDirectory: String = {
        let exe =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        return (exe as NSString).deletingLastPathComponent
    }()

    /// scripts/campaign of this checkout: `kcwire.py`, the raw client and process helpers that test
    /// scripts import.
    static let campaignDirectory: String = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("scripts/campaign").path

    /// The first line of a Python script run from a test that imports `kcwire`.
    static var kcwireImportable: String { "import sys; sys.path.insert(0, \"\(campaignDirectory)\")\n" }

    static var daemonPath: String { productsDirectory + "/keychaind" }
    static var cliPath: String { productsDirectory + "/keychainctl" }
    static var runnerExecutable: String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
    }

    /// `KEYCHAIND_TEST_NO_PEER_PIDFD=1`: every daemon of the suite runs with getsockopt(SO_PEERPIDFD)
    /// failing (a seccomp filter, kcwire.py --no-peer-pidfd), as on Debian 12's kernel (6.1), so
    /// scripts/test runs the identity tests on both of keychaind's ways to pin a peer.
    static let suiteForcesNoPeerPidfd = ProcessInfo.processInfo.environment["KEYCHAIND_TEST_NO_PEER_PIDFD"] == "1"

    /// The program and arguments that start `daemon` with `arguments`: through the seccomp filter
    /// when `noPeerPidfd` (the pid stays the daemon's: the filter's script execs it).
    static func launch(
        _ daemon: String, _ arguments: [String], noPeerPidfd: Bool, kcwire: String = campaignDirectory + "/kcwire.py"
    ) -> (String, [String]) {
        guard noPeerPidfd else { return (daemon, arguments) }
        return ("/usr/bin/python3", [kcwire, "--no-peer-pidfd", daemon] + arguments)
    }

    static let defaultApps = [
        App(id: "TEAM.tests", groups: ["TEAM.tests", "TEAM.shared"], executables: [runnerExecutable])
    ]

    let root: String
    let socketPath: String
    let dataDirectory: String
    let configFile: String
    /// The user's apps.d (beside the config file): trusted as it is only while no passphrase is set.
    let appsDirectory: String
    /// A root-owned directory passed as `--system-apps-dir`: trusted whatever the passphrase (the
    /// suite runs as root, and everything on the way to it is root's).
    let systemAppsDirectory: String
    let logFile: String
    private(set) var process: Process?
    /// Whether this daemon runs as on a kernel without SO_PEERPIDFD (`launch`).
    var noPeerPidfd = DaemonHarness.suiteForcesNoPeerPidfd

    init(apps: [App] = DaemonHarness.defaultApps, config: String = "{}", start: Bool = true) throws {
        root = NSTemporaryDirectory() + "keychaind-test-" + UUID().uuidString.prefix(8)
        socketPath = root + "/run/keychaind.sock"
        dataDirectory = root + "/data"
        configFile = root + "/config/keychaind.json"
        appsDirectory = root + "/config/apps.d"
        systemAppsDirectory = root + "/system/apps.d"
        logFile = root + "/daemon.log"
        try FileManager.default.createDirectory(atPath: appsDirectory, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: systemAppsDirectory, withIntermediateDirectories: true)
        try config.writeReplacing(configFile)
        for (i, app) in apps.enumerated() { try register(app, name: "app\(i)") }
        if start { try self.start() }
    }

    deinit {
        if let p = process, p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: root)
    }

    /// Writes a registration: by default into the root-owned system directory (counts whatever the
    /// passphrase); with `user: true` into the user's apps.d (counts while no passphrase is set, or
    /// once approved).
    func register(_ app: App, name: String, user: Bool = false) throws {
        var object: [String: Any] = [
            "application-identifier": app.id, "keychain-access-groups": app.groups,
            "executables": app.executables,
        ]
        if app.admin { object["admin"] = true }
        let data = try JSONSerialization.data(withJSONObject: object)
        try data.write(to: URL(fileURLWithPath: (user ? appsDirectory : systemAppsDirectory) + "/\(name).json"))
    }

    var arguments: [String] {
        [
            "--socket", socketPath, "--data-dir", dataDirectory, "--config", configFile, "--log-level", "debug",
            "--system-apps-dir", systemAppsDirectory,
        ]
    }

    /// Launches the daemon and waits until its socket answers.
    func start(extraEnvironment: [String: String] = [:]) throws {
        let p = Process()
        let (program, args) = Self.launch(Self.daemonPath, arguments, noPeerPidfd: noPeerPidfd)
        p.executableURL = URL(fileURLWithPath: program)
        p.arguments = args
        var env = ProcessInfo.processInfo.environment
        for (k, v) in extraEnvironment { env[k] = v }
        p.environment = env
        // Not FileManager.createFile: on Linux it writes atomically, leaving a folder in /tmp behind.
        try "".write(toFile: logFile, atomically: false, encoding: .utf8)
        let log = FileHandle(forWritingAtPath: logFile)!
        log.seekToEndOfFile()
        p.standardError = log
        p.standardOutput = log
        try p.run()
        process = p
        try waitUntilServing()
    }

    /// How long the harness waits for an event before calling it a failure. Generous on purpose: a
    /// loaded 2-core machine running the suite under ThreadSanitizer may take many seconds to start a
    /// daemon, and a test may be slow there; it must not fail for it.
    static let eventTimeout: TimeInterval = 120

    func waitUntilServing(timeout: TimeInterval = DaemonHarness.eventTimeout) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let s = try? UnixSocket.connect(to: socketPath) {
                s.close()
                return
            }
            if let p = process, !p.isRunning {
                throw HarnessError("keychaind exited with \(p.terminationStatus) before serving:\n\(log)")
            }
            usleep(20_000)
        }
        throw HarnessError("keychaind did not serve within \(timeout) s:\n\(log)")
    }

    var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

    /// SIGTERM and wait; returns the exit status.
    @discardableResult
    func stop() -> Int32 {
        guard let p = process else { return -1 }
        if p.isRunning { kill(p.processIdentifier, SIGTERM) }
        p.waitUntilExit()
        process = nil
        return p.terminationStatus
    }

    func kill9() {
        guard let p = process else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        process = nil
    }

    /// Sends SIGHUP and waits until the daemon has acted on it (its log says the apps were
    /// reloaded, or why not), so the next request sees the new registrations.
    func reloadApps() {
        guard let p = process else { return }
        let before = reloadCount
        kill(p.processIdentifier, SIGHUP)
        XCTAssertTrue(waitFor { self.reloadCount > before }, "keychaind did not act on SIGHUP:\n\(log)")
    }

    /// The reloads SIGHUP made, done or refused. keychaind also reloads when a file in apps.d changes
    /// (a test's own writes among them); those are not counted, so a wait for a SIGHUP's reload
    /// always ends with one that began after the signal.
    private var reloadCount: Int {
        log.components(separatedBy: "why=SIGHUP").count - 1
    }

    /// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
    func waitFor(timeout: TimeInterval = DaemonHarness.eventTimeout, _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if try condition() { return true }
            usleep(10_000)
        }
        return try condition()
    }

    /// A raw protocol connection (no client library), for wire-level tests.
    func connect() throws -> RawClient { try RawClient(path: socketPath) }

    /// Runs a program to completion; returns exit status and its output.
    @discardableResult
    func run(_ executable: String, _ args: [String], stdin: String? = nil, environment: [String: String] = [:]) throws
        -> ProgramResult
    {
        var env = ProcessInfo.processInfo.environment
        env["KEYCHAIND_SOCKET"] = socketPath
        for (k, v) in environment { env[k] = v }
        return try runToCompletion(executable, args, environment: env, stdin: stdin)
    }
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// A minimal protocol client for wire-level tests: send frames, read responses.
final class RawClient {
    let socket: UnixSocket
    var frames = FrameBuffer(maxBytes: 64 << 20)
    var nextID: Int64 = 1

    /// A daemon that stops answering fails the test after `DaemonHarness.eventTimeout` instead of
    /// hanging the suite.
    init(path: String) throws {
        socket = try UnixSocket.connect(to: path)
        var tv = timeval(tv_sec: Int(DaemonHarness.eventTimeout), tv_usec: 0)
        setsockopt(socket.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    func send(_ request: Request) throws { try socket.writeAll(Frame.encode(request.value)) }
    func sendRaw(_ bytes: [UInt8]) throws { try socket.writeAll(bytes) }

    func receive() throws -> Response {
        guard let body = try socket.readFrame(&frames) else { throw HarnessError("connection closed") }
        return try Response(CBOR.decode(body))
    }

    /// True when the daemon has closed the connection (read returns end of stream).
    func isClosed() -> Bool {
        (try? socket.readFrame(&frames)) == nil
    }

    func call(
        _ op: String, query: [String: Value]? = nil, attributes: [String: Value]? = nil,
        arguments: [String: Value] = [:]
    ) throws -> Response {
        let id = nextID
        nextID += 1
        try send(Request(id: id, op: op, query: query, attributes: attributes, arguments: arguments))
        let r = try receive()
        XCTAssertEqual(r.id, id)
        return r
    }
}

extension String {
    /// Writes the text to `path` all at once, as `write(toFile:atomically: true)` means to (a
    /// temporary file beside it, then a rename, so a daemon reloading meanwhile never reads half of
    /// it), without that call's leftovers: on Linux it leaves a `/tmp/TemporaryDirectory.*` folder
    /// behind on every call, hundreds per test run.
    func writeReplacing(_ path: String) throws {
        let temporary = path + ".writing-" + UUID().uuidString.prefix(8)
        try write(toFile: temporary, atomically: false, encoding: .utf8)
        guard rename(temporary, path) == 0 else {
            try? FileManager.default.removeItem(atPath: temporary)
            throw HarnessError("cannot rename \(temporary) to \(path)")
        }
    }
}
