import Foundation
import XCTest

/// The attacks an unprivileged program of the user can make on per-app isolation (docs/security.md §2), each run
/// for real: keychaind as a throwaway uid with a passphrase set, the attacker as that same uid.
/// Every one of these read the victim's secret before the isolation work; each must now get
/// errSecMissingEntitlement (−34018) or errSecAuthFailed (−25293) and read nothing.
final class IsolationAttackTests: XCTestCase {
    static let secret = "app1's secret"

    /// The prelude of every script: a raw client (kcwire) on $KEYCHAIND_SOCKET.
    static let client = """
        import json, os, signal, socket, sys, time
        import kcwire as kw
        path = os.environ['KEYCHAIND_SOCKET']
        def call(op, **fields):
            c = kw.Conn(path)
            try:
                r = c.call(op, **fields)
            finally:
                c.close()
            return r
        def show(r):
            out = dict(r)
            if isinstance(out.get('result'), bytes):
                out['result'] = out['result'].decode('utf-8', 'replace')
            return out
        def read(group=None):
            q = kw.item('svc', 'alice', r_Data=True)
            if group: q['agrp'] = group
            return show(call('copy', query=q))

        """

    /// A session with app1 (a registered Python copy, groups TEAM.app1 and TEAM.shared) holding a
    /// secret in TEAM.shared, an admin keychainctl registered root-owned, and a passphrase set.
    func victim(
        passphrase: String = "correct horse", noPeerPidfd: Bool = DaemonHarness.suiteForcesNoPeerPidfd
    ) throws -> (UserSession, app1: String) {
        let s = try UserSession()
        s.noPeerPidfd = noPeerPidfd
        let app1 = try s.makeApp("app1")
        try s.registerSystem(
            .init(id: "TEAM.app1", groups: ["TEAM.app1", "TEAM.shared"], executables: [app1]), name: "app1")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        let pass = try s.privateFile("pass", passphrase + "\n")
        let set = try s.run(s.adminCLIPath, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        let stored = try s.script(
            Self.client + """
                print(json.dumps(show(call('add', query=kw.item('svc', 'alice', v_Data=b"\(Self.secret)", agrp='TEAM.shared')))))
                """, interpreter: app1)
        XCTAssertEqual(stored["status"] as? Int, 0, "\(stored)")
        let back = try s.script(Self.client + "print(json.dumps(read('TEAM.shared')))", interpreter: app1)
        XCTAssertEqual(back["result"] as? String, Self.secret, "the victim reads its own secret")
        return (s, app1)
    }

    func assertRefused(_ r: [String: Any], _ what: String, file: StaticString = #filePath, line: UInt = #line) {
        let status = r["status"] as? Int
        XCTAssertTrue(status == -34018 || status == -25293, "\(what): \(r)", file: file, line: line)
        XCTAssertNil(r["result"], "\(what) returned something: \(r)", file: file, line: line)
    }

    // MARK: 1. Self-registration

    /// An unregistered process writes apps.d/zz.json naming its own executable with "admin": true
    /// and sends SIGHUP. With a passphrase set, a file in the user's apps.d counts only if approved
    /// with the passphrase: the process stays unregistered, and status shows the file as not counting.
    func testAProcessThatRegistersItselfAsAdminGetsNothing() throws {
        let (s, _) = try victim()
        let python = try XCTUnwrap(AppPaths.realPath(UserSession.python))
        let wrote = try s.script(
            Self.client + """
                zz = os.path.join(sys.argv[1], 'zz.json')
                with open(zz, 'w') as f:
                    json.dump({'application-identifier': 'EVIL.app', 'keychain-access-groups': ['TEAM.shared', 'TEAM.app1'],
                               'executables': [sys.argv[2]], 'admin': True}, f)
                os.kill(int(sys.argv[3]), signal.SIGHUP)
                print(json.dumps({'wrote': zz}))
                """, [s.appsDirectory, python, String(s.daemonPID)])
        XCTAssertNotNil(wrote["wrote"])
        s.reload()  // waits for the reload the attacker's SIGHUP asked for (and asks again)
        let attempt = try s.script(
            Self.client + """
                backup = show(call('backup', passphrase=b'attacker chosen'))
                status = call('status')['result']
                print(json.dumps({'shared': read('TEAM.shared'), 'any': read(), 'backup': backup,
                                  'caller': status.get('caller'), 'why': status.get('unidentified')}))
                """)
        assertRefused(attempt["shared"] as? [String: Any] ?? [:], "read of TEAM.shared")
        assertRefused(attempt["any"] as? [String: Any] ?? [:], "read of any group")
        assertRefused(attempt["backup"] as? [String: Any] ?? [:], "backup")
        XCTAssertTrue(attempt["caller"] is NSNull, "\(attempt)")
        XCTAssertTrue(
            (attempt["why"] as? String)?.contains("not approved with the keychain passphrase") ?? false, "\(attempt)")
        let status = try s.run(s.adminCLIPath, ["status"])
        XCTAssertTrue(status.stdout.contains("zz.json") && status.stdout.contains("not approved"), status.stdout)
        XCTAssertTrue(s.log.contains("registration ignored"), s.log)
    }

    // MARK: 2. Mount namespaces

    /// In a user and mount namespace of its own, the attacker bind-mounts the system Python over the
    /// registered path and runs it: /proc/<pid>/exe shows the registered path, but the file is not the
    /// one at that path in keychaind's namespace.
    func testABindMountOverARegisteredPathIsNotThatApp() throws {
        let (s, app1) = try victim()
        let python = try XCTUnwrap(AppPaths.realPath(UserSession.python))
        let code =
            Self.client
            + "print(json.dumps({'shared': read('TEAM.shared'), 'why': call('status')['result'].get('unidentified')}))"
        let out = try s.run(
            "/usr/bin/unshare",
            [
                "-Urm", "/bin/sh", "-c", "mount --bind \"$0\" \"$1\" && exec \"$1\" -c \"$2\"",
                python, app1, code,
            ])
        XCTAssertEqual(out.status, 0, "unshare -Urm needs unprivileged user namespaces: \(out.stderr)")
        let line = try XCTUnwrap(out.stdout.split(separator: "\n").last)
        let attempt = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        assertRefused(attempt["shared"] as? [String: Any] ?? [:], "read through a bind mount")
        // The user namespace that the bind mount needs is refused first.
        XCTAssertTrue((attempt["why"] as? String)?.contains("another user namespace") ?? false, "\(attempt)")
    }

    /// In a user namespace of its own a process holds every capability over itself: it can point
    /// /proc/self/exe at a registered file without running it (PR_SET_MM_MAP), chroot and run the
    /// registered file under an ELF interpreter of its own, or forge the pid in a frame's
    /// SCM_CREDENTIALS within a pid namespace it made. So a process in another user namespace is
    /// never an app — here the registered app itself, unchanged, in the same mount namespace.
    func testARegisteredAppInAUserNamespaceOfItsOwnIsNotThatApp() throws {
        let (s, app1) = try victim()
        let code =
            Self.client
            + "print(json.dumps({'shared': read('TEAM.shared'), 'why': call('status')['result'].get('unidentified')}))"
        let out = try s.run("/usr/bin/unshare", ["-Ur", app1, "-c", code])
        XCTAssertEqual(out.status, 0, "unshare -Ur needs unprivileged user namespaces: \(out.stderr)")
        let line = try XCTUnwrap(out.stdout.split(separator: "\n").last)
        let attempt = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        assertRefused(attempt["shared"] as? [String: Any] ?? [:], "read from another user namespace")
        XCTAssertTrue((attempt["why"] as? String)?.contains("another user namespace") ?? false, "\(attempt)")
        // The same app in keychaind's namespaces still reads its secret.
        let back = try s.script(Self.client + "print(json.dumps(read('TEAM.shared')))", interpreter: app1)
        XCTAssertEqual(back["result"] as? String, Self.secret)
    }

    // MARK: 3. Connect, then exec

    /// The attacker stops the daemon, connects, forks a child that keeps the connection, and execs
    /// the registered app (which then just sleeps); the daemon, resumed, identifies the registered
    /// app — but the frames come from the child, another process.
    func testAChildOfAConnectionThatExecedARegisteredAppIsRefused() throws {
        let (s, app1) = try victim()
        // The process we started ends killed, as the registered app.
        let result = try s.script(
            Self.client + """
                daemon, app = int(sys.argv[1]), sys.argv[2]
                req = kw.frame({'v': 1, 'id': 1, 'op': 'copy', 'query': kw.item('svc', 'alice', r_Data=True, agrp='TEAM.shared')})
                r, w = os.pipe()
                kw.stop_process(daemon)
                try:
                    s = socket.socket(socket.AF_UNIX); s.connect(path)
                    pid = os.fork()
                    if pid != 0:
                        os.close(r); os.close(w)
                        os.execv(app, [app, '-c', 'import time; time.sleep(120)'])
                    # The child: wait until the parent runs the registered app, then let the daemon go.
                    while os.path.realpath('/proc/%d/exe' % os.getppid()) != os.path.realpath(app):
                        time.sleep(0.01)
                    os.kill(daemon, signal.SIGCONT)
                    s.sendall(req)
                    data = b''
                    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], 'big'):
                        chunk = s.recv(65536)
                        if not chunk: break
                        data += chunk
                    response = kw.decode(data[4:]) if len(data) > 4 else {'status': 'closed'}
                    closed = s.recv(1) == b''
                    os.kill(os.getppid(), signal.SIGKILL)
                    print(json.dumps({'response': show(response), 'closed': closed}))
                finally:
                    os.kill(daemon, signal.SIGCONT)
                """, [String(s.daemonPID), app1], exitStatus: nil)
        let response = result["response"] as? [String: Any] ?? [:]
        assertRefused(response, "the child's read")
        // Without SO_PEERPIDFD the child's frame may arrive before the daemon pins the connecting
        // process: then it is refused for carrying no pidfd of its writer.
        let message = response["message"] as? String ?? ""
        XCTAssertTrue(
            message.contains("the process that connected")
                || (DaemonHarness.suiteForcesNoPeerPidfd && message.contains("did not carry a pidfd")),
            "\(response)")
        XCTAssertEqual(result["closed"] as? Bool, true, "the connection is closed")
    }

    // MARK: 2b. A request left behind by an exited process

    /// Run as root for the pid steering only (an attacker of the user gets the same by forking through
    /// the pid range; /proc/sys/kernel/ns_last_pid makes it quick): with the daemon stopped, process A
    /// (the user) connects, writes a `copy` of the victim's secret — with a pidfd of itself attached
    /// or not — forks B, which keeps the connection, and exits. The registered app is then started
    /// (as the user) with A's pid, the daemon resumes, and B reads what it answered.
    static let leftBehindScript = """
        import json, os, signal, socket, subprocess, sys
        import kcwire as kw
        daemon, path, app, uid, with_pidfd = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == '1'
        req = kw.frame({'v': 1, 'id': 1, 'op': 'copy', 'query': kw.item('svc', 'alice', r_Data=True, agrp='TEAM.shared')})
        def as_user():
            os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
        def show(r):
            out = dict(r)
            if isinstance(out.get('result'), bytes):
                out['result'] = out['result'].decode('utf-8', 'replace')
            return out
        go_r, go_w = os.pipe()
        r, w = os.pipe()
        kw.stop_process(daemon)
        impostor = None
        try:
            a = os.fork()
            if a == 0:
                as_user()
                s = socket.socket(socket.AF_UNIX); s.connect(path)
                if with_pidfd:
                    kw.send_identifying(s, req)       # a pidfd of A, which is about to exit
                else:
                    s.sendall(req)
                if os.fork():
                    os._exit(0)                       # A exits; B keeps the connection
                os.read(go_r, 1)
                data = b''
                try:
                    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], 'big'):
                        chunk = s.recv(65536)
                        if not chunk: break
                        data += chunk
                    out = show(kw.decode(data[4:])) if len(data) > 4 else {'status': 'closed'}
                except OSError:
                    out = {'status': 'closed'}
                os.write(w, json.dumps(out).encode() + b'\\n'); os._exit(0)
            os.waitpid(a, 0)                          # A is reaped: its pid is free
            for _ in range(50):
                with open('/proc/sys/kernel/ns_last_pid', 'w') as f: f.write(str(a - 1))
                p = subprocess.Popen([app, '-c', 'import time; time.sleep(120)'], preexec_fn=as_user)
                if p.pid == a:
                    impostor = p; break
                p.kill(); p.wait()
        finally:
            os.kill(daemon, signal.SIGCONT)
        os.write(go_w, b'g')
        line = b''
        while not line.endswith(b'\\n'):
            line += os.read(r, 65536)
        if impostor:
            impostor.kill(); impostor.wait()
        print(json.dumps({'pid': a, 'recycled': impostor is not None, 'response': json.loads(line)}))
        """

    func leftBehindRequest(noPeerPidfd: Bool, withPidfd: Bool) throws {
        let (s, app1) = try victim(noPeerPidfd: noPeerPidfd)
        let status = try s.script(Self.client + "print(json.dumps(call('status')))", interpreter: app1)
        let pinning = ((status["result"] as? [String: Any])?["isolation"] as? [String: Any])?["peerPinning"] as? String
        XCTAssertEqual(
            pinning?.hasPrefix("SO_PEERPIDFD"), !noPeerPidfd,
            "the daemon pins peers the way the test means to try: \(pinning ?? "nothing in status")")
        let out = try runToCompletion(
            UserSession.python,
            [
                "-c", Self.leftBehindScript, String(s.daemonPID), s.socketPath, app1, String(s.uid),
                withPidfd ? "1" : "0",
            ], environment: s.environment)
        XCTAssertEqual(out.status, 0, out.stderr)
        let line = out.stdout.split(separator: "\n").last.map(String.init) ?? ""
        let result = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] ?? [:]
        XCTAssertEqual(result["recycled"] as? Bool, true, "the registered app got the exited process's pid: \(result)")
        let response = result["response"] as? [String: Any] ?? [:]
        assertRefused(response, "the request left behind by pid \(result["pid"] ?? "?")")
        XCTAssertFalse(line.contains(Self.secret), "the secret reached the attacker: \(line)")
        if noPeerPidfd {
            XCTAssertTrue(
                (response["message"] as? String)?.contains("did not carry a pidfd of the process that wrote it")
                    ?? false,
                "\(response)")
        }
        // The app itself, and a well-behaved client that sends its first bytes with its pidfd, are served.
        let back = try s.script(Self.client + "print(json.dumps(read('TEAM.shared')))", interpreter: app1)
        XCTAssertEqual(back["result"] as? String, Self.secret, "the victim still reads its own secret")
    }

