import Foundation
import XCTest

/// A keychaind run as a throwaway non-root uid, and programs run as that uid against it.
///
/// The suite runs as root, and for root "a file the user can modify" is every file; what an
/// unprivileged local program can do to the keychain is only seen from an unprivileged uid. So the
/// daemon, keychainctl and the attack scripts run through `setpriv` as `uid`, with a home of their
/// own, while the registered executables live root-owned beside the binaries (as a package installs
/// them). A copy of scripts/campaign/kcwire.py (a stdlib-only raw client) is at `kcwire`.
final class UserSession: @unchecked Sendable {
    let uid: UInt32
    /// Root-owned (0755): binaries, registered apps, the system registration directory.
    let root: String
    /// Owned by `uid` (0700): runtime, data and config directories.
    let home: String
    let bin: String
    let socketPath: String
    let dataDirectory: String
    let configFile: String
    let appsDirectory: String
    let systemAppsDirectory: String
    let logFile: String
    var daemonPath: String { bin + "/keychaind" }
    /// The keychainctl beside keychaind: the built-in plain app unless a registration names it.
    var cliPath: String { bin + "/keychainctl" }
    /// Another copy of keychainctl, registered (root-owned, in the system directory) as the admin.
    var adminCLIPath: String { bin + "/admin/keychainctl" }
    private(set) var process: Process?
    /// Whether the daemon runs as on a kernel without SO_PEERPIDFD (DaemonHarness.launch).
    var noPeerPidfd = DaemonHarness.suiteForcesNoPeerPidfd

    static let python = "/usr/bin/python3"

