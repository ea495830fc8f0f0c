import Foundation
import KeychainClient
import KeychainCore
import KeychainWire
import XCTest

/// Regressions for what the code review found: each test fails on the code before its fix.
final class ReviewRegressionTests: XCTestCase {
    func testALongAutoLockSettingDoesNotCrashTheDaemon() throws {
        let d = try DaemonHarness(config: #"{"autoLockSeconds": 86400}"#)
        // The overflow was in the auto-lock thread's arithmetic: wait until it has made a check.
        XCTAssertTrue(d.waitFor { d.log.contains("auto-lock checking afterSeconds=86400") }, d.log)
        XCTAssertEqual(try d.connect().call("status").status, .success, d.log)
        XCTAssertTrue(d.process?.isRunning ?? false)
    }

    func testKeychainctlAddUpdateExistingChangesOnlyTheItemItCollidedWith() throws {
        let d = try DaemonHarness(apps: DaemonHarness.defaultApps + [KeychainctlTests.cliAdmin])
        let app = try d.connect()
        let appItem: [String: Value] = [
            "class": .text("genp"), "svce": .text("svc"), "acct": .text("acct"),
            "agrp": .text("TEAM.shared"), "v_Data": .bytes(Array("app's".utf8)),
        ]
        XCTAssertEqual(try app.call("add", query: appItem).status, .success)
        let cli = DaemonHarness.cliPath
        XCTAssertEqual(try d.run(cli, ["add", "-s", "svc", "-a", "acct", "-w", "admin's"]).status, 0)
        XCTAssertEqual(try d.run(cli, ["add", "-s", "svc", "-a", "acct", "-w", "admin's v2", "-U"]).status, 0)
        let read = try app.call(
            "copy",
            query: [
                "class": .text("genp"), "svce": .text("svc"), "acct": .text("acct"),
                "agrp": .text("TEAM.shared"), "r_Data": .bool(true),
            ])
        XCTAssertEqual(read.result, .bytes(Array("app's".utf8)), "another group's item was overwritten")
        XCTAssertEqual(
            try d.run(cli, ["find", "-s", "svc", "-a", "acct", "-g", "keychainctl", "-w"]).stdout, "admin's v2\n")
    }

    func testAbsurdDatesAreRefusedSoClientsCanAlwaysFormatThem() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        let q: [String: Value] = ["class": .text("genp"), "svce": .text("dates"), "acct": .text("a")]
        var add = q
        add["v_Data"] = .bytes([1])
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        XCTAssertEqual(try c.call("update", query: q, attributes: ["cdat": .date(1e300)]).status, .param)
        XCTAssertEqual(try d.run(DaemonHarness.cliPath, ["list"]).status, 0)
    }

    func testEmptyAccessGroupIsRefused() throws {
        let d = try DaemonHarness(apps: [
            DaemonHarness.App(
                id: "TEAM.admin", groups: ["TEAM.admin"],
                executables: [DaemonHarness.runnerExecutable], admin: true)
        ])
        let r = try d.connect().call(
            "add",
            query: [
                "class": .text("genp"), "svce": .text("s"), "agrp": .text(""),
                "v_Data": .bytes([1]),
            ])
        XCTAssertEqual(r.status, .param)
    }