    func testARequestLeftByAnExitedProcessIsNotAnsweredAsTheAppThatGotItsPid() throws {
        try leftBehindRequest(noPeerPidfd: false, withPidfd: false)
    }

    /// The same on a kernel without SO_PEERPIDFD (Debian 12's 6.1, forced here with a seccomp filter).
    func testARequestLeftByAnExitedProcessIsRefusedWithoutSOPeerPidfd() throws {
        try leftBehindRequest(noPeerPidfd: true, withPidfd: false)
    }

    /// …and when the exited process attached a pidfd of itself: that pidfd pins a process that is gone.
    func testARequestLeftWithItsWritersPidfdIsRefusedWithoutSOPeerPidfd() throws {
        try leftBehindRequest(noPeerPidfd: true, withPidfd: true)
    }

    // MARK: 3b. One connection, many queries of one shape

    /// A registered app of another group asks, on one connection, for its own item and then for
    /// the victim's by service and account — queries of one template, so the second is compiled from
    /// the first (the connection's memo). The compiled form carries the asking app's scope: the
    /// victim's item is not found in its groups, and naming the victim's group is refused.
    func testAnotherAppGetsNothingThroughAQueryTemplate() throws {
        let (s, _) = try victim()
        let app2 = try s.makeApp("app2")
        try s.registerSystem(.init(id: "TEAM.app2", groups: ["TEAM.app2"], executables: [app2]), name: "app2")
        s.reload()
        let r = try s.script(
            Self.client + """
                c = kw.Conn(path)
                out = {'add': show(c.call('add', query=kw.item('svc', 'bob', v_Data=b'mine')))}
                for n in range(3):
                    out['own%d' % n] = show(c.call('copy', query=kw.item('svc', 'bob', r_Data=True)))
                    out['victim%d' % n] = show(c.call('copy', query=kw.item('svc', 'alice', r_Data=True)))
                    out['named%d' % n] = show(c.call('copy', query=kw.item('svc', 'alice', r_Data=True, agrp='TEAM.shared')))
                    out['ownnamed%d' % n] = show(c.call('copy', query=kw.item('svc', 'bob', r_Data=True, agrp='TEAM.app2')))
                c.close()
                print(json.dumps(out))
                """, interpreter: app2)
        XCTAssertEqual((r["add"] as? [String: Any])?["status"] as? Int, 0, "\(r)")
        for n in 0..<3 {
            XCTAssertEqual((r["own\(n)"] as? [String: Any])?["result"] as? String, "mine", "\(r)")
            XCTAssertEqual((r["ownnamed\(n)"] as? [String: Any])?["result"] as? String, "mine", "\(r)")
            let victim = r["victim\(n)"] as? [String: Any] ?? [:]
            XCTAssertEqual(victim["status"] as? Int, -25300, "\(r)")
            XCTAssertNil(victim["result"], "\(r)")
            assertRefused(r["named\(n)"] as? [String: Any] ?? [:], "read naming TEAM.shared, round \(n)")
        }
    }

