import Foundation
import KeychainCore
import KeychainSystem
import KeychainWire
import XCTest

/// Start, stop, crash, activation, configuration and identity of the real daemon process.
final class DaemonLifecycleTests: XCTestCase {
    func add(_ c: RawClient, _ service: String, _ account: String, id: Int64) -> Request {
        Request(
            id: id, op: "add",
            query: [
                "class": .text("genp"), "svce": .text(service), "acct": .text(account),
                "v_Data": .bytes(Array(account.utf8)),
            ])
    }

    func countItems(_ d: DaemonHarness, service: String) throws -> Int {
        let c = try d.connect()
        let r = try c.call(
            "copy",
            query: [
                "class": .text("genp"), "svce": .text(service),
                "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            ])
        if r.status == .itemNotFound { return 0 }
        XCTAssertEqual(r.status, .success, r.message ?? "")
        return r.result?.array?.count ?? 0
    }

    func testSIGTERMFinishesInFlightRequestsAndExitsZero() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var batch: [UInt8] = []
        for i in 0..<300 { batch += Frame.encode(add(c, "com.example.term", "u\(i)", id: Int64(i)).value) }
        try c.sendRaw(batch)
        // Stop once the daemon is serving the batch (its first answer is here), however long that took.
        let first = try c.receive()
        kill(d.process!.processIdentifier, SIGTERM)
        var acknowledged = first.status == .success ? 1 : 0
        while let r = try? c.receive() {
            if r.status == .success { acknowledged += 1 }
        }
        XCTAssertGreaterThan(acknowledged, 0, "requests already being served were answered")
        XCTAssertEqual(d.stop(), 0, d.log)
        XCTAssertFalse(FileManager.default.fileExists(atPath: d.socketPath), "socket removed at exit")
        try d.start()
        XCTAssertEqual(
            try countItems(d, service: "com.example.term"), acknowledged,
            "every acknowledged add survived, nothing else")
    }

    func testKill9MidWriteLosesNoAcknowledgedItem() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var batch: [UInt8] = []
        for i in 0..<2000 { batch += Frame.encode(add(c, "com.example.crash", "u\(i)", id: Int64(i)).value) }
        try c.sendRaw(batch)
        var acknowledged: [Int64] = []
        for _ in 0..<40 {
            if let r = try? c.receive(), r.status == .success { acknowledged.append(r.id) }
        }
        d.kill9()
        while let r = try? c.receive() { if r.status == .success { acknowledged.append(r.id) } }
        try d.start()
        let stored = try countItems(d, service: "com.example.crash")
        XCTAssertGreaterThanOrEqual(stored, acknowledged.count, "an acknowledged add was lost")
        let check = try d.connect()
        for id in acknowledged {
            let r = try check.call(
                "copy",
                query: [
                    "class": .text("genp"), "svce": .text("com.example.crash"),
                    "acct": .text("u\(id)"), "r_Data": .bool(true),
                ])
            XCTAssertEqual(r.result, .bytes(Array("u\(id)".utf8)))
        }
    }

    func testSocketAndDirectoryArePrivate() throws {
        let d = try DaemonHarness()
        var st = stat()
        XCTAssertEqual(lstat(d.socketPath, &st), 0)
        XCTAssertEqual(st.st_mode & 0o777, 0o600)
        XCTAssertEqual(stat((d.socketPath as NSString).deletingLastPathComponent, &st), 0)
        XCTAssertEqual(st.st_mode & 0o777, 0o700)
        for name in try FileManager.default.contentsOfDirectory(atPath: d.dataDirectory) {
            XCTAssertEqual(stat(d.dataDirectory + "/" + name, &st), 0)
            XCTAssertEqual(st.st_mode & 0o077, 0, "\(name) is readable by others")
        }
    }

    func testAStaleSocketIsReplacedButAnotherFileIsNot() throws {
        let d = try DaemonHarness()
        d.kill9()
        XCTAssertTrue(FileManager.default.fileExists(atPath: d.socketPath), "kill -9 leaves the socket behind")
        try d.start()
        XCTAssertEqual(try d.connect().call("status").status, .success)
        d.stop()
        try "not a socket".writeReplacing(d.socketPath)
        XCTAssertThrowsError(try d.start())
        XCTAssertTrue(d.log.contains("is not a socket"), d.log)
    }

