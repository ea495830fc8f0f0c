import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// Setting the first passphrase approves no registration by itself (docs/security.md §2, "How
/// approvals are stored"): until then any process of the user may write a registration into the
/// user's apps.d, and what counts then must not carry over unseen. Run as a throwaway uid against a
/// real keychaind, as the user would run keychainctl.
final class FirstPassphraseApprovalTests: XCTestCase {
    static let client = IsolationAttackTests.client

    /// app1 (groups TEAM.app1, TEAM.shared) and app2 (TEAM.app2), root-owned Python copies
    /// registered in the system directory, each holding a secret; an admin keychainctl registered
    /// root-owned; no passphrase yet.
    func twoApps() throws -> (UserSession, app1: String, app2: String) {
        let s = try UserSession()
        let app1 = try s.makeApp("app1")
        let app2 = try s.makeApp("app2")
        try s.registerSystem(
            .init(id: "TEAM.app1", groups: ["TEAM.app1", "TEAM.shared"], executables: [app1]), name: "app1")
        try s.registerSystem(.init(id: "TEAM.app2", groups: ["TEAM.app2"], executables: [app2]), name: "app2")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        for (app, group) in [(app1, "TEAM.shared"), (app2, "TEAM.app2")] {
            let stored = try s.script(
                Self.client + """
                    print(json.dumps(show(call('add', query=kw.item('svc', 'alice', v_Data=b"secret of \(group)", agrp='\(group)')))))
                    """, interpreter: app)
            XCTAssertEqual(stored["status"] as? Int, 0, "\(stored)")
        }
        return (s, app1, app2)
    }

    /// Runs keychainctl (the admin copy) as the user in a session of its own: no controlling
    /// terminal, as from a script, a cron job or ssh without a tty.
    func withoutTerminal(_ s: UserSession, _ args: [String]) throws -> ProgramResult {
        try s.run("/usr/bin/setsid", ["-w", s.adminCLIPath] + args)
    }

    static let whoAmI = client + "print(json.dumps({'caller': call('status')['result'].get('caller')}))"