    // MARK: 4. No implicit admin

    /// The keychainctl beside keychaind, named by no registration, is a plain app with the group
    /// keychainctl: it cannot read other groups, list them, back up, change the passphrase or approve.
    func testTheBundledKeychainctlIsNotAnAdmin() throws {
        let (s, _) = try victim()
        let pass = try s.privateFile("pass2", "correct horse\n")
        let find = try s.run(s.cliPath, ["find", "-s", "svc", "-a", "alice", "-g", "TEAM.shared", "-w"])
        XCTAssertEqual(find.status, 30, find.stderr)  // −34018's low byte
        XCTAssertEqual(find.stdout, "")
        XCTAssertEqual(try s.run(s.cliPath, ["find", "-s", "svc", "-w"]).status, 44, "its own group holds nothing")
        XCTAssertEqual(try s.run(s.cliPath, ["list", "--json"]).stdout, "[]\n", "only its own group is listed")
        XCTAssertEqual(
            try s.run(
                s.cliPath,
                [
                    "backup", s.home + "/stolen", "--passphrase-file", pass,
                    "--keychain-passphrase-file", pass,
                ]
            ).status, 30)
        XCTAssertFalse(FileManager.default.fileExists(atPath: s.home + "/stolen"))
        XCTAssertEqual(
            try s.run(s.cliPath, ["passwd", "--passphrase-file", pass, "--new-passphrase-file", pass]).status, 30)
        let status = try s.run(s.cliPath, ["status", "--json"])
        XCTAssertTrue(
            status.stdout.contains("\"admin\":false") && status.stdout.contains("\"caller\":\"keychainctl\""),
            status.stdout)
        // It works as the app it is: its own group.
        XCTAssertEqual(try s.run(s.cliPath, ["add", "-s", "cli", "-a", "me", "-w", "mine"]).status, 0)
        XCTAssertEqual(try s.run(s.cliPath, ["find", "-s", "cli", "-a", "me", "-w"]).stdout, "mine\n")
    }

