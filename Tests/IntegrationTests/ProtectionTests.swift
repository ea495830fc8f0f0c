import Foundation
import KeychainCore
import KeychainSystem
import KeychainWire
import XCTest

/// Passphrase, lock states, auto-lock, wrong-passphrase delays, crash safety of a passphrase change,
/// headless unlock through a systemd credential, and backup/restore — against the real daemon, with
/// raw frames. The test runner is registered as an admin app; Argon2id runs with the documented
/// `interactive` profile so a test costs milliseconds per unlock, not a second.
final class ProtectionTests: XCTestCase {
    static let admin = DaemonHarness.App(
        id: "TEAM.admin", groups: ["TEAM.tests", "TEAM.shared"],
        executables: [DaemonHarness.runnerExecutable], admin: true)
    static let classes = ["ak", "ck", "dk", "aku", "cku", "dku", "akpu"]

    func harness(_ config: [String: Any] = [:], start: Bool = true) throws -> DaemonHarness {
        var c = config
        c["kdfProfile"] = c["kdfProfile"] ?? "interactive"
        let json = String(decoding: try JSONSerialization.data(withJSONObject: c), as: UTF8.self)
        return try DaemonHarness(apps: [Self.admin], config: json, start: start)
    }

    func bytes(_ s: String) -> Value { .bytes(Array(s.utf8)) }

    func item(_ service: String, _ account: String, _ extra: [String: Value] = [:]) -> [String: Value] {
        var q: [String: Value] = ["class": .text("genp"), "svce": .text(service), "acct": .text(account)]
        for (k, v) in extra { q[k] = v }
        return q
    }

    @discardableResult
    func add(
        _ c: RawClient, _ service: String, _ account: String, secret: String, pdmn: String,
        file: StaticString = #filePath, line: UInt = #line
    ) throws -> Response {
        let r = try c.call("add", query: item(service, account, ["v_Data": bytes(secret), "pdmn": .text(pdmn)]))
        XCTAssertEqual(r.status, .success, r.message ?? "", file: file, line: line)
        return r
    }

    func read(_ c: RawClient, _ service: String, _ account: String) throws -> Response {
        try c.call("copy", query: item(service, account, ["r_Data": .bool(true)]))
    }

    func status(_ c: RawClient) throws -> [String: Value] {
        let r = try c.call("status")
        XCTAssertEqual(r.status, .success)
        return r.result?.map ?? [:]
    }

    func available(_ c: RawClient) throws -> Set<String> {
        Set((try status(c)["classes"]?.map ?? [:]).filter { $0.value == .bool(true) }.keys)
    }

    func passwd(_ c: RawClient, old: String?, new: String) throws -> Response {
        var args: [String: Value] = ["new": bytes(new)]
        if let old { args["old"] = bytes(old) }
        return try c.call("passwd", arguments: args)
    }

    func unlock(_ c: RawClient, _ passphrase: String) throws -> Response {
        try c.call("unlock", arguments: ["passphrase": bytes(passphrase)])
    }

