import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// Two Syncthing instances on 127.0.0.1 (scripts/campaign/syncthing_pair.py: discovery, relays, NAT
/// traversal, usage reporting and upgrades off) keeping two folders in step, stopped by the test.
final class SyncthingPair {
    let root: String
    let folders: [String]
    let homes: [String]
    private var processes: [Process?] = [nil, nil]
    private let logs: [String]

    init(root: String) throws {
        self.root = root
        folders = [root + "/folder-a", root + "/folder-b"]
        for f in folders { try FileManager.default.createDirectory(atPath: f, withIntermediateDirectories: true) }
        let setup = try runToCompletion(
            "/usr/bin/python3",
            [DaemonHarness.campaignDirectory + "/syncthing_pair.py", root + "/syncthing", folders[0], folders[1]],
            environment: ProcessInfo.processInfo.environment, stdin: nil)
        guard setup.status == 0 else { throw HarnessError("syncthing setup failed: \(setup.stderr)") }
        homes = [root + "/syncthing/a", root + "/syncthing/b"]
        logs = [root + "/syncthing-a.log", root + "/syncthing-b.log"]
    }

    func start(_ i: Int) throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/syncthing")
        p.arguments = ["serve", "--home=" + homes[i], "--no-browser", "--no-restart", "--no-upgrade"]
        var env = ProcessInfo.processInfo.environment
        env["STNOUPGRADE"] = "1"
        env["STNORESTART"] = "1"
        p.environment = env
        if !FileManager.default.fileExists(atPath: logs[i]) {
            try "".write(toFile: logs[i], atomically: false, encoding: .utf8)
        }
        let log = FileHandle(forWritingAtPath: logs[i])!
        log.seekToEndOfFile()
        p.standardOutput = log
        p.standardError = log
        try p.run()
        processes[i] = p
    }

    /// SIGTERM to Syncthing's monitor process (it stops its child); SIGKILL to both after 10 s (a
    /// Syncthing stopped while it migrates its database at start may not exit).
    func stop(_ i: Int) {
        guard let p = processes[i] else { return }
        processes[i] = nil
        guard p.isRunning else { return }
        let children = childProcesses(of: p.processIdentifier)
        kill(p.processIdentifier, SIGTERM)
        let deadline = Date().addingTimeInterval(10)
        while p.isRunning && Date() < deadline { usleep(20_000) }
        if p.isRunning {
            for c in children { kill(c, SIGKILL) }
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        for c in children where kill(c, 0) == 0 { kill(c, SIGKILL) }
    }

    /// The processes whose parent is `pid` (/proc/*/stat).
    private func childProcesses(of pid: Int32) -> [Int32] {
        var out: [Int32] = []
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let child = Int32(name),
                let stat = try? String(contentsOfFile: "/proc/\(name)/stat", encoding: .utf8),
                let close = stat.range(of: ")", options: .backwards)
            else { continue }
            let fields = stat[close.upperBound...].split(separator: " ")
            if fields.count > 1, Int32(fields[1]) == pid { out.append(child) }
        }
        return out
    }

    func stopAll() {
        stop(0)
        stop(1)
    }

    deinit { stopAll() }

    var log: String { logs.map { (try? String(contentsOfFile: $0, encoding: .utf8)) ?? "" }.joined(separator: "\n") }
}

/// Sync end to end: two daemons with their own data directories, their folders kept in step by two
/// real Syncthing instances, paired with `keychainctl sync pair`.
final class SyncthingTests: XCTestCase {
    var root = ""
    var pair: SyncthingPair!
    var a: DaemonHarness!
    var b: DaemonHarness!