    // MARK: Admins prove presence

    /// The registered admin keychainctl lists every group, but reading another group's secret,
    /// backing up and approving need the keychain passphrase in the request.
    func testAnAdminNeedsThePassphraseForOtherGroupsSecretsAndBackups() throws {
        let (s, _) = try victim()
        let pass = try s.privateFile("pass2", "correct horse\n")
        let wrong = try s.privateFile("wrong", "not it\n")
        let list = try s.run(s.adminCLIPath, ["list"])
        XCTAssertTrue(list.stdout.contains("TEAM.shared"), "attributes need no presence: \(list.stdout)")
        let unproven = try s.run(s.adminCLIPath, ["find", "-s", "svc", "-a", "alice", "-w"])  // no terminal to ask on
        XCTAssertNotEqual(unproven.status, 0)
        XCTAssertEqual(unproven.stdout, "")
        let wrongOne = try s.run(
            s.adminCLIPath, ["find", "-s", "svc", "-a", "alice", "-w", "--keychain-passphrase-file", wrong])
        XCTAssertEqual(wrongOne.status, 51, wrongOne.stderr)  // −25293's low byte
        let proven = try s.run(
            s.adminCLIPath, ["find", "-s", "svc", "-a", "alice", "-w", "--keychain-passphrase-file", pass])
        XCTAssertEqual(proven.stdout, Self.secret + "\n", proven.stderr)
        XCTAssertEqual(
            try s.run(
                s.adminCLIPath,
                [
                    "backup", s.home + "/b", "--passphrase-file", pass,
                    "--keychain-passphrase-file", wrong,
                ]
            ).status, 51)
        XCTAssertEqual(
            try s.run(
                s.adminCLIPath,
                [
                    "backup", s.home + "/b", "--passphrase-file", pass,
                    "--keychain-passphrase-file", pass,
                ]
            ).status, 0)
    }