    /// Which of the classes' items (account = class code, secret = "secret-" + code) read back.
    func readable(_ c: RawClient, service: String, file: StaticString = #filePath, line: UInt = #line) throws -> Set<
        String
    > {
        var out: Set<String> = []
        for code in Self.classes {
            let r = try read(c, service, code)
            switch r.status {
            case .success:
                XCTAssertEqual(r.result, bytes("secret-" + code), file: file, line: line)
                out.insert(code)
            case .interactionNotAllowed: break
            default: XCTFail("\(code): unexpected \(r.status) \(r.message ?? "")", file: file, line: line)
            }
        }
        return out
    }

    // MARK: Classes × lock states

    func testEachClassInEachLockState() throws {
        let d = try harness()
        var c = try d.connect()
        // No passphrase: the keychain is unlocked for good; akpu cannot be used at all.
        var s = try status(c)
        XCTAssertEqual(s["locked"], .bool(false))
        XCTAssertEqual(s["passphraseSet"], .bool(false))
        XCTAssertEqual(try available(c), ["ak", "ck", "dk", "aku", "cku", "dku"])
        for code in Self.classes where code != "akpu" {
            try add(c, "com.example.states", code, secret: "secret-" + code, pdmn: code)
        }
        let akpu = try c.call(
            "add", query: item("com.example.states", "akpu", ["v_Data": bytes("secret-akpu"), "pdmn": .text("akpu")]))
        XCTAssertEqual(akpu.status, .authFailed, "akpu without a passphrase")
        XCTAssertEqual(try c.call("lock").status, .param, "nothing to lock without a passphrase")

        // Setting a passphrase: still unlocked; akpu now works.
        XCTAssertEqual(try passwd(c, old: nil, new: "state passphrase").status, .success)
        s = try status(c)
        XCTAssertEqual(s["passphraseSet"], .bool(true))
        XCTAssertEqual(s["locked"], .bool(false))
        try add(c, "com.example.states", "akpu", secret: "secret-akpu", pdmn: "akpu")
        XCTAssertEqual(try readable(c, service: "com.example.states"), Set(Self.classes))
        XCTAssertEqual(try available(c), Set(Self.classes))

        // Locked after unlock: WhenUnlocked classes gone, AfterFirstUnlock and Always stay.
        XCTAssertEqual(try c.call("lock").status, .success)
        XCTAssertEqual(try status(c)["locked"], .bool(true))
        XCTAssertEqual(try readable(c, service: "com.example.states"), ["ck", "cku", "dk", "dku"])
        XCTAssertEqual(try available(c), ["ck", "cku", "dk", "dku"])
        for code in ["ak", "aku", "akpu"] {
            let r = try c.call(
                "add", query: item("com.example.new", code, ["v_Data": bytes("x"), "pdmn": .text(code)]))
            XCTAssertEqual(r.status, .interactionNotAllowed, "add into locked \(code)")
            XCTAssertEqual(
                try c.call("update", query: item("com.example.states", code), attributes: ["labl": .text("x")]).status,
                .interactionNotAllowed)
            XCTAssertEqual(try c.call("delete", query: item("com.example.states", code)).status, .interactionNotAllowed)
        }
        try add(c, "com.example.new", "ck", secret: "x", pdmn: "ck")
        // A locked row aborts a copy of everything, as on Apple's keychain; filtering by class avoids it.
        let all = try c.call(
            "copy",
            query: [
                "class": .text("genp"), "svce": .text("com.example.states"),
                "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            ])
        XCTAssertEqual(all.status, .interactionNotAllowed)
        let onlyDK = try c.call(
            "copy",
            query: [
                "class": .text("genp"), "svce": .text("com.example.states"), "pdmn": .text("dk"),
                "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            ])
        XCTAssertEqual(onlyDK.result?.array?.count, 1)

        // After a restart, before the first unlock: only the Always classes.
        XCTAssertEqual(d.stop(), 0)
        try d.start()
        c = try d.connect()
        XCTAssertEqual(try status(c)["locked"], .bool(true))
        XCTAssertEqual(try readable(c, service: "com.example.states"), ["dk", "dku"])
        XCTAssertEqual(try available(c), ["dk", "dku"])

        // Unlocked: everything. Locked again: AfterFirstUnlock survives.
        XCTAssertEqual(try unlock(c, "state passphrase").status, .success)
        XCTAssertEqual(try readable(c, service: "com.example.states"), Set(Self.classes))
        XCTAssertEqual(try c.call("lock").status, .success)
        XCTAssertEqual(try readable(c, service: "com.example.states"), ["ck", "cku", "dk", "dku"])
        XCTAssertFalse(d.log.contains("state passphrase"), "the passphrase never reaches the log")
    }

    func testRemovingThePassphraseDestroysAkpuItems() throws {
        let d = try harness()
        let c = try d.connect()
        XCTAssertEqual(try passwd(c, old: nil, new: "to be removed").status, .success)
        try add(c, "com.example.rm", "akpu", secret: "secret-akpu", pdmn: "akpu")
        try add(c, "com.example.rm", "ak", secret: "secret-ak", pdmn: "ak")
        XCTAssertEqual(
            try c.call("passwd", arguments: ["new": .bytes([])]).status, .authFailed, "old passphrase required")
        XCTAssertEqual(
            try c.call("passwd", arguments: ["old": bytes("to be removed"), "new": .bytes([])]).status, .success)
        let s = try status(c)
        XCTAssertEqual(s["passphraseSet"], .bool(false))
        XCTAssertEqual(s["locked"], .bool(false))
        XCTAssertEqual(try read(c, "com.example.rm", "akpu").status, .itemNotFound)
        XCTAssertEqual(try read(c, "com.example.rm", "ak").result, bytes("secret-ak"))
        XCTAssertTrue(d.log.contains("akpu items destroyed items=1"), d.log)
    }

    func testAdminOpsNeedAnAdminAndCheckTheirArguments() throws {
        let d = try DaemonHarness(config: #"{"kdfProfile": "interactive"}"#)  // runner registered without admin
        let c = try d.connect()
        for op in ["passwd", "backup", "restore", "approve", "revoke"] {
            XCTAssertEqual(try c.call(op).status, .missingEntitlement, op)
        }
        // lock and unlock are for any identified app: the passphrase is the proof (none is set here).
        XCTAssertEqual(try c.call("lock").status, .param, "nothing to lock without a passphrase")
        XCTAssertEqual(try c.call("unlock", arguments: ["passphrase": bytes("x")]).status, .success)
        let a = try harness()
        let admin = try a.connect()
        XCTAssertEqual(try admin.call("unlock").status, .param, "passphrase missing")
        XCTAssertEqual(try admin.call("unlock", arguments: ["passphrase": .text("text")]).status, .param)
        XCTAssertEqual(try admin.call("lock", arguments: ["extra": .int(1)]).status, .param)
        XCTAssertEqual(try admin.call("backup", arguments: ["passphrase": .bytes([])]).status, .param)
        XCTAssertEqual(try admin.call("restore", arguments: ["passphrase": bytes("x")]).status, .param, "data missing")
        XCTAssertEqual(
            try admin.call("unlock", arguments: ["passphrase": .bytes([UInt8](repeating: 65, count: 5000))]).status,
            .param)
    }

    // MARK: Auto-lock

    func testAutoLockAfterIdleSeconds() throws {
        let d = try harness(["autoLockSeconds": 1])
        let c = try d.connect()
        XCTAssertEqual(try passwd(c, old: nil, new: "auto").status, .success)
        try add(c, "com.example.auto", "ak", secret: "secret-ak", pdmn: "ak")
        try add(c, "com.example.auto", "ck", secret: "secret-ck", pdmn: "ck")
        try add(c, "com.example.auto", "dk", secret: "secret-dk", pdmn: "dk")
        func idle() throws -> Double {
            guard case .float(let seconds)? = try status(c)["idleSeconds"] else {
                XCTFail("status has no idleSeconds")
                return 0
            }
            return seconds
        }
        // Status polling does not count as activity: the idle clock keeps running through it…
        let before = try idle()
        usleep(300_000)
        XCTAssertGreaterThanOrEqual(try idle(), before + 0.29, "status requests reset the idle clock")
        // …an item request restarts it (a dk item: readable whether or not auto-lock struck meanwhile).
        let sent = Date()
        XCTAssertEqual(try read(c, "com.example.auto", "dk").result, bytes("secret-dk"))
        let afterRequest = try idle()
        XCTAssertLessThanOrEqual(
            afterRequest, Date().timeIntervalSince(sent) + 0.01,
            "the request restarted the idle clock")
        // Requests from a process that is not a registered app do not count either.
        let idleBefore = try idle()
        let probe = try d.run(
            "/usr/bin/python3",
            [
                "-c",
                """
                import socket, sys
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(bytes.fromhex(sys.argv[2]))
                print(len(s.recv(65536)))
                """, d.socketPath,
                Frame.encode(Request(id: 1, op: "copy", query: ["class": .text("genp")]).value)
                    .map { String(format: "%02x", $0) }.joined(),
            ])
        XCTAssertEqual(probe.status, 0, probe.stderr)
        XCTAssertGreaterThan(try idle(), idleBefore, "an unregistered peer's request restarted the idle clock")
        // With nothing but status requests it locks once a second has passed, however long that takes here.
        XCTAssertTrue(try d.waitFor { try status(c)["locked"] == .bool(true) }, d.log)
        XCTAssertGreaterThanOrEqual(try idle(), 1)
        XCTAssertEqual(try read(c, "com.example.auto", "ak").status, .interactionNotAllowed)
        XCTAssertEqual(try read(c, "com.example.auto", "ck").result, bytes("secret-ck"))
        XCTAssertTrue(d.log.contains("by=auto-lock"), d.log)
        XCTAssertEqual(try unlock(c, "auto").status, .success)
        XCTAssertEqual(try read(c, "com.example.auto", "ak").result, bytes("secret-ak"))
    }

    // MARK: Wrong passphrases

    /// The delay schedule and its arithmetic are unit-tested with a fake clock (PassphraseTests);
    /// here the real daemon: escalation, refusal while a delay runs, and persistence across kill -9.
    /// Nothing depends on how fast this machine is: waits are for the daemon's own `unlockDelay`.
    func testWrongPassphraseDelayEscalatesAndSurvivesARestart() throws {
        let d = try harness()
        var c = try d.connect()
        XCTAssertEqual(try passwd(c, old: nil, new: "the right one").status, .success)
        XCTAssertEqual(try c.call("lock").status, .success)
        func delay() throws -> Double {
            guard case .float(let seconds)? = try status(c)["unlockDelay"] else {
                XCTFail("status has no unlockDelay")
                return 0
            }
            return seconds
        }
        for n in 1...4 {
            let r = try unlock(c, "wrong \(n)")
            XCTAssertEqual(r.status, .authFailed)
            XCTAssertFalse(r.message?.contains("accepted in") ?? true, r.message ?? "")
        }
        let fifthSent = Date()
        let fifth = try unlock(c, "wrong 5")
        XCTAssertEqual(fifth.status, .authFailed)
        XCTAssertTrue(fifth.message?.contains("next attempt is accepted in 1 second") ?? false, fifth.message ?? "")
        // A probe right away: refused unchecked and uncounted while the 1 s delay runs. On a machine
        // slow enough that the second had passed, the probe is checked and is the sixth failure.
        let probe = try unlock(c, "wrong 6")
        let probeElapsed = Date().timeIntervalSince(fifthSent)
        XCTAssertEqual(probe.status, .authFailed)
        if probe.message?.contains("the passphrase was not checked") == true {
            XCTAssertTrue(probe.message?.contains("try again in 1 second") ?? false, probe.message ?? "")
            XCTAssertEqual(try status(c)["failedUnlocks"]?.int, 5, "a refused attempt is not counted")
            XCTAssertTrue(try d.waitFor { try delay() == 0 }, "the 1 s delay never ended")
            let sixth = try unlock(c, "wrong 6")
            XCTAssertTrue(sixth.message?.contains("accepted in 5 seconds") ?? false, sixth.message ?? "")
        } else {
            XCTAssertGreaterThanOrEqual(
                probeElapsed, 1, "checked although the delay was still running: \(probe.message ?? "")")
            XCTAssertTrue(probe.message?.contains("accepted in 5 seconds") ?? false, probe.message ?? "")
        }
        XCTAssertEqual(try status(c)["failedUnlocks"]?.int, 6)

        // The count and the moment of the last failure survive kill -9: the delay after the restart
        // is the one before it, less the time that passed in between (never more, never reset).
        let delayBefore = try delay()
        let measuredFrom = Date()
        d.kill9()
        try d.start()
        c = try d.connect()
        let s = try status(c)
        let passed = Date().timeIntervalSince(measuredFrom)
        XCTAssertEqual(s["failedUnlocks"]?.int, 6)
        guard case .float(let delayAfter)? = s["unlockDelay"] else { return XCTFail("status has no unlockDelay") }
        XCTAssertLessThanOrEqual(delayAfter, delayBefore + 0.05)
        XCTAssertGreaterThanOrEqual(delayAfter, max(0, delayBefore - passed) - 0.05)
        if delayAfter > 0.5 {
            let early = try unlock(c, "the right one")
            XCTAssertEqual(early.status, .authFailed, "the delay survives a restart")
            XCTAssertTrue(early.message?.contains("try again in") ?? false, early.message ?? "")
        }
        XCTAssertTrue(try d.waitFor { try delay() == 0 }, "the 5 s delay never ended")
        XCTAssertEqual(try unlock(c, "the right one").status, .success)
        XCTAssertEqual(try status(c)["failedUnlocks"]?.int, 0)
        XCTAssertFalse(d.log.contains("the right one") || d.log.contains("wrong 5"), "no passphrase in the log")
    }

    // MARK: Crash safety of a passphrase change

    /// kill -9 at any moment of a passphrase change leaves exactly one of the two passphrases in
    /// force and every item readable. The kill moments are spread over the measured duration of an
    /// uninterrupted change on this machine in this run (and a little past it), so a slow machine
    /// is probed across the whole change just as a fast one is.
    func testPassphraseChangeSurvivesKill9AtAnyMoment() throws {
        let d = try harness()
        var c = try d.connect()
        var current = "generation 0"
        XCTAssertEqual(try passwd(c, old: nil, new: current).status, .success)
        for code in Self.classes {
            try add(c, "com.example.crash", code, secret: "secret-" + code, pdmn: code)
        }
        // Filler items: every change re-wraps the item keys of the passphrase-protected classes in
        // its transaction, so with these the commit takes long enough for kills to land inside it.
        let filler = 400
        for i in 0..<filler {
            try c.send(
                Request(
                    id: Int64(1000 + i), op: "add",
                    query: item(
                        "com.example.filler", "f\(i)",
                        ["v_Data": bytes("filler \(i)"), "pdmn": .text(i % 2 == 0 ? "ak" : "cku")])))
        }
        for _ in 0..<filler { XCTAssertEqual(try c.receive().status, .success) }
        let total = Self.classes.count + filler
        XCTAssertEqual(try unlock(c, current).status, .success)
        // An uninterrupted change, waited for: the new passphrase takes effect, and how long it took.
        let started = Date()
        XCTAssertEqual(try passwd(c, old: current, new: "generation 0b").status, .success)
        let duration = Date().timeIntervalSince(started)
        current = "generation 0b"
        XCTAssertEqual(try readable(c, service: "com.example.crash"), Set(Self.classes))

        let rounds = 16
        var sawOld = 0
        var sawNew = 0
        for i in 1...rounds {
            let next = "generation \(i)"
            // From right after sending to 1.25 × the measured duration.
            let delay = duration * 1.25 * Double(i - 1) / Double(rounds - 1)
            try c.send(Request(id: 99, op: "passwd", arguments: ["old": bytes(current), "new": bytes(next)]))
            usleep(UInt32(delay * 1_000_000))
            d.kill9()
            try d.start()
            c = try d.connect()
            XCTAssertEqual(try status(c)["locked"], .bool(true))
            let withNew = try unlock(c, next)
            if withNew.status == .success {
                sawNew += 1
                XCTAssertEqual(
                    try unlock(c, current).status, .authFailed,
                    "the old passphrase still works beside the new one (round \(i))")
                current = next
            } else {
                XCTAssertEqual(withNew.status, .authFailed)
                XCTAssertEqual(
                    try unlock(c, current).status, .success, "neither the old nor the new passphrase works (round \(i))"
                )
                sawOld += 1
            }
            XCTAssertEqual(try readable(c, service: "com.example.crash"), Set(Self.classes), "round \(i)")
            XCTAssertEqual(try status(c)["items"]?.int, Int64(total), "round \(i)")
            let sample = try c.call(
                "copy", query: item("com.example.filler", "f\(i * 7 % filler)", ["r_Data": .bool(true)]))
            XCTAssertEqual(sample.result, bytes("filler \(i * 7 % filler)"), "round \(i): a re-wrapped item opens")
        }
        print(
            "kill -9 during passwd (uninterrupted change \(String(format: "%.3f", duration)) s): old passphrase in force \(sawOld) times, new \(sawNew) times"
        )
        XCTAssertEqual(sawOld + sawNew, rounds)
    }

    // MARK: systemd credential

    func testSystemdCredentialUnlocksAtStart() throws {
        let d = try harness()
        var c = try d.connect()
        XCTAssertEqual(try passwd(c, old: nil, new: "headless passphrase").status, .success)
        try add(c, "com.example.cred", "ak", secret: "secret-ak", pdmn: "ak")
        XCTAssertEqual(d.stop(), 0)

        let credentials = d.root + "/credentials"
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: true)
        let file = credentials + "/keychaind.passphrase"
        try "headless passphrase\n".writeReplacing(file)
        try FileManager.default.setAttributes([.posixPermissions: 0o400], ofItemAtPath: file)
        try d.start(extraEnvironment: ["CREDENTIALS_DIRECTORY": credentials])
        c = try d.connect()
        XCTAssertEqual(try status(c)["locked"], .bool(false))
        XCTAssertEqual(try read(c, "com.example.cred", "ak").result, bytes("secret-ak"))
        XCTAssertTrue(d.log.contains("by=credential"), d.log)
        XCTAssertEqual(d.stop(), 0)

        // A wrong credential leaves it locked, counts as a failure, and says so in the log.
        try FileManager.default.removeItem(atPath: file)
        try "not it\n".writeReplacing(file)
        try d.start(extraEnvironment: ["CREDENTIALS_DIRECTORY": credentials])
        c = try d.connect()
        let s = try status(c)
        XCTAssertEqual(s["locked"], .bool(true))
        XCTAssertEqual(s["failedUnlocks"]?.int, 1)
        XCTAssertTrue(d.log.contains("credential did not unlock"), d.log)
        XCTAssertFalse(d.log.contains("headless passphrase") || d.log.contains("not it"))

        // No credential directory entry: starts locked, quietly.
        XCTAssertEqual(d.stop(), 0)
        try FileManager.default.removeItem(atPath: file)
        try d.start(extraEnvironment: ["CREDENTIALS_DIRECTORY": credentials])
        XCTAssertEqual(try status(try d.connect())["locked"], .bool(true))
    }

    // MARK: Backup and restore

    func testBackupRestoresOnASecondDataDirectoryWithoutThisDeviceOnlyItems() throws {
        let source = try harness()
        let c = try source.connect()
        XCTAssertEqual(try passwd(c, old: nil, new: "keychain passphrase").status, .success)
        let marker = "Xylophone"
        for code in Self.classes {
            let q = item(
                "svc-\(marker)-\(code)", "acct-\(marker)",
                [
                    "v_Data": bytes("secret-\(marker)-\(code)"), "pdmn": .text(code),
                    "labl": .text("label-\(marker)"),
                ])
            XCTAssertEqual(try c.call("add", query: q).status, .success)
        }
        let originals = try c.call(
            "copy",
            query: [
                "class": .text("genp"), "m_Limit": .text("m_LimitAll"),
                "r_Attributes": .bool(true), "r_PersistentRef": .bool(true),
            ])
        XCTAssertEqual(originals.result?.array?.count, 7)

        // Locked: no backup.
        XCTAssertEqual(try c.call("lock").status, .success)
        XCTAssertEqual(
            try c.call(
                "backup",
                arguments: [
                    "passphrase": bytes("backup passphrase"),
                    "keychainPassphrase": bytes("keychain passphrase"),
                ]
            ).status, .interactionNotAllowed)
        XCTAssertEqual(try unlock(c, "keychain passphrase").status, .success)
        // An admin proves presence with the keychain passphrase while one is set.
        let unproven = try c.call("backup", arguments: ["passphrase": bytes("backup passphrase")])
        XCTAssertEqual(unproven.status, .authFailed)
        XCTAssertTrue(unproven.needsPassphrase, unproven.message ?? "")
        let made = try c.call(
            "backup",
            arguments: [
                "passphrase": bytes("backup passphrase"),
                "keychainPassphrase": bytes("keychain passphrase"),
            ])
        XCTAssertEqual(made.status, .success, made.message ?? "")
        let file = try XCTUnwrap(made.result?.bytes)
        XCTAssertEqual(Array(file.prefix(8)), Array("KCBACKUP".utf8))
        let blob = Data(file)
        for needle in [
            marker, "secret-", "svc-", "acct-", "label-", "TEAM.tests", "backup passphrase", "keychain passphrase",
        ] {
            XCTAssertNil(blob.range(of: Data(needle.utf8)), "\(needle) in plaintext in the backup")
        }
        XCTAssertFalse(source.log.contains("backup passphrase"))

        // A second data directory (another device: another device.key).
        let target = try harness()
        let t = try target.connect()
        // An item that already exists there: kept, the backup's copy skipped.
        XCTAssertEqual(
            try t.call(
                "add",
                query: item(
                    "svc-\(marker)-ck", "acct-\(marker)", ["v_Data": bytes("already here"), "pdmn": .text("ck")])
            ).status, .success)
        XCTAssertEqual(
            try t.call("restore", arguments: ["passphrase": bytes("wrong"), "data": .bytes(file)]).status, .authFailed)
        var damaged = file
        damaged[damaged.count / 2] ^= 1
        XCTAssertEqual(
            try t.call("restore", arguments: ["passphrase": bytes("backup passphrase"), "data": .bytes(damaged)])
                .status, .decode)
        XCTAssertEqual(
            try t.call(
                "restore",
                arguments: ["passphrase": bytes("backup passphrase"), "data": .bytes(Array(file.dropLast(3)))]
            ).status, .decode)
        let restored = try t.call(
            "restore", arguments: ["passphrase": bytes("backup passphrase"), "data": .bytes(file)])
        XCTAssertEqual(restored.status, .success, restored.message ?? "")
        XCTAssertEqual(restored.result?.map?["restored"]?.int, 2)
        XCTAssertEqual(restored.result?.map?["skipped"]?.int, 1)

        for code in ["aku", "cku", "dku", "akpu"] {
            XCTAssertEqual(
                try read(t, "svc-\(marker)-\(code)", "acct-\(marker)").status, .itemNotFound, "\(code) must not travel")
        }
        XCTAssertEqual(
            try read(t, "svc-\(marker)-ck", "acct-\(marker)").result, bytes("already here"), "existing item kept")
        let byRef = Dictionary(
            uniqueKeysWithValues: (originals.result?.array ?? []).compactMap { v -> (String, [String: Value])? in
                guard let m = v.map, let s = m["svce"]?.text else { return nil }
                return (s, m)
            })
        for code in ["ak", "dk"] {
            let service = "svc-\(marker)-\(code)"
            XCTAssertEqual(try read(t, service, "acct-\(marker)").result, bytes("secret-\(marker)-\(code)"))
            let got = try t.call(
                "copy",
                query: item(service, "acct-\(marker)", ["r_Attributes": .bool(true), "r_PersistentRef": .bool(true)]))
            let attributes = try XCTUnwrap(got.result?.map)
            let original = try XCTUnwrap(byRef[service])
            for key in ["cdat", "mdat", "labl", "pdmn", "agrp", "sync", "acct", "v_PersistentRef"] {
                XCTAssertEqual(attributes[key], original[key], "\(code) \(key)")
            }
        }
        // Restoring again changes nothing.
        let again = try t.call("restore", arguments: ["passphrase": bytes("backup passphrase"), "data": .bytes(file)])
        XCTAssertEqual(again.result?.map?["restored"]?.int, 0)
        XCTAssertEqual(again.result?.map?["skipped"]?.int, 3)
    }
}
