import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// Caller identity against the real daemon: a registered executable replaced on disk, and a pid that
/// is recycled between connect and the daemon's lookup. (Another uid and an unregistered executable:
/// DaemonLifecycleTests.testAnotherUIDIsRefused / testAnUnregisteredExecutableGetsMissingEntitlement….)
///
/// The "apps" here are copies of the system Python at paths of their own, so each is a distinct
/// executable the test can register, replace and run with a script.
final class IdentityTests: XCTestCase {
    static let python = "/usr/bin/python3"

    /// Connects, answers one request per stdin line: "old" (on the first connection), "new" (on a new
    /// connection), "quit". Prints each response body as hex, or "closed".
    static let appScript = """
        import os, socket, sys
        path, req = sys.argv[1], bytes.fromhex(sys.argv[2])
        sent_on = set()
        def call(s):
            try:
                if s.fileno() in sent_on:
                    s.sendall(req)
                else:                             # a connection's first bytes carry our pidfd
                    sent_on.add(s.fileno())
                    pidfd = os.pidfd_open(os.getpid())
                    sent = socket.send_fds(s, [req], [pidfd]); os.close(pidfd)
                    s.sendall(req[sent:])
                data = b''
                while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], 'big'):
                    c = s.recv(65536)
                    if not c: return 'closed'
                    data += c
                return data[4:4 + int.from_bytes(data[:4], 'big')].hex()
            except OSError:
                return 'closed'
        first = socket.socket(socket.AF_UNIX); first.connect(path)
        print(call(first), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == 'old': print(call(first), flush=True)
            elif cmd == 'new':
                s = socket.socket(socket.AF_UNIX); s.connect(path); print(call(s), flush=True)
                sent_on.discard(s.fileno()); s.close()
            else: break
        """

    /// Run as a helper (Foundation's Process and forked grandchildren do not mix well): freezes the
    /// daemon (SIGSTOP) so the connection waits unidentified in the listen backlog; process A connects,
    /// forks B (which inherits the connection) and exits; A is reaped; then, through
    /// /proc/sys/kernel/ns_last_pid, the registered app is started with A's pid; the daemon resumes
    /// and B sends the request on A's connection. Prints one JSON line.
    static let recycleScript = """
        import json, os, signal, socket, subprocess, sys, time
        daemon, path, req, registered = int(sys.argv[1]), sys.argv[2], bytes.fromhex(sys.argv[3]), sys.argv[4]
        def answer(s):
            data = b''
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], 'big'):
                c = s.recv(65536)
                if not c: return 'closed'
                data += c
            return data[4:].hex()
        from kcwire import stop_process
        stop_process(daemon)
        impostor = None
        try:
            go_r, go_w = os.pipe()
            r, w = os.pipe()
            a = os.fork()
            if a == 0:
                s = socket.socket(socket.AF_UNIX); s.connect(path)
                if os.fork():
                    os._exit(0)                       # A exits; B keeps the connection
                os.read(go_r, 1)                      # B waits for the go
                try:
                    s.sendall(req); out = answer(s)
                except OSError as e:
                    out = 'closed'
                os.write(w, out.encode() + b'\\n'); os._exit(0)
            os.waitpid(a, 0)                          # A is reaped: its pid is free
            for _ in range(30):
                try:
                    with open('/proc/sys/kernel/ns_last_pid', 'w') as f: f.write(str(a - 1))
                except OSError:
                    break
                p = subprocess.Popen([registered, '-c', 'import time; time.sleep(60)'])
                if p.pid == a:
                    impostor = p; break
                p.kill(); p.wait()
        finally:
            os.kill(daemon, signal.SIGCONT)
        os.write(go_w, b'g')
        line = b''
        while not line.endswith(b'\\n'):
            line += os.read(r, 65536)
        if impostor: impostor.kill(); impostor.wait()
        print(json.dumps({"pid": a, "recycled": impostor is not None, "response": line.decode().strip()}))
        """

    static var copyRequest: String {
        let r = Request(id: 1, op: "copy", query: ["class": .text("genp"), "svce": .text("com.example.identity")])
        return Frame.encode(r.value).map { String(format: "%02x", $0) }.joined()
    }

    func pythonBinary() throws -> String {
        guard let real = AppPaths.realPath(Self.python) else {
            throw HarnessError("\(Self.python) is missing (scripts/deps installs python3)")
        }
        return real
    }

    /// A copy of the Python binary at `path` (its own executable, as far as the daemon can tell).
    func makeApp(at path: String) throws {
        try? FileManager.default.removeItem(atPath: path)
        try FileManager.default.copyItem(atPath: try pythonBinary(), toPath: path)
        chmod(path, 0o755)
    }

    func response(_ line: String?, file: StaticString = #filePath, line l: UInt = #line) throws -> Response {
        guard let line, line != "closed" else { throw HarnessError("no response (connection closed)") }
        var bytes: [UInt8] = []
        var hex = Substring(line)
        while hex.count >= 2 {
            bytes.append(UInt8(hex.prefix(2), radix: 16)!)
            hex = hex.dropFirst(2)
        }
        return try Response(CBOR.decode(bytes))
    }