    // MARK: Registering with the passphrase

    /// `keychainctl register` writes the user's registration and approves it with the passphrase;
    /// the app counts from then on, also after a restart once the keychain has been unlocked; a file
    /// changed afterwards stops counting; `unregister` removes it.
    func testARegistrationMadeWithThePassphraseCountsAndAChangedOneDoesNot() throws {
        let (s, _) = try victim()
        let pass = try s.privateFile("pass2", "correct horse\n")
        let app2 = try s.makeApp("app2")
        let whoAmI = Self.client + "print(json.dumps({'caller': call('status')['result'].get('caller')}))"
        XCTAssertTrue(try s.script(whoAmI, interpreter: app2)["caller"] is NSNull)
        let registered = try s.run(
            s.adminCLIPath,
            [
                "register", "-i", "TEAM.app2", "-g", "TEAM.app2", "-e", app2,
                "--keychain-passphrase-file", pass,
            ])
        XCTAssertEqual(registered.status, 0, registered.stderr)
        XCTAssertEqual(try s.script(whoAmI, interpreter: app2)["caller"] as? String, "TEAM.app2")

        // Restarted, it is locked: the approval is sealed under the passphrase, readable after unlock.
        // Until then the app is told the keychain is locked (errSecInteractionNotAllowed, which
        // keychain code retries), not that it lacks an entitlement (a setup error to give up on).
        s.stop()
        try s.start()
        XCTAssertTrue(try s.script(whoAmI, interpreter: app2)["caller"] is NSNull)
        let beforeUnlock = try s.script(Self.client + "print(json.dumps(read()))", interpreter: app2)
        XCTAssertEqual(beforeUnlock["status"] as? Int, -25308, "\(beforeUnlock)")
        XCTAssertTrue((beforeUnlock["message"] as? String ?? "").contains("keychain is locked"), "\(beforeUnlock)")
        XCTAssertNil(beforeUnlock["result"])
        XCTAssertEqual(
            try s.run(s.cliPath, ["unlock", "--passphrase-file", pass]).status, 0, "the bundled CLI may unlock")
        XCTAssertEqual(try s.script(whoAmI, interpreter: app2)["caller"] as? String, "TEAM.app2")

        // Widening the registration by editing the file makes it stop counting.
        let file = s.appsDirectory + "/TEAM.app2.json"
        let widened =
            #"{"application-identifier": "TEAM.app2", "keychain-access-groups": ["TEAM.app2", "TEAM.shared"], "executables": ["\#(app2)"]}"#
        XCTAssertEqual(try s.run("/bin/sh", ["-c", "printf '%s' \"$0\" > \"$1\"", widened, file]).status, 0)
        s.reload()
        XCTAssertTrue(try s.script(whoAmI, interpreter: app2)["caller"] is NSNull)
        // Unlocked, a file that was not approved is plainly not a registration.
        let widenedRead = try s.script(Self.client + "print(json.dumps(read('TEAM.shared')))", interpreter: app2)
        XCTAssertEqual(widenedRead["status"] as? Int, -34018, "\(widenedRead)")
        XCTAssertNil(widenedRead["result"])

        XCTAssertEqual(
            try s.run(s.adminCLIPath, ["unregister", "TEAM.app2", "--keychain-passphrase-file", pass]).status, 0)
        XCTAssertFalse(FileManager.default.fileExists(atPath: file))
    }