    override func setUpWithError() throws {
        root = NSTemporaryDirectory() + "keychaind-sync-" + UUID().uuidString.prefix(8)
        pair = try SyncthingPair(root: root)
        let apps = DaemonHarness.defaultApps + [KeychainctlTests.cliAdmin]
        a = try DaemonHarness(
            apps: apps, config: #"{"syncFolder": "\#(pair.folders[0])", "kdfProfile": "interactive"}"#)
        b = try DaemonHarness(
            apps: apps, config: #"{"syncFolder": "\#(pair.folders[1])", "kdfProfile": "interactive"}"#)
        try pair.start(0)
        try pair.start(1)
    }

    override func tearDown() {
        pair?.stopAll()
        a?.stop()
        b?.stop()
        pair = nil
        try? FileManager.default.removeItem(atPath: root)
    }

    func ctl(_ d: DaemonHarness, _ args: String...) throws -> ProgramResult {
        try d.run(DaemonHarness.cliPath, args)
    }

    func item(_ svce: String) -> [String: Value] {
        ["class": .text("genp"), "svce": .text(svce), "acct": .text("alice"), "sync": .bool(true)]
    }

    func add(_ d: DaemonHarness, _ svce: String, _ secret: String) throws {
        var q = item(svce)
        q["v_Data"] = .bytes(Array(secret.utf8))
        let r = try d.connect().call("add", query: q)
        XCTAssertEqual(r.status, .success, r.message ?? "")
    }

    func update(_ d: DaemonHarness, _ svce: String, _ secret: String) throws {
        let r = try d.connect().call("update", query: item(svce), attributes: ["v_Data": .bytes(Array(secret.utf8))])
        XCTAssertEqual(r.status, .success, r.message ?? "")
    }

    func delete(_ d: DaemonHarness, _ svce: String) throws {
        let r = try d.connect().call("delete", query: item(svce))
        XCTAssertEqual(r.status, .success, r.message ?? "")
    }

    /// Every synchronizable item the test app sees, service → secret.
    func items(_ d: DaemonHarness) throws -> [String: String] {
        let r = try d.connect().call(
            "copy",
            query: [
                "class": .text("genp"), "sync": .bool(true), "m_Limit": .text("m_LimitAll"),
                "r_Attributes": .bool(true), "r_Data": .bool(true),
            ])
        if r.status == .itemNotFound { return [:] }
        XCTAssertEqual(r.status, .success, r.message ?? "")
        var out: [String: String] = [:]
        for v in r.result?.array ?? [] {
            guard let m = v.map, let s = m["svce"]?.text, let data = m["v_Data"]?.plainBytes else { continue }
            out[s] = String(decoding: data, as: UTF8.self)
        }
        return out
    }

    /// Waits until both keychains hold the same synchronizable items, item by item, equal to `expected`.
    func waitForConvergence(_ expected: [String: String], _ what: String) throws {
        let converged = try a.waitFor(timeout: 90) {
            try items(a) == expected && items(b) == expected
        }
        if !converged {
            let (nowA, nowB) = (try items(a), try items(b))
            XCTFail(
                "\(what): not converged.\nA: \(nowA)\nB: \(nowB)\nexpected: \(expected)\nA log:\n\(a.log.suffix(3000))\nB log:\n\(b.log.suffix(3000))"
            )
        }
    }

    func testTwoDevicesConvergeThroughSyncthing() throws {
        // Pairing: a code shown on A, typed on B; the answer travels through the folder.
        let invite = try ctl(a, "sync", "pair", "--json")
        XCTAssertEqual(invite.status, 0, invite.stderr)
        let code = try XCTUnwrap(
            (try JSONSerialization.jsonObject(with: Data(invite.stdout.utf8)) as? [String: Any])?["code"] as? String)
        let join = try ctl(b, "sync", "pair", code)
        XCTAssertEqual(
            join.status, 0, "\(join.stderr)\nA:\n\(a.log.suffix(2000))\nsyncthing:\n\(pair.log.suffix(2000))")

        // Added on A, it appears on B; an update on B and a delete on A follow.
        try add(a, "mail.example.com", "first secret")
        try add(a, "local-only", "stays here")  // not synchronizable: below, added without sync
        try delete(a, "local-only")
        var local = item("local-only")
        local["sync"] = .bool(false)
        local["v_Data"] = .bytes(Array("stays here".utf8))
        XCTAssertEqual(try a.connect().call("add", query: local).status, .success)
        let added = Date()
        try waitForConvergence(["mail.example.com": "first secret"], "add")
        print("sync: an item added on A was readable on B after \(Int(Date().timeIntervalSince(added) * 1000)) ms")
        try update(b, "mail.example.com", "changed on B")
        try waitForConvergence(["mail.example.com": "changed on B"], "update")
        try add(b, "git.example.com", "token")
        try delete(a, "mail.example.com")
        try waitForConvergence(["git.example.com": "token"], "delete")

        // Concurrent edits of one item on both: both end with the same version.
        try update(a, "git.example.com", "edit on A")
        try update(b, "git.example.com", "edit on B")
        let together = try a.waitFor(timeout: 90) {
            let x = try items(a)
            return x == (try items(b)) && ["edit on A", "edit on B"].contains(x["git.example.com"] ?? "")
        }
        let (nowA, nowB) = (try items(a), try items(b))
        XCTAssertTrue(together, "concurrent edits did not converge: A \(nowA) B \(nowB)")
        let winner = try items(a)

        // B offline (its Syncthing stopped) while A changes several items; B catches up after.
        pair.stop(1)
        var expected = winner
        for i in 0..<5 {
            try add(a, "offline-\(i).example.com", "secret \(i)")
            expected["offline-\(i).example.com"] = "secret \(i)"
        }
        try update(a, "offline-1.example.com", "updated while B was away")
        expected["offline-1.example.com"] = "updated while B was away"
        try delete(a, "offline-2.example.com")
        expected["offline-2.example.com"] = nil
        XCTAssertTrue(try a.waitFor(timeout: 90) { try items(a) == expected })
        XCTAssertEqual(try items(b), winner, "B changed while its Syncthing was stopped")
        try pair.start(1)
        let back = Date()
        try waitForConvergence(expected, "after B came back")
        print("sync: B caught up \(Int(Date().timeIntervalSince(back) * 1000)) ms after its Syncthing restarted")

        // The device UUID (a ThisDeviceOnly item) differs; the local item stayed on A.
        let idA = try ctl(a, "device-id")
        let idB = try ctl(b, "device-id")
        XCTAssertEqual(idA.status, 0, idA.stderr)
        XCTAssertNotEqual(idA.stdout, idB.stdout)
        var localQuery = item("local-only")
        localQuery["sync"] = .bool(false)
        XCTAssertEqual(try b.connect().call("copy", query: localQuery).status, .itemNotFound)
        XCTAssertEqual(try a.connect().call("copy", query: localQuery).status, .success)

        // Status on each: two devices, no problems.
        let status = try ctl(b, "sync", "status", "--json")
        XCTAssertEqual(status.status, 0, status.stderr)
        let s = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        XCTAssertEqual((s["devices"] as? [Any])?.count, 2, status.stdout)
        XCTAssertEqual((s["problems"] as? [Any])?.count, 0, status.stdout)

        // Nothing in either folder holds a service, account or secret in the clear.
        for folder in pair.folders {
            for name in try FileManager.default.contentsOfDirectory(atPath: folder) where !name.hasPrefix(".st") {
                guard let data = FileManager.default.contents(atPath: folder + "/" + name) else { continue }
                for needle in ["example.com", "alice", "secret", "token", "edit on", "TEAM.tests"] {
                    XCTAssertNil(data.range(of: Data(needle.utf8)), "\(needle) in the clear in \(name)")
                }
            }
        }
    }
}

/// Who may pair a device (and so hand out the key to every synchronizable item), without Syncthing.
final class SyncAccessTests: XCTestCase {
    /// An app that is not an admin gets −34018 for every sync action; an admin needs the keychain
    /// passphrase while one is set (−25293 without it); with it, pairing starts. A synchronizable
    /// item of a ThisDeviceOnly class is refused over the wire with −50.
    func testPairingNeedsAnAdminAndThePassphrase() throws {
        let folder = NSTemporaryDirectory() + "keychaind-syncfolder-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let d = try DaemonHarness(
            apps: DaemonHarness.defaultApps + [KeychainctlTests.cliAdmin],
            config: #"{"syncFolder": "\#(folder)", "kdfProfile": "interactive"}"#)
        defer { d.stop() }
        for action in ["invite", "rotate", "leave", "status"] {
            let r = try d.connect().call("sync", arguments: ["action": .text(action)])
            XCTAssertEqual(r.status, .missingEntitlement, action)
        }
        let pass = d.root + "/pass"
        try "sync passphrase\n".writeReplacing(pass)
        XCTAssertEqual(try d.run(DaemonHarness.cliPath, ["passwd", "--new-passphrase-file", pass]).status, 0)
        XCTAssertEqual(try d.run(DaemonHarness.cliPath, ["unlock", "--passphrase-file", pass]).status, 0)
        let without = try d.run(DaemonHarness.cliPath, ["sync", "pair"])
        XCTAssertEqual(without.status, exitCode(.authFailed), without.stderr)
        XCTAssertTrue(try d.run(DaemonHarness.cliPath, ["sync", "status"]).stdout.contains("paired"))
        let with = try d.run(DaemonHarness.cliPath, ["sync", "pair", "--keychain-passphrase-file", pass])
        XCTAssertEqual(with.status, 0, with.stderr)
        XCTAssertTrue(with.stdout.contains("pairing code: "), with.stdout)

        let r = try d.connect().call(
            "add",
            query: [
                "class": .text("genp"), "svce": .text("s"), "acct": .text("a"), "sync": .bool(true),
                "pdmn": .text("cku"), "v_Data": .bytes([1]),
            ])
        XCTAssertEqual(r.status, .param, r.message ?? "")
    }

    func exitCode(_ s: Status) -> Int32 { Int32(UInt8(truncatingIfNeeded: s.rawValue)) }
}