    func testARegisteredExecutableReplacedOnDiskIsRefusedOnItsNextConnection() throws {
        let d = try DaemonHarness(apps: [], start: false)
        let exe = d.root + "/app/registered-app"
        try FileManager.default.createDirectory(atPath: d.root + "/app", withIntermediateDirectories: true)
        try makeApp(at: exe)
        try d.register(
            DaemonHarness.App(id: "TEAM.replaced", groups: ["TEAM.replaced"], executables: [exe]), name: "replaced")
        try d.start()

        let app = try ScriptProcess(exe, ["-c", Self.appScript, d.socketPath, Self.copyRequest])
        defer { app.stop() }
        XCTAssertEqual(try response(app.readLine()).status, .itemNotFound, "the registered app is served")

        // An in-place overwrite of a running executable is impossible (ETXTBSY)…
        let fd = open(exe, O_WRONLY)
        XCTAssertEqual(fd, -1)
        XCTAssertEqual(errno, ETXTBSY)
        if fd >= 0 { close(fd) }
        // …so replacing means a new file renamed over the path (what installers do).
        try makeApp(at: exe + ".new")
        XCTAssertEqual(rename(exe + ".new", exe), 0)

        // The connection accepted before the replacement keeps the identity read at accept time.
        app.writeLine("old")
        XCTAssertEqual(try response(app.readLine()).status, .itemNotFound)
        // A new connection from the old process: /proc/<pid>/exe ends in " (deleted)" → refused.
        app.writeLine("new")
        let refused = try response(app.readLine())
        XCTAssertEqual(refused.status, .missingEntitlement)
        XCTAssertTrue(refused.message?.contains("deleted or replaced") ?? false, refused.message ?? "")

        // A process started from the new file at the registered path is that app (the path is trusted).
        let fresh = try ScriptProcess(exe, ["-c", Self.appScript, d.socketPath, Self.copyRequest])
        defer { fresh.stop() }
        XCTAssertEqual(try response(fresh.readLine()).status, .itemNotFound)
    }

    /// The connecting process exits (and is reaped) before the daemon accepts, and — where the test
    /// can arrange it through /proc/sys/kernel/ns_last_pid — a registered app is started with the same
    /// pid. The connection, inherited by a child of the exited process, must be refused: the daemon
    /// identifies the process that connected (SO_PEERPIDFD), never whatever now holds its pid number.
    func testAPidRecycledBetweenConnectAndLookupIsRefused() throws {
        let d = try DaemonHarness(apps: [], start: false)
        let registered = d.root + "/app/registered-app"
        try FileManager.default.createDirectory(atPath: d.root + "/app", withIntermediateDirectories: true)
        try makeApp(at: registered)
        try d.register(
            DaemonHarness.App(id: "TEAM.victim", groups: ["TEAM.victim"], executables: [registered]), name: "victim")
        try d.start()
        let daemonPid = try XCTUnwrap(d.process?.processIdentifier)

        let out = try d.run(
            try pythonBinary(),
            [
                "-c", DaemonHarness.kcwireImportable + Self.recycleScript, String(daemonPid), d.socketPath,
                Self.copyRequest, registered,
            ])
        XCTAssertEqual(out.status, 0, out.stderr)
        let result = try JSONSerialization.jsonObject(with: Data(out.stdout.utf8)) as? [String: Any]
        let recycled = result?["recycled"] as? Bool ?? false
        print(
            "pid recycling: connecting pid \(result?["pid"] ?? "?") \(recycled ? "was handed to the registered app before the daemon looked" : "could not be handed to the registered app; tested the exited-peer case only")"
        )
        let r = try response(result?["response"] as? String)
        XCTAssertEqual(r.status, .missingEntitlement, "a connection whose process is gone must not be served as anyone")
        // B's frame is refused before anything else: B is not the process that connected. (Without
        // SO_PEERPIDFD, when it arrives before the daemon pins the pid, it is refused for carrying no
        // pidfd of its writer.)
        let message = r.message ?? ""
        XCTAssertTrue(
            message.contains("not by pid \(result?["pid"] ?? "?"), the process that connected")
                || (d.noPeerPidfd && message.contains("did not carry a pidfd")),
            message)
        XCTAssertEqual(try d.connect().call("status").status, .success, "the daemon keeps serving")
    }
}

enum AppPaths {
    static func realPath(_ path: String) -> String? {
        guard let p = realpath(path, nil) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }
}

/// A child process with line-oriented stdin/stdout (reads time out instead of hanging the suite).
final class ScriptProcess {
    let process = Process()
    private let input = Pipe(), output = Pipe()
    private var buffer: [UInt8] = []

    init(_ executable: String, _ arguments: [String]) throws {
        signal(SIGPIPE, SIG_IGN)  // a child that died must fail the test, not kill the runner
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
    }

    func writeLine(_ line: String) {
        try? input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8))
    }

    func readLine(timeout: Int32 = Int32(DaemonHarness.eventTimeout * 1000)) -> String? {
        let fd = output.fileHandleForReading.fileDescriptor
        while true {
            if let nl = buffer.firstIndex(of: 10) {
                let line = String(decoding: buffer[..<nl], as: UTF8.self)
                buffer.removeSubrange(...nl)
                return line
            }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, timeout) == 1 else { return nil }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = read(fd, &chunk, chunk.count)
            guard n > 0 else { return nil }
            buffer += chunk[0..<n]
        }
    }

    func stop() {
        try? input.fileHandleForWriting.close()
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}