    /// Any process of the user can rewrite a registration between `keychainctl register` writing it
    /// and the daemon reading it for approval — the passphrase prompt is a window as long as the user
    /// takes to type. Here the rewrite adds a group of the victim and "admin": true while register
    /// waits for its passphrase. The daemon approves only what register wrote, so nothing is approved;
    /// `approve` then shows the admin what the file says before asking for the passphrase.
    func testARegistrationRewrittenBeforeItsApprovalIsNotApproved() throws {
        let (s, _) = try victim()
        let app2 = try s.makeApp("app2")
        let file = s.appsDirectory + "/TEAM.app2.json"
        let widened =
            #"{"application-identifier": "TEAM.app2", "keychain-access-groups": ["TEAM.app2", "TEAM.shared"], "executables": ["\#(app2)"], "admin": true}"#
        // register waits on a FIFO for its passphrase; the attacker rewrites the file as soon as it
        // appears (register writes it by rename, whole), then the passphrase arrives.
        let race = try s.run(
            "/bin/sh",
            [
                "-c",
                """
                rm -f pp-fifo; mkfifo pp-fifo
                "$0" register -i TEAM.app2 -g TEAM.app2 -e "$1" --keychain-passphrase-file pp-fifo >reg.out 2>reg.err &
                pid=$!
                while [ ! -e "$2" ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done
                printf '%s' "$3" > "$2.new" && mv "$2.new" "$2"
                (printf 'correct horse\n' > pp-fifo) & writer=$!
                status=0; wait $pid || status=$?
                kill $writer 2>/dev/null
                echo "status=$status"; cat reg.err
                """,
                s.adminCLIPath, app2, file, widened,
            ])
        XCTAssertFalse(race.stdout.contains("status=0"), "register approved a rewritten file: \(race.stdout)")
        XCTAssertTrue(race.stdout.contains("changed since it was read"), race.stdout + race.stderr)
        let whoAmI = Self.client + "print(json.dumps({'caller': call('status')['result'].get('caller')}))"
        XCTAssertTrue(try s.script(whoAmI, interpreter: app2)["caller"] is NSNull)
        assertRefused(try s.script(Self.client + "print(json.dumps(read('TEAM.shared')))", interpreter: app2), "read")

        // approve shows what it is about to approve before it asks for the passphrase.
        let pass = try s.privateFile("pass-approve", "correct horse\n")
        let approved = try s.run(s.adminCLIPath, ["approve", "TEAM.app2", "--keychain-passphrase-file", pass])
        XCTAssertEqual(approved.status, 0, approved.stderr)
        let shown = try XCTUnwrap(approved.stdout.split(separator: "\n").first)
        XCTAssertTrue(shown.hasPrefix("approving TEAM.app2.json: groups TEAM.app2, TEAM.shared;"), approved.stdout)
        XCTAssertTrue(shown.contains("ADMIN"), approved.stdout)
        XCTAssertEqual(try s.script(whoAmI, interpreter: app2)["caller"] as? String, "TEAM.app2")
    }