    func testALongPipelineOfLargeAnswersIsStreamedNotBuffered() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        let big = [UInt8](repeating: 0x5A, count: 200_000)
        XCTAssertEqual(
            try c.call(
                "add",
                query: [
                    "class": .text("genp"), "svce": .text("big"), "acct": .text("a"),
                    "v_Data": .bytes(big),
                ]
            ).status, .success)
        let frame = Frame.encode(
            Request(
                id: 1, op: "copy",
                query: [
                    "class": .text("genp"), "svce": .text("big"),
                    "acct": .text("a"), "r_Data": .bool(true),
                ]
            ).value)
        // 300 requests in one write: answers (60 MB) must flow while the daemon is still reading.
        let batch = Array([[UInt8]](repeating: frame, count: 300).joined())
        let socket = c.socket
        let writer = Thread { try? socket.writeAll(batch) }
        writer.start()
        var received = 0
        for _ in 0..<300 where (try? c.receive())?.result == .bytes(big) { received += 1 }
        XCTAssertEqual(received, 300)
    }

    func testASocketDirectoryOthersCanWriteToIsRefused() throws {
        let d = try DaemonHarness(start: false)
        let shared = d.root + "/shared"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        chmod(shared, 0o777)
        let args = ["--socket", shared + "/k.sock", "--data-dir", d.dataDirectory, "--config", d.configFile]
        let out = try d.run(DaemonHarness.daemonPath, args)
        XCTAssertEqual(out.status, 1)
        XCTAssertTrue(out.stderr.contains("writable by other users"), out.stderr)
    }

    /// A data directory others may write to, or another user's, lets them rename device.key and the
    /// database away (the keychain would start empty): refused at start, naming the fix.
    func testADataDirectoryOthersCanWriteToIsRefused() throws {
        let d = try DaemonHarness(start: false)
        let shared = d.root + "/shared-data"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        chmod(shared, 0o777)
        let args = ["--socket", d.socketPath, "--data-dir", shared, "--config", d.configFile]
        let out = try d.run(DaemonHarness.daemonPath, args)
        XCTAssertEqual(out.status, 1)
        XCTAssertTrue(out.stderr.contains("data directory \(shared) is writable by other users"), out.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: shared + "/device.key"), "nothing was written there")
        // Another user's directory (here: a throwaway uid's, with the daemon as root) is refused too.
        chmod(shared, 0o700)
        chown(shared, 61_999, 61_999)
        let other = try d.run(DaemonHarness.daemonPath, args)
        XCTAssertEqual(other.status, 1)
        XCTAssertTrue(other.stderr.contains("belongs to uid 61999"), other.stderr)
    }

    func testClientsRefuseASocketServedByAnotherUser() throws {
        guard getuid() == 0 else { return XCTFail("needs root to run a fake server as another uid") }
        let d = try DaemonHarness(start: false)
        chmod(d.root, 0o755)
        let dir = d.root + "/public"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        chmod(dir, 0o1777)
        let path = dir + "/impostor.sock"
        let script = """
            import socket, sys, os, time
            s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(8)
            s.settimeout(300)
            try:
                while True:
                    c, _ = s.accept(); time.sleep(0.2); c.close()
            except Exception:
                pass
            """
        let server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        server.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script, path]
        try server.run()
        defer {
            server.terminate()
            server.waitUntilExit()
        }
        XCTAssertTrue(
            d.waitFor { FileManager.default.fileExists(atPath: path) }, "the impostor server never bound \(path)")
        let out = try d.run(
            DaemonHarness.cliPath, ["unlock", "--passphrase-file", "/dev/null"], environment: ["KEYCHAIND_SOCKET": path]
        )
        XCTAssertNotEqual(out.status, 0)
        XCTAssertTrue(out.stderr.contains("refusing"), out.stderr)
    }

    func testABackupThatNoRestoreCouldCarryIsRefusedWithTheRemedy() throws {
        let d = try DaemonHarness(
            apps: DaemonHarness.defaultApps + [KeychainctlTests.cliAdmin],
            config: #"{"maxFrameBytes": 4096, "kdfProfile": "interactive"}"#)
        let c = try d.connect()
        for i in 0..<4 {
            XCTAssertEqual(
                try c.call(
                    "add",
                    query: [
                        "class": .text("genp"), "svce": .text("bulk"), "acct": .text("a\(i)"),
                        "v_Data": .bytes([UInt8](repeating: 1, count: 2000)),
                    ]
                ).status, .success)
        }
        let pass = d.root + "/backup-pass"
        try "backup passphrase\n".writeReplacing(pass)
        let out = try d.run(DaemonHarness.cliPath, ["backup", d.root + "/kc.backup", "--passphrase-file", pass])
        XCTAssertNotEqual(out.status, 0)
        XCTAssertTrue(out.stderr.contains("maxFrameBytes"), out.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: d.root + "/kc.backup"), "no useless backup file is left")
    }
}

extension ReviewRegressionTests {
    func testARequestOverTheDaemonsFrameLimitGetsTheDaemonsReason() throws {
        let d = try DaemonHarness()
        let connection = KeychainConnection(socketPath: d.socketPath)
        let big: [String: Value] = [
            "class": .text("genp"), "svce": .text("big"), "acct": .text("a"),
            "v_Data": .bytes([UInt8](repeating: 1, count: 2 << 20)),
        ]
        XCTAssertThrowsError(try connection.call(.add, query: big)) { error in
            let e = error as? KeychainError
            XCTAssertEqual(e?.status, .param)
            XCTAssertTrue(e?.message.contains("exceeds the limit") ?? false, e?.message ?? "")
        }
        XCTAssertNoThrow(try connection.call(.status), "the connection is re-opened for the next call")
    }
}

extension ReviewRegressionTests {
    func testStatusCountsOnlyTheItemsTheCallerCanSee() throws {
        let d = try DaemonHarness(apps: DaemonHarness.defaultApps + [KeychainctlTests.cliAdmin])
        let app = try d.connect()
        for account in ["a", "b"] {
            XCTAssertEqual(
                try app.call(
                    "add",
                    query: [
                        "class": .text("genp"), "svce": .text("count"), "acct": .text(account),
                        "v_Data": .bytes([1]),
                    ]
                ).status, .success)
        }
        XCTAssertEqual(try d.run(DaemonHarness.cliPath, ["add", "-s", "admin-only", "-a", "x", "-w", "y"]).status, 0)
        XCTAssertEqual(try app.call("status").result?.map?["items"]?.int, 2, "an app sees the count of its own groups")
        let admin = try d.run(DaemonHarness.cliPath, ["--json", "status"])
        XCTAssertTrue(admin.stdout.contains("\"items\":3"), admin.stdout)
    }
}