    func testASecondDaemonOnTheSameSocketRefusesToStart() throws {
        let d = try DaemonHarness()
        let out = try d.run(DaemonHarness.daemonPath, d.arguments)
        XCTAssertNotEqual(out.status, 0)
        XCTAssertTrue(out.stderr.contains("already serving"), out.stderr)
        XCTAssertEqual(try d.connect().call("status").status, .success)
        // With a data directory of its own, it refuses before making a keychain there.
        let elsewhere = d.root + "/elsewhere"
        let other = try d.run(
            DaemonHarness.daemonPath,
            ["--socket", d.socketPath, "--data-dir", elsewhere, "--config", d.configFile])
        XCTAssertNotEqual(other.status, 0)
        XCTAssertTrue(other.stderr.contains("another keychaind is already serving \(d.socketPath)"), other.stderr)
        XCTAssertEqual((try? FileManager.default.contentsOfDirectory(atPath: elsewhere)) ?? [], [])
        XCTAssertEqual(try d.connect().call("status").status, .success)
    }

    /// Another socket, same data directory: the database lock refuses it (two daemons would each keep
    /// their own row-state sum and overwrite each other's record).
    func testASecondDaemonOnTheSameDataDirectoryRefusesToStartEvenOnAnotherSocket() throws {
        let d = try DaemonHarness()
        let other = d.root + "/other.sock"
        let out = try d.run(
            DaemonHarness.daemonPath, ["--socket", other, "--data-dir", d.dataDirectory, "--config", d.configFile])
        XCTAssertEqual(out.status, 1)
        XCTAssertTrue(out.stderr.contains("already serving the keychain"), out.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: other))
        XCTAssertEqual(try d.connect().call("status").status, .success)
    }

    /// The database is locked against other SQLite users while the daemon runs. Opening and closing
    /// the file anywhere else in the daemon would drop that lock: a registration file that is a link
    /// to the database is refused unopened, the apps are not reloaded, and the lock holds.
    func testALinkToTheDatabaseInAppsDIsRefusedAndTheLockHolds() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        XCTAssertEqual(
            try c.call("add", query: ["class": .text("genp"), "svce": .text("s"), "v_Data": .bytes([1])]).status,
            .success)
        let database = d.dataDirectory + "/keychain.db"
        try FileManager.default.createSymbolicLink(atPath: d.appsDirectory + "/db.json", withDestinationPath: database)
        d.reloadApps()
        XCTAssertTrue(d.log.contains("is the keychain database"), d.log)
        let sqlite = "/usr/bin/sqlite3"
        guard FileManager.default.isExecutableFile(atPath: sqlite) else {
            return XCTFail("sqlite3 CLI missing (scripts/deps installs it)")
        }
        let out = try d.run(sqlite, [database, "SELECT count(*) FROM items"])
        XCTAssertNotEqual(out.status, 0, out.stdout)
        XCTAssertTrue(out.stderr.contains("database is locked"), out.stderr)
        let copy = try c.call("copy", query: ["class": .text("genp"), "svce": .text("s"), "r_Data": .bool(true)])
        XCTAssertEqual(copy.result, .bytes([1]))
    }

    /// A FIFO in apps.d (any process of the user may put one there) would block the read of the
    /// registrations, and every reload after it: it is refused unread, and the daemon answers on.
    func testAFIFOInAppsDIsRefusedUnread() throws {
        let d = try DaemonHarness()
        XCTAssertEqual(mkfifo(d.appsDirectory + "/fifo.json", 0o600), 0)
        d.reloadApps()
        XCTAssertTrue(d.log.contains("is not a regular file"), d.log)
        XCTAssertEqual(try d.connect().call("status").status, .success)
        try FileManager.default.removeItem(atPath: d.appsDirectory + "/fifo.json")
        d.reloadApps()
        XCTAssertEqual(
            d.log.components(separatedBy: "apps reloaded why=SIGHUP").count, 2, "reloads again once it is gone")
    }

    /// A huge file in apps.d (any process of the user may put one there; an attack review's 6 GB file
    /// made the daemon allocate it whole and die) is refused by its size, unread, and the daemon
    /// answers on. One byte over the limit is refused too, though it is only blanks (which read as {}).
    func testAnOversizedFileInAppsDIsRefusedUnread() throws {
        let d = try DaemonHarness()
        func refusedForSize(_ name: String) -> Bool {
            d.log.split(separator: "\n").contains { $0.contains(name) && $0.contains("is larger than 64 KiB") }
        }
        // Made beside apps.d and renamed into it, so no reload sees it half made.
        let staging = d.appsDirectory + "/../huge.staging"
        try "".write(toFile: staging, atomically: false, encoding: .utf8)
        XCTAssertEqual(truncate(staging, 6 << 30), 0)
        XCTAssertEqual(rename(staging, d.appsDirectory + "/huge.json"), 0)
        d.reloadApps()
        XCTAssertTrue(refusedForSize("huge.json"), d.log)
        XCTAssertEqual(try d.connect().call("status").status, .success)
        try FileManager.default.removeItem(atPath: d.appsDirectory + "/huge.json")

        let blanks = d.appsDirectory + "/blanks.json"
        try String(repeating: " ", count: (64 << 10) + 1).writeReplacing(blanks)
        d.reloadApps()
        XCTAssertTrue(refusedForSize("blanks.json"), d.log)
        XCTAssertEqual(try d.connect().call("status").status, .success)
    }

    func testMalformedConfigurationIsReportedWithFileAndReason() throws {
        let d = try DaemonHarness(config: #"{"maxConections": 10}"#, start: false)
        let out = try d.run(DaemonHarness.daemonPath, d.arguments)
        XCTAssertEqual(out.status, 1)
        XCTAssertTrue(
            out.stderr.contains(d.configFile) && out.stderr.contains("unknown key \"maxConections\""), out.stderr)

        try "{ not json".writeReplacing(d.configFile)
        let bad = try d.run(DaemonHarness.daemonPath, d.arguments)
        XCTAssertEqual(bad.status, 1)
        XCTAssertTrue(bad.stderr.contains("is not valid JSON"), bad.stderr)

        try "".writeReplacing(d.configFile)
        try
            #"{"application-identifier": "A.x", "keychain-access-groups": ["A.x"], "executables": ["/bin/x"], "colour": 1}"#
            .writeReplacing(d.appsDirectory + "/bad.json")
        let app = try d.run(DaemonHarness.daemonPath, d.arguments)
        XCTAssertEqual(app.status, 1)
        XCTAssertTrue(app.stderr.contains("bad.json") && app.stderr.contains("colour"), app.stderr)
    }

    /// A relative --config is the file in the working directory, and apps.d is beside it (it was
    /// `/apps.d`: the directory part of "keychaind.json" is empty).
    func testARelativeConfigFindsAppsDBesideIt() throws {
        let d = try DaemonHarness(start: false)
        let configDirectory = (d.configFile as NSString).deletingLastPathComponent
        let out = try runToCompletion(
            DaemonHarness.daemonPath,
            ["--check-config", "--config", "keychaind.json", "--system-apps-dir", d.systemAppsDirectory],
            environment: ProcessInfo.processInfo.environment, currentDirectory: configDirectory)
        XCTAssertEqual(out.status, 0, out.stderr)
        XCTAssertTrue(out.stdout.contains("configuration ok: \(d.configFile)"), out.stdout)
        try d.register(
            DaemonHarness.App(id: "TEAM.mine", groups: ["TEAM.mine"], executables: ["/usr/bin/true"]), name: "mine",
            user: true)
        let again = try runToCompletion(
            DaemonHarness.daemonPath,
            ["--check-config", "--config", "keychaind.json", "--system-apps-dir", d.systemAppsDirectory],
            environment: ProcessInfo.processInfo.environment, currentDirectory: configDirectory)
        XCTAssertTrue(again.stdout.contains("app TEAM.mine") && again.stdout.contains(d.appsDirectory), again.stdout)
    }

    /// Two one-shot runs in one command line: refused, rather than doing the first and ignoring the second.
    func testCheckConfigAndAcceptDatabaseAreOneAtATime() throws {
        let d = try DaemonHarness(start: false)
        let out = try d.run(DaemonHarness.daemonPath, d.arguments + ["--check-config", "--accept-database"])
        XCTAssertNotEqual(out.status, 0)
        XCTAssertTrue(out.stderr.contains("give one of them"), out.stderr)
        XCTAssertEqual(out.stdout, "")
    }

    func testHelpListsEveryFlag() throws {
        let d = try DaemonHarness(start: false)
        let out = try d.run(DaemonHarness.daemonPath, ["--help"])
        XCTAssertEqual(out.status, 0)
        for flag in ["--socket", "--data-dir", "--config", "--log-level", "--version"] {
            XCTAssertTrue(out.stdout.contains(flag), flag)
        }
    }

    func testAnUnregisteredExecutableGetsMissingEntitlementSayingHowToRegister() throws {
        let d = try DaemonHarness(apps: [])
        let r = try d.connect().call("copy", query: ["class": .text("genp"), "svce": .text("x")])
        XCTAssertEqual(r.status, .missingEntitlement)
        XCTAssertTrue(r.message?.contains("apps.d") ?? false, r.message ?? "")
    }

    func testSIGHUPReloadsAppsWithoutDroppingConnections() throws {
        let d = try DaemonHarness(apps: [])
        let c = try d.connect()
        XCTAssertEqual(try c.call("copy", query: ["class": .text("genp")]).status, .missingEntitlement)
        try d.register(DaemonHarness.defaultApps[0], name: "late")
        d.reloadApps()
        XCTAssertEqual(
            try c.call("copy", query: ["class": .text("genp")]).status, .itemNotFound,
            "the same connection now acts as the registered app")
    }

    /// keychaind watches apps.d: a registration written there counts without a signal, also in an
    /// apps.d made after keychaind started, a change to it counts as changed, and a removed one stops
    /// counting — on a connection already open, as after SIGHUP.
    func testARegistrationWrittenIntoAppsDCountsWithoutASignal() throws {
        let d = try DaemonHarness(apps: [])
        let c = try d.connect()
        func copyStatus(_ group: String) throws -> Status {
            try c.call("copy", query: ["class": .text("genp"), "agrp": .text(group)]).status
        }
        XCTAssertEqual(try copyStatus("TEAM.tests"), .missingEntitlement)
        try FileManager.default.removeItem(atPath: d.appsDirectory)

        try FileManager.default.createDirectory(atPath: d.appsDirectory, withIntermediateDirectories: false)
        var app = DaemonHarness.defaultApps[0]
        try d.register(app, name: "late", user: true)
        XCTAssertTrue(try d.waitFor { try copyStatus("TEAM.tests") == .itemNotFound }, "never counted:\n\(d.log)")
        XCTAssertEqual(try copyStatus("TEAM.other"), .missingEntitlement)

        app.groups.append("TEAM.other")
        try d.register(app, name: "late", user: true)
        XCTAssertTrue(try d.waitFor { try copyStatus("TEAM.other") == .itemNotFound }, "the change never counted")

        try FileManager.default.removeItem(atPath: d.appsDirectory + "/late.json")
        XCTAssertTrue(
            try d.waitFor { try copyStatus("TEAM.tests") == .missingEntitlement }, "still counts once removed")
        XCTAssertFalse(d.log.contains("why=SIGHUP"), "no signal was needed")
        XCTAssertTrue(d.log.contains("apps reloaded why=apps.d changed"), d.log)
    }

    /// An app started right after its registration was written is identified on its first request,
    /// without waiting for anything: a connection from a program that is not registered makes the
    /// daemon take any change to apps.d first (the kernel queued it before the write returned).
    func testAnAppStartedRightAfterItsRegistrationWasWrittenIsIdentified() throws {
        let d = try DaemonHarness(apps: [])
        for round in 0..<20 {
            let app = DaemonHarness.App(
                id: "TEAM.round\(round)", groups: ["TEAM.round\(round)"], executables: [DaemonHarness.runnerExecutable])
            try d.register(app, name: "app", user: true)
            let status = try d.connect().call("status")
            XCTAssertEqual(status.result?.map?["caller"]?.text, "TEAM.round\(round)", "round \(round): \(status)")
        }
    }

    /// One executable, one app: a later registration naming an app's executable is refused, saying
    /// which registration owns it, and the app keeps its identity (it once lost it to the refusal).
    func testASecondRegistrationOfAnAppsExecutableLeavesTheAppItsIdentity() throws {
        let d = try DaemonHarness()
        let other = DaemonHarness.App(
            id: "TEAM.other", groups: ["TEAM.other"], executables: [DaemonHarness.runnerExecutable])
        try d.register(other, name: "other", user: true)
        let status = try d.connect().call("status")
        XCTAssertEqual(status.result?.map?["caller"]?.text, "TEAM.tests", "\(status)")
        let registrations = status.result?.map?["isolation"]?.map?["registrations"]?.array ?? []
        let refusal = registrations.compactMap(\.map).first { $0["application-identifier"]?.text == "TEAM.other" }
        let reason = refusal?["refused"]?.map?.values.first?.text ?? ""
        XCTAssertTrue(reason.contains("is already registered by") && reason.contains("app0.json"), "\(status)")
        XCTAssertEqual(
            try d.connect().call("copy", query: ["class": .text("genp"), "agrp": .text("TEAM.other")]).status,
            .missingEntitlement)
    }

    /// A registration file that is not valid JSON yet (a writer part-way through, or a mistake) is
    /// refused when apps.d changes as on SIGHUP: the registrations before it stay.
    func testAMalformedFileWrittenIntoAppsDKeepsThePreviousRegistrations() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        XCTAssertEqual(try c.call("copy", query: ["class": .text("genp")]).status, .itemNotFound)
        try #"{"application-identifier": "TEAM.x""#.writeReplacing(d.appsDirectory + "/broken.json")
        XCTAssertTrue(
            d.waitFor { d.log.contains("apps not reloaded; keeping the previous ones why=apps.d changed") }, d.log)
        XCTAssertEqual(try c.call("copy", query: ["class": .text("genp")]).status, .itemNotFound)

        // Its name is logged, control characters escaped: a name cannot start a log line of its own
        // (any process of the user may name a file so, and the watcher logs without a signal).
        try FileManager.default.removeItem(atPath: d.appsDirectory + "/broken.json")
        try "{".writeReplacing(d.appsDirectory + "/x\n<2>forged line.json")
        XCTAssertTrue(d.waitFor { d.log.contains("forged line.json") }, d.log)
        XCTAssertTrue(d.log.contains("x\\n<2>forged line.json"), d.log)
        XCTAssertFalse(d.log.split(separator: "\n").contains { $0.hasPrefix("<2>forged") }, d.log)
    }

    func testAnotherUIDIsRefused() throws {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
            FileManager.default.isExecutableFile(atPath: "/usr/bin/python3")
        else {
            XCTFail(
                "needs root, setpriv and /usr/bin/python3 to run a client as another uid (scripts/test installs them)")
            return
        }
        let d = try DaemonHarness()
        // Open the way for uid 65534 (the daemon's own socket is 0600, which alone would refuse it).
        chmod(d.root, 0o755)
        chmod((d.socketPath as NSString).deletingLastPathComponent, 0o755)
        chmod(d.socketPath, 0o666)
        let frame = Frame.encode(Request(id: 1, op: "status").value).map { String(format: "%02x", $0) }.joined()
        let script = """
            import socket, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            try: s.sendall(bytes.fromhex(sys.argv[2]))
            except BrokenPipeError: pass  # the daemon may refuse and close before we finish sending
            data = b''
            while True:
                chunk = s.recv(4096)
                if not chunk: break
                data += chunk
            print(data.hex())
            """
        let out = try d.run(
            "/usr/bin/setpriv",
            ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script, d.socketPath, frame])
        XCTAssertEqual(out.status, 0, out.stderr)
        var bytes: [UInt8] = []
        var hex = Substring(out.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        while hex.count >= 2 {
            bytes.append(UInt8(hex.prefix(2), radix: 16)!)
            hex = hex.dropFirst(2)
        }
        guard bytes.count > 4 else { return XCTFail("no response frame from the daemon") }
        let response = try Response(CBOR.decode(Array(bytes[4...])))
        XCTAssertEqual(response.status, .missingEntitlement)
        XCTAssertTrue(response.message?.contains("uid") ?? false)
    }

    func testSocketActivationThroughSystemdSocketActivate() throws {
        let tool = "/usr/bin/systemd-socket-activate"
        guard FileManager.default.isExecutableFile(atPath: tool) else {
            XCTFail("systemd-socket-activate is not installed (Debian package systemd; scripts/test installs it)")
            return
        }
        let d = try DaemonHarness(start: false)
        try FileManager.default.createDirectory(
            atPath: (d.socketPath as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let notify = try NotifyListener(path: d.root + "/notify.sock")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: tool)
        p.arguments = [
            "-l", d.socketPath, "-E", "NOTIFY_SOCKET=\(notify.path)", DaemonHarness.daemonPath,
            "--data-dir", d.dataDirectory, "--config", d.configFile,
        ]
        p.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try p.run()
        defer {
            if p.isRunning {
                kill(p.processIdentifier, SIGKILL)
                p.waitUntilExit()
            }
        }
        var client: RawClient?
        _ = d.waitFor {
            client = try? d.connect()
            return client != nil
        }
        let c = try XCTUnwrap(client, "systemd-socket-activate never listened on \(d.socketPath)")
        // systemd-socket-activate's socket lacks SO_PASSCRED (systemd's PassCredentials=yes, which
        // our unit sets): the connection that started the daemon carries no sender credentials, so it
        // is refused once, saying why; the next connection is served.
        try c.send(Request(id: 1, op: "status"))
        let first = try c.receive()
        XCTAssertEqual(first.status, .missingEntitlement)
        XCTAssertTrue(first.message?.contains("PassCredentials=yes") ?? false, first.message ?? "")
        XCTAssertTrue(c.isClosed())
        XCTAssertEqual(try d.connect().call("status").status, .success)
        XCTAssertTrue(notify.waitFor("READY=1"), "READY=1 sent once serving")
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        XCTAssertEqual(p.terminationStatus, 0)
        XCTAssertTrue(notify.waitFor("STOPPING=1"))
    }
}