    /// A session of a new throwaway uid, or of `uid` (several keychaind of one user: sync devices).
    init(config: String = #"{"kdfProfile": "interactive"}"#, uid userID: UInt32? = nil) throws {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") else {
            throw HarnessError(
                "needs root and setpriv to run keychaind as a throwaway uid (scripts/deps installs util-linux)")
        }
        uid = userID ?? Self.newUID()
        root = NSTemporaryDirectory() + "keychaind-user-" + UUID().uuidString.prefix(8)
        home = root + "/home"
        bin = root + "/bin"
        socketPath = home + "/run/keychaind.sock"
        dataDirectory = home + "/data"
        configFile = home + "/config/keychaind.json"
        appsDirectory = home + "/config/apps.d"
        systemAppsDirectory = root + "/system/apps.d"
        logFile = root + "/daemon.log"
        let fm = FileManager.default
        for dir in [bin + "/admin", systemAppsDirectory, appsDirectory, home + "/run", dataDirectory] {
            try fm.createDirectory(atPath: dir, withIntermediateDirectories: true)
        }
        chmod(root, 0o755)
        for (from, to) in [
            (DaemonHarness.daemonPath, daemonPath), (DaemonHarness.cliPath, cliPath),
            (DaemonHarness.cliPath, adminCLIPath),
        ] {
            try fm.copyItem(atPath: from, toPath: to)
            chmod(to, 0o755)
        }
        try fm.copyItem(atPath: DaemonHarness.campaignDirectory + "/kcwire.py", toPath: bin + "/kcwire.py")
        try config.writeReplacing(configFile)
        // The home and everything in it belong to the throwaway user.
        for path in [home, home + "/run", home + "/data", home + "/config", appsDirectory, configFile] {
            chown(path, uid, uid)
            chmod(path, path == configFile ? 0o600 : 0o700)
        }
        try "".write(toFile: logFile, atomically: false, encoding: .utf8)
    }

    /// A throwaway uid (no account of the system has it).
    static func newUID() -> UInt32 { 61_000 + UInt32.random(in: 0..<4_000) }

    deinit {
        if let p = process, p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: root)
    }

    /// A copy of the system Python at `bin/name`, root-owned: an executable of its own to register.
    @discardableResult
    func makeApp(_ name: String) throws -> String {
        let path = bin + "/" + name
        try FileManager.default.copyItem(atPath: AppPaths.realPath(Self.python)!, toPath: path)
        chmod(path, 0o755)
        return path
    }

    /// A registration in the root-owned system directory (counts whatever the passphrase).
    func registerSystem(_ app: DaemonHarness.App, name: String) throws {
        try write(app, to: systemAppsDirectory + "/\(name).json")
    }

    /// A registration in the user's apps.d, written as the user would.
    func registerUser(_ app: DaemonHarness.App, name: String) throws {
        let path = appsDirectory + "/\(name).json"
        try write(app, to: path)
        chown(path, uid, uid)
    }

    private func write(_ app: DaemonHarness.App, to path: String) throws {
        var object: [String: Any] = [
            "application-identifier": app.id, "keychain-access-groups": app.groups,
            "executables": app.executables,
        ]
        if app.admin { object["admin"] = true }
        try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: path))
    }

    var setpriv: [String] { ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] }

    var environment: [String: String] {
        [
            "HOME": home, "KEYCHAIND_SOCKET": socketPath, "PATH": "/usr/bin:/bin", "PYTHONPATH": bin,
            "XDG_CONFIG_HOME": home + "/config", "SWIFT_BACKTRACE": "enable=no",
        ]
    }

    /// Starts keychaind as `uid` and waits until its log says it serves.
    func start() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        let (program, args) = DaemonHarness.launch(
            daemonPath,
            [
                "--socket", socketPath, "--data-dir", dataDirectory, "--config", configFile,
                "--log-level", "debug", "--system-apps-dir", systemAppsDirectory,
            ], noPeerPidfd: noPeerPidfd, kcwire: bin + "/kcwire.py")
        p.arguments = setpriv + [program] + args
        p.environment = environment
        let log = FileHandle(forWritingAtPath: logFile)!
        log.seekToEndOfFile()
        p.standardError = log
        p.standardOutput = log
        let startsBefore = self.log.components(separatedBy: "keychaind started").count
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(DaemonHarness.eventTimeout)
        while self.log.components(separatedBy: "keychaind started").count == startsBefore {
            guard p.isRunning else { throw HarnessError("keychaind exited with \(p.terminationStatus):\n\(self.log)") }
            guard Date() < deadline else { throw HarnessError("keychaind did not start:\n\(self.log)") }
            usleep(10_000)
        }
    }

    var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

    var daemonPID: Int32 { process?.processIdentifier ?? -1 }

    func stop() {
        guard let p = process else { return }
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        process = nil
    }

    /// SIGHUP, then waits until the daemon has re-read its registrations.
    func reload() {
        // Counted by the SIGHUP's own log line: keychaind also reloads when apps.d changes.
        let before = log.components(separatedBy: "why=SIGHUP").count
        if let p = process { kill(p.processIdentifier, SIGHUP) }
        let deadline = Date().addingTimeInterval(DaemonHarness.eventTimeout)
        while log.components(separatedBy: "why=SIGHUP").count == before && Date() < deadline { usleep(10_000) }
    }

    /// Runs `executable` as `uid` to completion.
    @discardableResult
    func run(_ executable: String, _ args: [String], stdin: String? = nil) throws -> ProgramResult {
        try runToCompletion(
            "/usr/bin/setpriv", setpriv + [executable] + args, environment: environment,
            currentDirectory: home, stdin: stdin)
    }

    /// A file only `uid` can read (a passphrase file for keychainctl).
    func privateFile(_ name: String, _ contents: String) throws -> String {
        let path = home + "/" + name
        try contents.writeReplacing(path)
        chown(path, uid, uid)
        chmod(path, 0o600)
        return path
    }

    /// Runs a Python script (with `kcwire` importable) through `interpreter`, as `uid`; returns the
    /// JSON object it prints last.
    func script(
        _ code: String, interpreter: String = UserSession.python, _ args: [String] = [],
        exitStatus: Int32? = 0
    ) throws -> [String: Any] {
        let out = try run(interpreter, ["-c", code] + args)
        guard exitStatus == nil || out.status == exitStatus, let line = out.stdout.split(separator: "\n").last,
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        else {
            throw HarnessError("script failed (\(out.status)):\n\(out.stdout)\n\(out.stderr)")
        }
        return object
    }
}
