import Foundation
import XCTest

/// What a process of the user can do to sync through the sync folder (docs/sync.md, threat model),
/// run for real: three keychaind of one throwaway uid (devices A, B and M, each with a passphrase
/// set), one folder they all use, and the attacker a process of that same uid. M is a paired device
/// (or anyone who holds the sync key, as a lost device does until it is rotated out) that writes
/// files claiming to be B.
final class SyncAttackTests: XCTestCase {
    static let passphrase = "correct horse"
    var base = ""
    var folder = ""
    var uid: UInt32 = 0
    var sessions: [UserSession] = []

    override func setUpWithError() throws {
        uid = UserSession.newUID()
        base = NSTemporaryDirectory() + "keychaind-sync-attack-" + UUID().uuidString.prefix(8)
        folder = base + "/folder"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        chmod(base, 0o755)
        chown(folder, uid, uid)
        chmod(folder, 0o700)
    }

    override func tearDown() {
        for s in sessions { s.stop() }
        sessions = []
        try? FileManager.default.removeItem(atPath: base)
    }

    /// A device: keychaind of the shared uid on the shared folder, with app1 (a registered Python
    /// copy, group TEAM.app1) and an admin keychainctl, its passphrase set and unlocked.
    func device() throws -> (UserSession, app: String, pass: String) {
        let s = try UserSession(
            config: #"{"kdfProfile": "interactive", "syncFolder": "\#(folder)"}"#, uid: uid)
        sessions.append(s)
        let app = try s.makeApp("app1")
        try s.registerSystem(.init(id: "TEAM.app1", groups: ["TEAM.app1"], executables: [app]), name: "app1")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        let pass = try s.privateFile("pass", Self.passphrase + "\n")
        let set = try s.run(s.adminCLIPath, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        return (s, app, pass)
    }

    /// `joining` pairs with `existing` by the one-time code, as a user would.
    func pair(
        _ joining: (UserSession, app: String, pass: String), with existing: (UserSession, app: String, pass: String)
    )
        throws
    {
        let invite = try existing.0.run(
            existing.0.adminCLIPath, ["sync", "pair", "--json", "--keychain-passphrase-file", existing.pass])
        XCTAssertEqual(invite.status, 0, invite.stderr)
        let code = try XCTUnwrap(
            (try JSONSerialization.jsonObject(with: Data(invite.stdout.utf8)) as? [String: Any])?["code"] as? String)
        let join = try joining.0.run(
            joining.0.adminCLIPath, ["sync", "pair", code, "--keychain-passphrase-file", joining.pass])
        XCTAssertEqual(join.status, 0, "\(join.stdout)\n\(join.stderr)\n\(existing.0.log.suffix(2000))")
    }

    static let client = IsolationAttackTests.client

    /// The synchronizable item's secret as app1 reads it on `s` (nil when there is none).
    func secret(_ s: UserSession, _ app: String) throws -> String? {
        let r = try s.script(
            Self.client
                + "print(json.dumps(show(call('copy', query=kw.item('mail.example.com', 'alice', sync=True, r_Data=True)))))",
            interpreter: app)
        return (r["status"] as? Int) == 0 ? r["result"] as? String : nil
    }

    func write(_ s: UserSession, _ app: String, _ op: String, _ value: String) throws {
        let call =
            op == "add"
            ? "call('add', query=kw.item('mail.example.com', 'alice', sync=True, v_Data=b'\(value)'))"
            : "call('update', query=kw.item('mail.example.com', 'alice', sync=True), attributes={'v_Data': b'\(value)'})"
        let r = try s.script(Self.client + "print(json.dumps(show(\(call))))", interpreter: app)
        XCTAssertEqual(r["status"] as? Int, 0, "\(r)")
    }

    /// `keychainctl sync status --json` on `s`.
    func status(_ s: UserSession) throws -> [String: Any] {
        let r = try s.run(s.adminCLIPath, ["sync", "status", "--json"])
        XCTAssertEqual(r.status, 0, r.stderr)
        return (try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]) ?? [:]
    }

    func problems(_ s: UserSession) throws -> [String] { try status(s)["problems"] as? [String] ?? [] }

    func waitFor(_ what: String, timeout: TimeInterval = 60, _ condition: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while try !condition() {
            guard Date() < deadline else { throw HarnessError("timed out waiting for \(what)") }
            usleep(50_000)
        }
    }

    /// Forged, replayed, truncated and garbage files written into the folder by a process of the user
    /// change nothing on the devices, and each is reported in `sync status`; a file claiming to be B
    /// but signed by another device's key among them. Nothing in the folder holds the service, the
    /// account, the access group or a secret in the clear.
    func testFilesWrittenIntoTheFolderByAProcessOfTheUserChangeNothing() throws {
        let a = try device()
        let b = try device()
        try pair(b, with: a)
        try write(a.0, a.app, "add", "first secret")
        try waitFor("the item on B") { try secret(b.0, b.app) == "first secret" }
        let idB = try XCTUnwrap(status(b.0)["device"] as? String)
        let fileB = folder + "/" + idB + ".kcsync"

        // The attacker keeps a copy of B's file as it is now.
        let stash = try a.0.run(
            "/bin/cp", ["--preserve=mode", fileB, a.0.home + "/old-b.kcsync"])
        XCTAssertEqual(stash.status, 0, stash.stderr)
        try write(b.0, b.app, "update", "second secret")
        try waitFor("B's update on A") { try secret(a.0, a.app) == "second secret" }

        // M, paired like B, then made to write as B: its device id changed to B's in its data directory.
        let m = try device()
        try pair(m, with: a)
        try waitFor("the item on M") { try secret(m.0, m.app) == "second secret" }
        m.0.stop()
        let relabel = try m.0.script(
            "import json, sys\nopen(sys.argv[1], 'wb').write(bytes.fromhex(sys.argv[2]))\nprint(json.dumps({}))",
            [m.0.dataDirectory + "/sync/device-id", idB])
        XCTAssertNotNil(relabel)
        try m.0.start()
        XCTAssertEqual(try m.0.run(m.0.adminCLIPath, ["unlock", "--passphrase-file", m.pass]).status, 0)
        try write(m.0, m.app, "update", "forged by M")

        // The attacker's own files: a replay of B's old file, B's file cut short, garbage behind B's
        // header, noise.
        let attack = try a.0.script(
            """
            import json, os, sys
            folder, fileB, old = sys.argv[1], sys.argv[2], sys.argv[3]
            data = open(fileB, 'rb').read()
            open(os.path.join(folder, 'replay.kcsync'), 'wb').write(open(old, 'rb').read())
            open(os.path.join(folder, 'truncated.kcsync'), 'wb').write(data[:len(data) // 2])
            open(os.path.join(folder, 'garbage.kcsync'), 'wb').write(data[:37] + os.urandom(4000))
            open(os.path.join(folder, 'noise.kcsync'), 'wb').write(os.urandom(100))
            print(json.dumps({'ok': True}))
            """, [folder, fileB, a.0.home + "/old-b.kcsync"])
        XCTAssertEqual(attack["ok"] as? Bool, true)

        // A reads the folder: B's file is now M's forgery (or A took the forged version).
        let expected = ["replay.kcsync", "truncated.kcsync", "garbage.kcsync", "noise.kcsync", idB + ".kcsync"]
        try waitFor("A to read every file") {
            let p = try problems(a.0)
            return try secret(a.0, a.app) != "second secret"
                || expected.allSatisfy { n in p.contains { $0.hasPrefix(n) } }
        }
        XCTAssertEqual(try secret(a.0, a.app), "second secret", "A took a version from a file that is not B's")
        XCTAssertEqual(try secret(b.0, b.app), "second secret")
        let reported = try problems(a.0)
        for name in expected {
            XCTAssertTrue(reported.contains { $0.hasPrefix(name) }, "\(name) not reported: \(reported)")
        }
        XCTAssertTrue(
            reported.contains { $0.hasPrefix(idB + ".kcsync") && $0.contains("not signed by the key recorded") },
            "\(reported)")
        XCTAssertTrue(reported.contains { $0.hasPrefix("replay.kcsync") && $0.contains("older") }, "\(reported)")

        // Nothing in the folder in the clear.
        for name in try FileManager.default.contentsOfDirectory(atPath: folder) {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: folder + "/" + name))
            for needle in ["mail.example.com", "alice", "TEAM.app1", "first secret", "second secret", "forged by M"] {
                XCTAssertNil(bytes.range(of: Data(needle.utf8)), "\(needle) in the clear in \(name)")
            }
        }
    }
}