extension DaemonLifecycleTests {
    /// systemd with PassCredentials=yes (our keychaind.socket): the listening socket has SO_PASSCRED
    /// before anyone connects, so the request that triggers activation — written before keychaind
    /// even runs — carries its writer's pid and is answered.
    func testActivationWithPassCredentialsServesTheFirstRequest() throws {
        let d = try DaemonHarness(start: false)
        try FileManager.default.createDirectory(
            atPath: (d.socketPath as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let frame = Frame.encode(Request(id: 7, op: "status").value).map { String(format: "%02x", $0) }.joined()
        let script = """
            import os, socket, sys
            path, frame, daemon = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3:]
            l = socket.socket(socket.AF_UNIX); l.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            l.bind(path); os.chmod(path, 0o600); l.listen(16)
            c = socket.socket(socket.AF_UNIX); c.connect(path); c.sendall(frame)   # before keychaind runs
            pid = os.fork()
            if pid == 0:
                os.dup2(l.fileno(), 3)
                os.set_inheritable(3, True)
                os.environ['LISTEN_PID'] = str(os.getpid()); os.environ['LISTEN_FDS'] = '1'
                os.execv(daemon[0], daemon)
            data = b''
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], 'big'):
                chunk = c.recv(65536)
                if not chunk: break
                data += chunk
            print(data[4:].hex(), flush=True)
            os.kill(pid, 15); os.waitpid(pid, 0)
            """
        let out = try d.run(
            "/usr/bin/python3", ["-c", script, d.socketPath, frame, DaemonHarness.daemonPath] + d.arguments)
        XCTAssertEqual(out.status, 0, out.stderr)
        let hex = out.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        var bytes: [UInt8] = []
        var rest = Substring(hex)
        while rest.count >= 2 {
            bytes.append(UInt8(rest.prefix(2), radix: 16)!)
            rest = rest.dropFirst(2)
        }
        let r = try Response(CBOR.decode(bytes))
        XCTAssertEqual(r.id, 7)
        XCTAssertEqual(r.status, .success, r.message ?? "")
    }
}

/// A datagram socket standing in for systemd's notify socket.
final class NotifyListener {
    let path: String
    let fd: Int32
    private var received = ""

    init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        let bound = Socket(adopting: dup(fd))
        defer { bound.close() }
        do { try bound.bind(to: try SocketAddress(path: path)) } catch { throw HarnessError("bind notify socket") }
        var tv = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit {
        close(fd)
        unlink(path)
    }

    func waitFor(_ text: String, timeout: TimeInterval = DaemonHarness.eventTimeout) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !received.contains(text) && Date() < deadline {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n > 0 { received += String(decoding: buffer[0..<n], as: UTF8.self) + "\n" }
        }
        return received.contains(text)
    }
}