    /// With no passphrase set, an unregistered process writes a registration naming the system
    /// python3 with both apps' groups (it counts at once: without a passphrase the user's files count
    /// as they are). The user then sets the first passphrase from a file, without a terminal. The
    /// planted file must not carry over: a Python script reads nothing of either app afterwards,
    /// including an item written after the passphrase was set.
    func testARegistrationPlantedBeforeTheFirstPassphraseIsNotApproved() throws {
        let (s, app1, _) = try twoApps()
        let python = try XCTUnwrap(AppPaths.realPath(UserSession.python))
        let planted = try s.script(
            Self.client + """
                x = os.path.join(sys.argv[1], 'x.json')
                with open(x, 'w') as f:
                    json.dump({'application-identifier': 'EVIL.python', 'executables': [sys.argv[2]],
                               'keychain-access-groups': ['TEAM.shared', 'TEAM.app2']}, f)
                print(json.dumps({'wrote': x}))
                """, [s.appsDirectory, python])
        XCTAssertNotNil(planted["wrote"])
        // Without a passphrase it counts as it is: the plant works until the passphrase is set.
        XCTAssertEqual(try s.script(Self.whoAmI)["caller"] as? String, "EVIL.python")

        let pass = try s.privateFile("pass", "correct horse\n")
        let set = try withoutTerminal(s, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertTrue(set.stdout.contains("x.json") && set.stdout.contains("not approved"), set.stdout)
        XCTAssertEqual(try withoutTerminal(s, ["unlock", "--passphrase-file", pass]).status, 0)
        let later = try s.script(
            Self.client + """
                print(json.dumps(show(call('add', query=kw.item('later', 'bob', v_Data=b"written later", agrp='TEAM.shared')))))
                """, interpreter: app1)
        XCTAssertEqual(later["status"] as? Int, 0, "\(later)")

        let attempt = try s.script(
            Self.client + """
                def summary(r):
                    return {'status': r.get('status'), 'message': r.get('message'),
                            'result': None if r.get('result') is None else repr(r.get('result'))}
                def get(group, service='svc', account='alice'):
                    return summary(call('copy', query=kw.item(service, account, r_Data=True, agrp=group)))
                any_item = summary(call('copy', query={'class': 'genp', 'r_Data': True, 'm_Limit': 'm_LimitAll'}))
                status = call('status')['result']
                print(json.dumps({'shared': get('TEAM.shared'), 'app2': get('TEAM.app2'),
                                  'later': get('TEAM.shared', 'later', 'bob'), 'any': any_item,
                                  'caller': status.get('caller')}))
                """)
        for key in ["shared", "app2", "later", "any"] {
            let r = attempt[key] as? [String: Any] ?? [:]
            XCTAssertEqual(r["status"] as? Int, -34018, "\(key): \(r)")
            XCTAssertTrue(r["result"] == nil || r["result"] is NSNull, "\(key) returned something: \(r)")
        }
        XCTAssertTrue(attempt["caller"] is NSNull, "\(attempt)")
        let status = try withoutTerminal(s, ["status"])
        XCTAssertTrue(status.stdout.contains("x.json") && status.stdout.contains("not approved"), status.stdout)
    }

    /// A registration named on the command line (`--approve NAME`) is approved along with the first
    /// passphrase, exactly as shown, and counts afterwards; one not named does not.
    func testARegistrationNamedWithApproveCountsAfterTheFirstPassphrase() throws {
        let s = try UserSession()
        let app3 = try s.makeApp("app3")
        let app4 = try s.makeApp("app4")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.registerUser(.init(id: "TEAM.app3", groups: ["TEAM.app3"], executables: [app3]), name: "app3")
        try s.registerUser(.init(id: "TEAM.app4", groups: ["TEAM.app4"], executables: [app4]), name: "app4")
        try s.start()
        let pass = try s.privateFile("pass", "correct horse\n")
        let set = try withoutTerminal(s, ["passwd", "--new-passphrase-file", pass, "--approve", "app3"])
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertTrue(
            set.stdout.contains("approving app3.json: groups TEAM.app3; executables \(app3); not an admin"), set.stdout)
        XCTAssertTrue(set.stdout.contains("app4.json"), "the registration left out is named: \(set.stdout)")
        XCTAssertEqual(try withoutTerminal(s, ["unlock", "--passphrase-file", pass]).status, 0)
        XCTAssertEqual(try s.script(Self.whoAmI, interpreter: app3)["caller"] as? String, "TEAM.app3")
        XCTAssertTrue(try s.script(Self.whoAmI, interpreter: app4)["caller"] is NSNull)
        let stored = try s.script(
            Self.client + "print(json.dumps(show(call('add', query=kw.item('svc', 'a', v_Data=b'x')))))",
            interpreter: app3)
        XCTAssertEqual(stored["status"] as? Int, 0, "\(stored)")

        // A name that is not a registration of the user's apps.d: nothing is set.
        let s2 = try UserSession()
        try s2.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s2.adminCLIPath], admin: true),
            name: "keychainctl")
        try s2.start()
        let pass2 = try s2.privateFile("pass", "correct horse\n")
        let missing = try withoutTerminal(s2, ["passwd", "--new-passphrase-file", pass2, "--approve", "nothere"])
        XCTAssertEqual(missing.status, 206, "errSecParam: \(missing.stdout + missing.stderr)")
        XCTAssertTrue(missing.stderr.contains("nothere.json"), missing.stderr)
        XCTAssertTrue(try withoutTerminal(s2, ["status"]).stdout.contains("not set"))
    }

    /// The README's flow from a clone: keychainctl installed root-owned and registered as the admin
    /// in the user's own apps.d. Without a terminal, `passwd` will not silently leave the admin it
    /// runs as unapproved; named with --approve, it stays the admin after the passphrase is set.
    func testAnAdminRegisteredByTheUserStaysAnAdminOnlyWhenApproved() throws {
        let s = try UserSession()
        try s.registerUser(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        let pass = try s.privateFile("pass", "correct horse\n")
        let refused = try withoutTerminal(s, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(refused.status, 206, "errSecParam: \(refused.stdout + refused.stderr)")
        XCTAssertTrue(refused.stderr.contains("--approve keychainctl.json"), refused.stderr)
        XCTAssertTrue(try withoutTerminal(s, ["status"]).stdout.contains("not set"), "nothing was changed")
        let set = try withoutTerminal(s, ["passwd", "--new-passphrase-file", pass, "--approve", "keychainctl"])
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try withoutTerminal(s, ["unlock", "--passphrase-file", pass]).status, 0)
        let status = try withoutTerminal(s, ["status"])
        XCTAssertTrue(status.stdout.contains("keychainctl (admin)"), status.stdout)
    }

    /// On a terminal, `passwd` shows each registration in full and asks; only those answered "y" are
    /// approved. (`script` gives keychainctl a pseudo-terminal and types the answers.)
    func testOnATerminalEachRegistrationIsShownAndConfirmed() throws {
        let s = try UserSession()
        let app3 = try s.makeApp("app3")
        let app4 = try s.makeApp("app4")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.registerUser(
            .init(id: "TEAM.app3", groups: ["TEAM.app3", "TEAM.shared"], executables: [app3], admin: true),
            name: "app3")
        try s.registerUser(.init(id: "TEAM.app4", groups: ["TEAM.app4"], executables: [app4]), name: "app4")
        try s.start()
        let pass = try s.privateFile("pass", "correct horse\n")
        // Files are listed by name: app3 first (answered y), then app4 (answered n).
        let run = try s.run(
            "/usr/bin/script",
            ["-qec", "\(s.adminCLIPath) passwd --new-passphrase-file \(pass)", "/dev/null"], stdin: "y\nn\n")
        XCTAssertEqual(run.status, 0, run.stdout + run.stderr)
        XCTAssertTrue(run.stdout.contains("TEAM.app3 (app3.json)"), run.stdout)
        XCTAssertTrue(run.stdout.contains("groups TEAM.app3, TEAM.shared"), run.stdout)
        XCTAssertTrue(run.stdout.contains("ADMIN"), run.stdout)
        XCTAssertTrue(run.stdout.contains("approve? [y/N]"), run.stdout)
        XCTAssertEqual(try withoutTerminal(s, ["unlock", "--passphrase-file", pass]).status, 0)
        XCTAssertEqual(try s.script(Self.whoAmI, interpreter: app3)["caller"] as? String, "TEAM.app3")
        XCTAssertTrue(try s.script(Self.whoAmI, interpreter: app4)["caller"] is NSNull)
    }

    /// The request itself: `passwd`'s `approve` list approves a file only when it still says what the
    /// admin was shown; one rewritten in between fails the whole change, and the passphrase stays unset.
    func testTheFirstPassphraseIsNotSetWhenAnApprovedFileChangedSinceItWasShown() throws {
        let admin = DaemonHarness.App(
            id: "TEAM.admin", groups: ["TEAM.tests"], executables: [DaemonHarness.runnerExecutable], admin: true)
        let d = try DaemonHarness(apps: [admin])
        let other = DaemonHarness.App(id: "TEAM.other", groups: ["TEAM.other"], executables: ["/usr/bin/true"])
        try d.register(other, name: "other", user: true)
        let c = try d.connect()
        let shown = try XCTUnwrap(
            c.call("approve", arguments: ["file": .text("other.json"), "preview": .bool(true)]).result?.map?[
                "registration"])
        try d.register(
            .init(id: "TEAM.other", groups: ["TEAM.other", "TEAM.tests"], executables: ["/usr/bin/true"]),
            name: "other",
            user: true)
        let stale = try c.call(
            "passwd",
            arguments: [
                "new": .bytes(Array("pw".utf8)),
                "approve": .array([.map(["file": .text("other.json"), "expect": shown])]),
            ])
        XCTAssertEqual(stale.status, .param, "\(stale)")
        XCTAssertTrue(stale.message?.contains("changed since it was shown") ?? false, "\(stale)")
        XCTAssertEqual(try c.call("status").result?.map?["passphraseSet"]?.bool, false, "nothing was changed")

        let now = try XCTUnwrap(
            c.call("approve", arguments: ["file": .text("other.json"), "preview": .bool(true)]).result?.map?[
                "registration"])
        let set = try c.call(
            "passwd",
            arguments: [
                "new": .bytes(Array("pw".utf8)),
                "approve": .array([.map(["file": .text("other.json"), "expect": now])]),
            ])
        XCTAssertEqual(set.status, .success, "\(set)")
        XCTAssertEqual(set.result?.map?["approved"]?.array?.compactMap(\.text), ["TEAM.other"])
        let listed = try d.connect().call("status").result?.map?["isolation"]?.map?["registrations"]?.array ?? []
        let entry = listed.compactMap(\.map).first { $0["application-identifier"]?.text == "TEAM.other" }
        XCTAssertEqual(entry?["trusted"]?.bool, true, "\(listed)")
        // With a passphrase set, approvals go through `approve`, which needs it.
        let again = try c.call(
            "passwd",
            arguments: [
                "old": .bytes(Array("pw".utf8)), "new": .bytes(Array("pw2".utf8)),
                "approve": .array([.map(["file": .text("other.json"), "expect": now])]),
            ])
        XCTAssertEqual(again.status, .param, "\(again)")
    }

    /// A registration whose executable is an interpreter (judged by the name of the file it resolves
    /// to) identifies every script that interpreter runs: `status` and `apps` say so.
    func testStatusAndAppsWarnAboutARegisteredInterpreter() throws {
        let s = try UserSession()
        let app1 = try s.makeApp("app1")
        let stranger = try s.makeApp("stranger")
        try s.registerSystem(.init(id: "TEAM.app1", groups: ["TEAM.app1"], executables: [app1]), name: "app1")
        // /usr/bin/python3, a symbolic link to python3.N: judged by what it resolves to.
        try s.registerSystem(
            .init(id: "TEAM.py", groups: ["TEAM.py"], executables: [UserSession.python]), name: "py")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        let python = try XCTUnwrap(AppPaths.realPath(UserSession.python))
        let status = try withoutTerminal(s, ["status"])
        XCTAssertEqual(status.status, 0, status.stderr)
        XCTAssertTrue(status.stdout.contains("interpreter"), status.stdout)
        XCTAssertTrue(status.stdout.contains("py.json") && status.stdout.contains(python), status.stdout)
        XCTAssertFalse(status.stdout.contains("app1.json"), "app1's executable is not named as an interpreter")
        let apps = try withoutTerminal(s, ["apps"])
        XCTAssertTrue(apps.stdout.contains("py.json: ") && apps.stdout.contains("every script"), apps.stdout)
        XCTAssertFalse(apps.stdout.contains("app1.json: "), apps.stdout)
        let json = try withoutTerminal(s, ["apps", "--json"])
        XCTAssertTrue(json.stdout.contains("\"interpreters\""), json.stdout)
        // An unidentified caller learns only that there is one, not which.
        let anyone = try s.script(
            Self.client + "print(json.dumps({'notes': call('status')['result']['isolation']['notes']}))",
            interpreter: stranger)
        let notes = (anyone["notes"] as? [String] ?? []).joined(separator: "\n")
        XCTAssertTrue(notes.contains("1 registration names an interpreter"), notes)
    }
}