    /// A registered executable the user can modify (here: in the user's home) carries no identity
    /// when the daemon's user is not root; the message names the path.
    func testAnExecutableTheUserCanModifyCarriesNoIdentity() throws {
        let s = try UserSession()
        let own = s.home + "/app"
        try FileManager.default.copyItem(atPath: try XCTUnwrap(AppPaths.realPath(UserSession.python)), toPath: own)
        chown(own, s.uid, s.uid)
        chmod(own, 0o755)
        try s.registerSystem(.init(id: "TEAM.own", groups: ["TEAM.own"], executables: [own]), name: "own")
        try s.start()
        let r = try s.script(
            Self.client + "print(json.dumps(show(call('copy', query=kw.item('svc', 'x', r_Data=True)))))",
            interpreter: own)
        XCTAssertEqual(r["status"] as? Int, -34018, "\(r)")
        XCTAssertTrue((r["message"] as? String)?.contains("\(own) can be modified by this user") ?? false, "\(r)")
    }

    // MARK: 7. ACLs

    /// Gives `path` a POSIX ACL (as root, through the `system.posix_acl_access` attribute, which is
    /// what `setfacl -m u:UID:rwx,g:GID:rwx` writes): rwx for the named user and group, r-x for the
    /// owning group and others, the mask rwx.
    static func grantACL(_ path: String, user: UInt32? = nil, group: UInt32? = nil) throws {
        var entries = [(1, 7, UInt32.max)]
        if let user { entries.append((2, 7, user)) }
        entries.append((4, 5, UInt32.max))
        if let group { entries.append((8, 7, group)) }
        entries += [(0x10, 7, UInt32.max), (0x20, 5, UInt32.max)]
        let list = entries.map { "(\($0.0), \($0.1), \($0.2))" }.joined(separator: ", ")
        let out = try runToCompletion(
            "/usr/bin/python3",
            [
                "-c",
                "import os, struct, sys; os.setxattr(sys.argv[1], 'system.posix_acl_access', struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in [\(list)]))",
                path,
            ], environment: [:])
        guard out.status == 0 else { throw HarnessError("setting the ACL of \(path) failed: \(out.stderr)") }
    }

    /// The registered app's directory is root's and 0755, but an ACL gives the user rwx on it (added
    /// after keychaind read its registrations: nothing reloads). The user renames another program over
    /// the registered path and runs it: the file at the path is the one it runs, so only judging the
    /// path again at identification tells it is not the app's.
    func testAnExecutableReplacedThroughAnACLIsNotThatApp() throws {
        let (s, app1) = try victim()
        let reads = s.log.components(separatedBy: "why=").count
        try Self.grantACL(s.bin, user: s.uid)
        let python = try XCTUnwrap(AppPaths.realPath(UserSession.python))
        let swapped = try s.script(
            Self.client + """
                import shutil
                shutil.copy(sys.argv[1], sys.argv[2] + '.new')
                os.chmod(sys.argv[2] + '.new', 0o755)
                os.rename(sys.argv[2] + '.new', sys.argv[2])
                print(json.dumps({'owner': os.stat(sys.argv[2]).st_uid}))
                """, [python, app1])
        XCTAssertEqual(swapped["owner"] as? Int, Int(s.uid), "the user replaced the registered file")
        let attempt = try s.script(
            Self.client + "print(json.dumps({'shared': read('TEAM.shared'), 'own': read('TEAM.app1')}))",
            interpreter: app1)
        for (group, r) in attempt {
            let r = r as? [String: Any] ?? [:]
            assertRefused(r, "read of \(group) by the replaced app1")
            XCTAssertEqual(r["status"] as? Int, -34018, "\(r)")
            XCTAssertTrue(
                (r["message"] as? String)?.contains("\(s.bin) is writable by uid \(s.uid) through its ACL") ?? false,
                "\(r)")
        }
        XCTAssertEqual(s.log.components(separatedBy: "why=").count, reads, "no reload: \(s.log)")
    }

    /// Registrations of executables in root-owned 0755 directories with ACLs: one granting the user
    /// rwx, one granting a group of the user's rwx, one granting another uid rwx. The first two are
    /// refused when the registry is read, `keychainctl status` names the directory, and their apps get
    /// −34018; the third is the app it says. A system registration file whose ACL lets the user
    /// write it does not count either.
    func testARegistrationInADirectoryTheUserMayWriteByACLIsRefused() throws {
        let s = try UserSession()
        var apps: [String: String] = [:]
        for name in ["byuser", "bygroup", "byother"] {
            let dir = s.root + "/" + name
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            chmod(dir, 0o755)
            let app = dir + "/app"
            try FileManager.default.copyItem(atPath: try XCTUnwrap(AppPaths.realPath(UserSession.python)), toPath: app)
            chmod(app, 0o755)
            try s.registerSystem(.init(id: "TEAM.\(name)", groups: ["TEAM.\(name)"], executables: [app]), name: name)
            apps[name] = app
        }
        let planted = try s.makeApp("planted")
        try s.registerSystem(
            .init(id: "TEAM.planted", groups: ["TEAM.planted"], executables: [planted]), name: "planted")
        try Self.grantACL(s.systemAppsDirectory + "/planted.json", user: s.uid)
        // setpriv --regid=UID --clear-groups: the user's only group is gid UID.
        try Self.grantACL(s.root + "/byuser", user: s.uid)
        try Self.grantACL(s.root + "/bygroup", group: s.uid)
        try Self.grantACL(s.root + "/byother", user: s.uid + 1, group: s.uid + 1)
        try s.start()
        let status = try s.run(s.cliPath, ["status"])
        XCTAssertEqual(status.status, 0, status.stderr)
        for name in ["byuser", "bygroup"] {
            XCTAssertTrue(
                status.stdout.contains("\(s.root)/\(name) is writable by uid \(s.uid) through its ACL"), status.stdout)
            let r = try s.script(
                Self.client + "print(json.dumps(show(call('copy', query=kw.item('svc', 'x', r_Data=True)))))",
                interpreter: apps[name]!)
            XCTAssertEqual(r["status"] as? Int, -34018, "\(r)")
            XCTAssertTrue((r["message"] as? String)?.contains("\(s.root)/\(name) is writable") ?? false, "\(r)")
        }
        XCTAssertFalse(status.stdout.contains("\(s.root)/byother"), status.stdout)
        XCTAssertTrue(
            status.stdout.contains("planted.json is writable by others: its ACL grants write to uid \(s.uid)"),
            status.stdout)
        let plantedCaller = try s.script(
            Self.client + "print(json.dumps({'caller': call('status')['result'].get('caller')}))", interpreter: planted)
        XCTAssertTrue(plantedCaller["caller"] is NSNull, "\(plantedCaller)")
        let other = try s.script(
            Self.client + "print(json.dumps({'caller': call('status')['result'].get('caller')}))",
            interpreter: apps["byother"]!)
        XCTAssertEqual(other["caller"] as? String, "TEAM.byother", "\(other)")
    }
}
