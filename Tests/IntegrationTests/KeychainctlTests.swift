import Foundation
import KeychainServices
import KeychainWire
import XCTest

/// `keychainctl`, the real binary against the real daemon: every verb, exit codes, --json, --help.
final class KeychainctlTests: XCTestCase {
    var daemon: DaemonHarness!

    /// keychainctl registered as the package registers it: an admin with the group `keychainctl`.
    static let cliAdmin = DaemonHarness.App(
        id: "keychainctl", groups: ["keychainctl"],
        executables: [DaemonHarness.cliPath], admin: true)

    override func setUpWithError() throws {
        daemon = try DaemonHarness(apps: DaemonHarness.defaultApps + [Self.cliAdmin])
    }

    override func tearDown() {
        daemon = nil
    }

    @discardableResult
    func ctl(_ args: String..., stdin: String? = nil) throws -> (status: Int32, stdout: String, stderr: String) {
        try daemon.run(DaemonHarness.cliPath, args, stdin: stdin)
    }

    func json(_ s: String) throws -> Any {
        try JSONSerialization.jsonObject(with: Data(s.utf8), options: [.fragmentsAllowed])
    }

    /// One line on stderr, "keychainctl: errSecName (code): message", and the exit status = low byte.
    func assertFailure(
        _ r: (status: Int32, stdout: String, stderr: String), _ status: OSStatus, _ name: String,
        file: StaticString = #filePath, line: UInt = #line
    ) {
        XCTAssertEqual(r.status, Int32(UInt8(truncatingIfNeeded: status)), r.stderr, file: file, line: line)
        XCTAssertTrue(r.stderr.hasPrefix("keychainctl: \(name) (\(status)): "), r.stderr, file: file, line: line)
        XCTAssertEqual(r.stderr.filter { $0 == "\n" }.count, 1, r.stderr, file: file, line: line)
    }

    func testHelpForTheToolAndEveryVerb() throws {
        let tool = try ctl("--help")
        XCTAssertEqual(tool.status, 0)
        for verb in [
            "add", "find", "update", "delete", "list", "device-id", "status", "lock", "unlock", "passwd", "backup",
            "restore",
            "apps", "register", "approve", "unregister", "add-internet-password", "find-internet-password",
            "delete-internet-password",
        ] {
            XCTAssertTrue(tool.stdout.contains("  \(verb) "), verb)
            let help = try ctl(verb, "--help")
            XCTAssertEqual(help.status, 0, verb)
            XCTAssertTrue(help.stdout.hasPrefix("usage: keychainctl \(verb)"), help.stdout)
            XCTAssertTrue(help.stdout.contains("--json"), verb)
            XCTAssertEqual(try ctl("help", verb).stdout, help.stdout)
        }
        XCTAssertEqual(try ctl().stdout, tool.stdout)
    }

    /// macOS `security`'s internet-password verbs and flags, end to end; what SecItem code stored is
    /// what they find.
    func testInternetPasswordVerbs() throws {
        var r = try ctl(
            "add-internet-password", "-a", "alice", "-s", "example.com", "-r", "htps", "-P", "8443", "-p", "/login",
            "-d", "realm", "-t", "form", "-w", "s3cret", "-l", "Example")
        XCTAssertEqual(r.status, 0, r.stderr)
        // The same server and account on another port or protocol is another item; the same is a duplicate.
        XCTAssertEqual(
            try ctl("add-internet-password", "-a", "alice", "-s", "example.com", "-r", "http", "-w", "plain").status, 0)
        assertFailure(
            try ctl(
                "add-internet-password", "-a", "alice", "-s", "example.com", "-r", "https", "-P", "8443", "-p",
                "/login", "-d", "realm", "-t", "htmlform", "-w", "again"), errSecDuplicateItem, "errSecDuplicateItem")
        XCTAssertEqual(
            try ctl(
                "add-internet-password", "-U", "-a", "alice", "-s", "example.com", "-r", "htps", "-P", "8443", "-p",
                "/login", "-d", "realm", "-t", "form", "-w", "updated"
            ).status, 0)

        r = try ctl("find-internet-password", "-a", "alice", "-s", "example.com", "-r", "htps", "-w")
        XCTAssertEqual(r.stdout, "updated\n", r.stderr)
        r = try ctl("find-internet-password", "-s", "example.com", "-P", "8443", "-g")
        XCTAssertEqual(r.status, 0, r.stderr)
        for part in ["server", "example.com", "htps", "8443", "/login", "realm", "form", "Example", "password"] {
            XCTAssertTrue(r.stdout.contains(part), "\(part) in \(r.stdout)")
        }
        XCTAssertTrue(r.stdout.contains("\"updated\""), r.stdout)
        r = try ctl("find-internet-password", "-s", "example.com", "-r", "ftp", "-w")
        assertFailure(r, errSecItemNotFound, "errSecItemNotFound")
        // Generic-password verbs do not see them.
        assertFailure(try ctl("find", "-s", "example.com"), errSecItemNotFound, "errSecItemNotFound")
        assertFailure(try ctl("find-internet-password", "-r", "xyz12"), errSecParam, "errSecParam")

        // Two match: delete needs --all, or a narrower match.
        assertFailure(
            try ctl("delete-internet-password", "-a", "alice", "-s", "example.com"), errSecParam, "errSecParam")
        XCTAssertEqual(try ctl("delete-internet-password", "-a", "alice", "-s", "example.com", "-r", "http").status, 0)
        XCTAssertEqual(try ctl("find-internet-password", "-s", "example.com", "-w").stdout, "updated\n")
        XCTAssertEqual(try ctl("delete-internet-password", "-s", "example.com", "--all").status, 0)
        assertFailure(try ctl("find-internet-password", "-s", "example.com"), errSecItemNotFound, "errSecItemNotFound")
    }

    func testUsageErrorsAreErrSecParam() throws {
        assertFailure(try ctl("frobnicate"), errSecParam, "errSecParam")
        assertFailure(try ctl("help", "frobnicate"), errSecParam, "errSecParam")
        assertFailure(try ctl("find", "-x"), errSecParam, "errSecParam")
        assertFailure(try ctl("add", "-s", "svc"), errSecParam, "errSecParam")
        assertFailure(try ctl("add", "-s", "svc", "-a", "a", "-w", "x", "--stdin"), errSecParam, "errSecParam")
        assertFailure(
            try ctl("add", "-s", "svc", "-a", "a", "-w", "x", "--accessible", "zz"), errSecParam, "errSecParam")
        assertFailure(try ctl("list", "--all"), errSecParam, "errSecParam")
        assertFailure(try ctl("backup"), errSecParam, "errSecParam")
        assertFailure(try ctl("unlock", "--passphrase", "secret-on-argv"), errSecParam, "errSecParam")
        // The flag of unlock and passwd, given to an admin verb: the message names the right one.
        let wrongFlag = try ctl("approve", "x", "--passphrase-file", "/dev/null")
        assertFailure(wrongFlag, errSecParam, "errSecParam")
        XCTAssertTrue(wrongFlag.stderr.contains("given with --keychain-passphrase-file"), wrongFlag.stderr)
        let unreachable = try ctl("--socket", daemon.root + "/nope.sock", "status")
        assertFailure(unreachable, errSecNotAvailable, "errSecNotAvailable")
        XCTAssertTrue(unreachable.stderr.contains(daemon.root + "/nope.sock"))
    }

    func testAddFindUpdateDelete() throws {
        XCTAssertEqual(
            try ctl(
                "add", "-s", "com.example.cli", "-a", "alice", "-w", "s3cret", "-l", "Alice", "-j", "note",
                "-D", "web password", "--accessible", "ck"
            ).status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.cli", "-a", "alice", "-w").stdout, "s3cret\n")
        assertFailure(
            try ctl("add", "-s", "com.example.cli", "-a", "alice", "-w", "again"), errSecDuplicateItem,
            "errSecDuplicateItem")
        XCTAssertEqual(try ctl("add", "-s", "com.example.cli", "-a", "alice", "-w", "replaced", "-U").status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.cli", "-a", "alice", "-w").stdout, "replaced\n")
        XCTAssertEqual(try ctl("add", "-s", "com.example.cli", "-a", "bob", "--stdin", stdin: "from stdin\n").status, 0)
        // Asked for (no terminal: read from standard input), longer than the first 4 KiB buffer.
        let long = String(repeating: "0123456789", count: 1000)
        XCTAssertEqual(try ctl("add", "-s", "com.example.long", "-a", "carol", stdin: long + "\n").status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.long", "-a", "carol", "-w").stdout, long + "\n")
        XCTAssertEqual(try ctl("find", "-s", "com.example.cli", "-a", "bob", "-w").stdout, "from stdin\n")

        let human = try ctl("find", "-s", "com.example.cli", "-a", "alice")
        XCTAssertEqual(human.status, 0)
        for expected in [
            "service", "com.example.cli", "account", "alice", "access group", "keychainctl", "label",
            "Alice", "comment", "note", "description", "web password", "ck (after first unlock)", "created", "modified",
        ] {
            XCTAssertTrue(human.stdout.contains(expected), "\(expected) in \(human.stdout)")
        }
        XCTAssertFalse(human.stdout.contains("replaced"), "attributes only, no secret")
        // Aligned: every value starts in the same column, after the label and at least two spaces.
        let valueColumns = Set(
            human.stdout.split(separator: "\n").map { line -> Int in
                let gap = line.range(of: "  ")!.lowerBound
                let value = line[gap...].firstIndex { $0 != " " }!
                return line.distance(from: line.startIndex, to: value)
            })
        XCTAssertEqual(valueColumns.count, 1, human.stdout)

        let attrs = try XCTUnwrap(
            try json(ctl("--json", "find", "-s", "com.example.cli", "-a", "alice").stdout) as? [String: Any])
        XCTAssertEqual(attrs["svce"] as? String, "com.example.cli")
        XCTAssertEqual(attrs["acct"] as? String, "alice")
        XCTAssertEqual(attrs["pdmn"] as? String, "ck")
        XCTAssertEqual(attrs["sync"] as? Bool, false)
        XCTAssertNotNil(attrs["cdat"] as? String)
        XCTAssertNil(attrs["v_Data"])
        let withSecret = try XCTUnwrap(
            try json(ctl("find", "-s", "com.example.cli", "-a", "alice", "-w", "--json").stdout) as? [String: Any])
        XCTAssertEqual((withSecret["v_Data"] as? String).flatMap { Data(base64Encoded: $0) }, Data("replaced".utf8))
        XCTAssertEqual(withSecret["acct"] as? String, "alice")
        let all = try XCTUnwrap(
            try json(ctl("find", "-s", "com.example.cli", "--all", "--json").stdout) as? [[String: Any]])
        XCTAssertEqual(Set(all.compactMap { $0["acct"] as? String }), ["alice", "bob"])
        XCTAssertEqual(
            try ctl("find", "-s", "com.example.cli", "--all", "-w").stdout.split(separator: "\n").sorted(),
            ["from stdin", "replaced"])

        let missing = try ctl("find", "-s", "com.example.none", "-w")
        assertFailure(missing, errSecItemNotFound, "errSecItemNotFound")
        XCTAssertEqual(missing.stdout, "")
        let missingJSON = try ctl("find", "-s", "com.example.none", "--json")
        XCTAssertEqual(missingJSON.status, 44)
        let error = try XCTUnwrap(try json(missingJSON.stdout) as? [String: Any])
        XCTAssertEqual(error["status"] as? Int, -25300)
        XCTAssertEqual(error["error"] as? String, "errSecItemNotFound")

        XCTAssertEqual(try ctl("update", "-s", "com.example.cli", "-a", "alice", "-w", "updated").status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.cli", "-a", "alice", "-w").stdout, "updated\n")
        XCTAssertEqual(try ctl("update", "-s", "com.example.cli", "-a", "alice", "--stdin", stdin: "piped\n").status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.cli", "-a", "alice", "-w").stdout, "piped\n")
        let relabel = try ctl("--json", "update", "-s", "com.example.cli", "-a", "alice", "-l", "Renamed")
        XCTAssertEqual(relabel.status, 0)
        XCTAssertEqual((try json(relabel.stdout) as? [String: Any])?["ok"] as? Bool, true)
        XCTAssertEqual(
            (try json(ctl("--json", "find", "-s", "com.example.cli", "-a", "alice").stdout) as? [String: Any])?["labl"]
                as? String, "Renamed")
        XCTAssertEqual(
            try ctl("find", "-s", "com.example.cli", "-a", "alice", "-w").stdout, "piped\n",
            "a label change keeps the secret")
        assertFailure(
            try ctl("update", "-s", "com.example.none", "-a", "x", "-w", "y"), errSecItemNotFound, "errSecItemNotFound")

        assertFailure(try ctl("delete", "-s", "com.example.cli"), errSecParam, "errSecParam")  // two match, no --all
        let deleted = try ctl("delete", "-s", "com.example.cli", "-a", "alice", "--json")
        XCTAssertEqual(deleted.status, 0, deleted.stderr)
        XCTAssertEqual((try json(deleted.stdout) as? [String: Any])?["deleted"] as? Int, 1)
        assertFailure(
            try ctl("delete", "-s", "com.example.cli", "-a", "alice"), errSecItemNotFound, "errSecItemNotFound")
        XCTAssertEqual(try ctl("add", "-s", "com.example.cli", "-a", "carol", "-w", "c").status, 0)
        XCTAssertEqual(try ctl("delete", "-s", "com.example.cli", "--all").status, 0)
        assertFailure(try ctl("find", "-s", "com.example.cli"), errSecItemNotFound, "errSecItemNotFound")
    }

    func testSynchronizableItemsAreAddedFoundUpdatedAndDeletedByTheFlag() throws {
        // A local and a synchronizable item of the same service and account are two items (Apple's
        // uniqueness counts kSecAttrSynchronizable); without the flag a verb sees the local one only.
        XCTAssertEqual(try ctl("add", "-s", "com.example.sync", "-a", "alice", "-w", "local").status, 0)
        XCTAssertEqual(
            try ctl("add", "-s", "com.example.sync", "-a", "alice", "-w", "travels", "--synchronizable").status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.sync", "-a", "alice", "-w").stdout, "local\n")
        XCTAssertEqual(
            try ctl("find", "-s", "com.example.sync", "-a", "alice", "--synchronizable", "-w").stdout, "travels\n")
        let shown = try ctl("find", "-s", "com.example.sync", "-a", "alice", "--synchronizable")
        XCTAssertTrue(shown.stdout.contains("synchronizable"), shown.stdout)
        XCTAssertEqual(
            try ctl("update", "-s", "com.example.sync", "-a", "alice", "--synchronizable", "-w", "changed").status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.sync", "-a", "alice", "-w").stdout, "local\n")
        XCTAssertEqual(
            try ctl("add", "-s", "com.example.sync", "-a", "alice", "-w", "again", "--synchronizable", "-U").status, 0)
        XCTAssertEqual(
            try ctl("find", "-s", "com.example.sync", "-a", "alice", "--synchronizable", "-w").stdout, "again\n")
        XCTAssertEqual(try ctl("delete", "-s", "com.example.sync", "-a", "alice", "--synchronizable").status, 0)
        assertFailure(
            try ctl("find", "-s", "com.example.sync", "-a", "alice", "--synchronizable"), errSecItemNotFound,
            "errSecItemNotFound")
        XCTAssertEqual(try ctl("find", "-s", "com.example.sync", "-a", "alice", "-w").stdout, "local\n")
        // Internet passwords take it too.
        XCTAssertEqual(
            try ctl("add-internet-password", "-a", "bob", "-s", "sync.example.com", "-w", "pw", "--synchronizable")
                .status, 0)
        assertFailure(
            try ctl("find-internet-password", "-a", "bob", "-s", "sync.example.com"), errSecItemNotFound,
            "errSecItemNotFound")
        XCTAssertEqual(
            try ctl("find-internet-password", "-a", "bob", "-s", "sync.example.com", "--synchronizable", "-w").stdout,
            "pw\n")
    }

    func testGroupsAndList() throws {
        XCTAssertEqual(try ctl("list").stdout, "")
        XCTAssertEqual(try ctl("list", "--json").stdout, "[]\n")
        XCTAssertEqual(try ctl("add", "-s", "svc.b", "-a", "x", "-g", "TEAM.shared", "-w", "1").status, 0)
        XCTAssertEqual(try ctl("add", "-s", "svc.a", "-a", "y", "-w", "2").status, 0)
        let list = try ctl("list")
        XCTAssertEqual(list.status, 0)
        let rows = list.stdout.split(separator: "\n").map(String.init)
        XCTAssertEqual(rows.count, 3)
        XCTAssertTrue(rows[0].hasPrefix("GROUP"))
        XCTAssertTrue(rows[1].hasPrefix("TEAM.shared") && rows[1].contains("svc.b"), rows[1])
        XCTAssertTrue(rows[2].hasPrefix("keychainctl") && rows[2].contains("svc.a"), rows[2])
        let column = rows[0].range(of: "SERVICE")!.lowerBound.utf16Offset(in: rows[0])
        XCTAssertEqual(rows[1].range(of: "svc.b")!.lowerBound.utf16Offset(in: rows[1]), column, "aligned columns")
        let only = try XCTUnwrap(try json(ctl("list", "-g", "TEAM.shared", "--json").stdout) as? [[String: Any]])
        XCTAssertEqual(only.map { $0["svce"] as? String }, ["svc.b"])
        // The app sees its group's item through the library too.
        KeychainConnection.shared.retarget(socketPath: daemon.socketPath)
        defer { KeychainConnection.shared.retarget(socketPath: nil) }
        XCTAssertEqual(try Keychain(service: "svc.b", accessGroup: "TEAM.shared").string(forKey: "x"), "1")
    }

    func testDeviceID() throws {
        let first = try ctl("device-id")
        XCTAssertEqual(first.status, 0, first.stderr)
        XCTAssertNotNil(UUID(uuidString: first.stdout.trimmingCharacters(in: .newlines)))
        XCTAssertEqual(try ctl("device-id").stdout, first.stdout)
        let shared = try XCTUnwrap(try json(ctl("device-id", "-g", "TEAM.shared", "--json").stdout) as? [String: Any])
        XCTAssertEqual(shared["accessGroup"] as? String, "TEAM.shared")
        XCTAssertNotEqual((shared["deviceId"] as? String).map { $0 + "\n" }, first.stdout)
        let own = try XCTUnwrap(try json(ctl("device-id", "--json").stdout) as? [String: Any])
        XCTAssertEqual(own["accessGroup"] as? String, "keychainctl", "the CLI's first group")
        KeychainConnection.shared.retarget(socketPath: daemon.socketPath)
        defer { KeychainConnection.shared.retarget(socketPath: nil) }
        XCTAssertEqual(
            try DeviceIdentifier.current(accessGroup: "TEAM.shared").uuidString, shared["deviceId"] as? String)
    }

    func testStatus() throws {
        let human = try ctl("status")
        XCTAssertEqual(human.status, 0, human.stderr)
        for expected in [
            "daemon", "keychaind", "state", "passphrase", "items", "socket", daemon.socketPath, "caller",
            "keychainctl (admin)",
        ] {
            XCTAssertTrue(human.stdout.contains(expected), "\(expected) in \(human.stdout)")
        }
        let s = try XCTUnwrap(try json(ctl("status", "--json").stdout) as? [String: Any])
        XCTAssertNotNil(s["version"] as? String)
        XCTAssertNotNil(s["locked"] as? Bool)
        XCTAssertEqual(s["admin"] as? Bool, true)
        XCTAssertEqual(s["socket"] as? String, daemon.socketPath)
    }

    /// lock / unlock / passwd / backup / restore. Until the daemon implements them (issue 5) they answer
    /// errSecUnimplemented, which must come out as exit status 252 with the one-line error.
    func testAdminVerbs() throws {
        let pass = daemon.root + "/pass"
        let newPass = daemon.root + "/newpass"
        let backupFile = daemon.root + "/backup.kcb"
        try "first passphrase\n".writeReplacing(pass)
        try "second passphrase\n".writeReplacing(newPass)
        let set = try ctl("passwd", "--new-passphrase-file", pass)
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try ctl("add", "-s", "com.example.locked", "-a", "a", "-w", "secret").status, 0)
        XCTAssertEqual(
            try ctl("add", "-s", "com.example.always", "-a", "a", "-w", "always", "--accessible", "dk").status, 0)
        XCTAssertEqual(try ctl("--json", "lock").stdout, "{\"ok\":true}\n")
        XCTAssertEqual((try json(ctl("status", "--json").stdout) as? [String: Any])?["locked"] as? Bool, true)
        assertFailure(
            try ctl("find", "-s", "com.example.locked", "-w"), errSecInteractionNotAllowed,
            "errSecInteractionNotAllowed")
        XCTAssertEqual(try ctl("find", "-s", "com.example.always", "-w").stdout, "always\n")
        assertFailure(try ctl("unlock", "--passphrase-file", newPass), errSecAuthFailed, "errSecAuthFailed")
        XCTAssertEqual(try ctl("unlock", "--passphrase-file", pass).status, 0)
        XCTAssertEqual(try ctl("find", "-s", "com.example.locked", "-w").stdout, "secret\n")
        XCTAssertEqual(try ctl("passwd", "--passphrase-file", pass, "--new-passphrase-file", newPass).status, 0)

        // While a passphrase is set, backup and restore also need the keychain passphrase (presence).
        assertFailure(
            try ctl("backup", backupFile, "--passphrase-file", pass, "--keychain-passphrase-file", pass),
            errSecAuthFailed, "errSecAuthFailed")
        let backup = try ctl(
            "backup", backupFile, "--passphrase-file", pass, "--keychain-passphrase-file", newPass, "--json")
        XCTAssertEqual(backup.status, 0, backup.stderr)
        let mode = try FileManager.default.attributesOfItem(atPath: backupFile)[.posixPermissions] as? Int
        XCTAssertEqual(mode, 0o600)
        XCTAssertEqual(try ctl("delete", "-s", "com.example.locked", "-a", "a").status, 0)
        let restored = try XCTUnwrap(
            try json(
                ctl(
                    "restore", backupFile, "--passphrase-file", pass, "--keychain-passphrase-file", newPass,
                    "--json"
                ).stdout) as? [String: Any])
        XCTAssertGreaterThanOrEqual(restored["restored"] as? Int ?? 0, 1)
        XCTAssertEqual(try ctl("find", "-s", "com.example.locked", "-w").stdout, "secret\n")
        XCTAssertNotEqual(
            try ctl("restore", backupFile, "--passphrase-file", newPass, "--keychain-passphrase-file", newPass).status,
            0,
            "wrong backup passphrase")
    }

    /// Without a passphrase the bundled keychainctl (a plain app, not an admin) registers an app in
    /// the user's apps.d: no approval is needed, keychaind reads the file at once (no signal), and
    /// register says whether it counts — the app's first connection is identified under it.
    func testRegisterWithoutAPassphraseSaysWhetherTheFileCounts() throws {
        let d = try DaemonHarness()
        let counted = try d.run(
            DaemonHarness.cliPath, ["register", "-i", "TEAM.env", "-g", "TEAM.env", "-e", "/usr/bin/env"])
        XCTAssertEqual(counted.status, 0, counted.stderr)
        XCTAssertTrue(counted.stdout.contains("keychaind counts it: groups TEAM.env"), counted.stdout)
        let apps = try d.run(DaemonHarness.cliPath, ["apps"])
        XCTAssertTrue(
            apps.stdout.split(separator: "\n").contains { $0.hasPrefix("TEAM.env") && $0.contains(" yes ") },
            apps.stdout)

        // The test runner is TEAM.tests already: a second registration of it is read, and refused.
        let taken = try d.run(
            DaemonHarness.cliPath,
            ["--json", "register", "-i", "TEAM.again", "-g", "TEAM.again", "-e", DaemonHarness.runnerExecutable])
        XCTAssertEqual(taken.status, 0, taken.stderr)
        let answer = try XCTUnwrap(try json(taken.stdout) as? [String: Any])
        XCTAssertEqual(answer["counts"] as? Bool, false, taken.stdout)
        let plain = try d.run(
            DaemonHarness.cliPath,
            ["register", "-i", "TEAM.again", "-g", "TEAM.again", "-e", DaemonHarness.runnerExecutable])
        XCTAssertTrue(
            plain.stdout.contains("does not count") && plain.stdout.contains("already registered"), plain.stdout)
        let partly = try d.run(
            DaemonHarness.cliPath,
            [
                "register", "-i", "TEAM.two", "-g", "TEAM.two", "-e", DaemonHarness.runnerExecutable, "-e",
                "/usr/bin/true",
            ])
        XCTAssertTrue(
            partly.stdout.contains("counts it, but not for every executable")
                && partly.stdout.contains("already registered"), partly.stdout)
        // One file named twice (the same path, or another path to it) is named once, not a conflict.
        let twice = try d.run(
            DaemonHarness.cliPath,
            ["register", "-i", "TEAM.id", "-g", "TEAM.id", "-e", "/usr/bin/id", "-e", "/usr/bin/../bin/id"])
        XCTAssertTrue(twice.stdout.contains("keychaind counts it: groups TEAM.id"), twice.stdout)
        XCTAssertEqual(try d.connect().call("status").result?.map?["caller"]?.text, "TEAM.tests")
        XCTAssertFalse(d.log.contains("why=SIGHUP"))
    }

    /// With a passphrase set, `register` approves what it wrote, and then says which executables
    /// keychaind still does not count it for (another registration holds them), as it does without.
    func testRegisterWithAPassphraseSaysWhichExecutablesDoNotCount() throws {
        let pass = daemon.root + "/pass"
        try "the pass\n".writeReplacing(pass)
        XCTAssertEqual(try ctl("passwd", "--new-passphrase-file", pass).status, 0)
        let first = try ctl(
            "register", "-i", "TEAM.first", "-g", "TEAM.first", "-e", "/usr/bin/false", "--keychain-passphrase-file",
            pass)
        XCTAssertEqual(first.status, 0, first.stderr)
        XCTAssertFalse(first.stdout.contains("does not count"), first.stdout)
        let second = try ctl(
            "register", "-i", "TEAM.second", "-g", "TEAM.second", "-e", "/usr/bin/false", "-e", "/usr/bin/true",
            "--keychain-passphrase-file", pass)
        XCTAssertEqual(second.status, 0, second.stderr)
        XCTAssertTrue(second.stdout.contains("approved TEAM.second"), second.stdout)
        XCTAssertTrue(
            second.stdout.contains(
                "keychaind does not count it for every executable: /usr/bin/false is already registered by"),
            second.stdout)
        let json = try XCTUnwrap(
            try json(ctl("--json", "approve", "TEAM.second", "--keychain-passphrase-file", pass).stdout)
                as? [String: Any])
        XCTAssertTrue((json["refused"] as? String)?.contains("/usr/bin/false") == true, "\(json)")
    }

    /// Without a terminal, a passphrase that is needed and not given is an error naming the options
    /// of the verb at hand (not -w or --stdin, which these verbs do not take); one for the keychain
    /// is errSecAuthFailed (exit 51), a new or backup one a usage error. An unlock with nothing to
    /// unlock asks for nothing.
    func testAPassphraseThatCannotBeAskedForNamesTheOptionsThatGiveIt() throws {
        let nothing = try ctl("unlock", stdin: "")
        XCTAssertEqual(nothing.status, 0, nothing.stderr)
        XCTAssertEqual(nothing.stdout, "no passphrase set: the keychain is always unlocked\n")
        let pass = daemon.root + "/pass"
        try "first passphrase\n".writeReplacing(pass)
        let set = try ctl("passwd", "--new-passphrase-file", pass)
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try ctl("lock").status, 0)
        func expect(
            _ r: (status: Int32, stdout: String, stderr: String), _ status: OSStatus, _ name: String, _ options: String
        ) {
            assertFailure(r, status, name)
            XCTAssertTrue(r.stderr.contains("give it with \(options), or run in a terminal"), r.stderr)
        }
        expect(
            try ctl("unlock", stdin: ""), errSecAuthFailed, "errSecAuthFailed", "--passphrase-file or --passphrase-fd")
        XCTAssertEqual(try ctl("unlock", "--passphrase-file", pass).status, 0)
        expect(
            try ctl("passwd", stdin: ""), errSecAuthFailed, "errSecAuthFailed", "--passphrase-file or --passphrase-fd")
        expect(
            try ctl("passwd", "--passphrase-file", pass, stdin: ""), errSecParam, "errSecParam",
            "--new-passphrase-file or --new-passphrase-fd")
        let file = daemon.root + "/b.kcb"
        expect(
            try ctl("backup", file, "--passphrase-file", pass, stdin: ""), errSecAuthFailed, "errSecAuthFailed",
            "--keychain-passphrase-file")
        expect(
            try ctl("backup", file, "--keychain-passphrase-file", pass, stdin: ""), errSecParam, "errSecParam",
            "--passphrase-file or --passphrase-fd")
        XCTAssertFalse(FileManager.default.fileExists(atPath: file))
    }

    /// A passphrase file is its first line; a file that is nothing but the passphrase (no newline,
    /// as `printf` writes it) means the same passphrase — it once became as many NUL bytes.
    func testAPassphraseFileWithoutANewlineIsThatPassphrase() throws {
        let bare = daemon.root + "/bare"
        let crlf = daemon.root + "/crlf"
        try "hunter2".writeReplacing(bare)
        try "backup pass\r\n".writeReplacing(crlf)
        let set = try ctl("passwd", "--new-passphrase-file", bare)
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try ctl("lock").status, 0)
        assertFailure(
            try ctl("unlock", "--passphrase-fd", "0", stdin: "\0\0\0\0\0\0\0\n"), errSecAuthFailed,
            "errSecAuthFailed")
        let typed = try ctl("unlock", "--passphrase-fd", "0", stdin: "hunter2\n")
        XCTAssertEqual(typed.status, 0, "the passphrase from a file without a newline: \(typed.stderr)")
        XCTAssertEqual(try ctl("add", "-s", "com.example.bare", "-a", "a", "-w", "kept").status, 0)
        let file = daemon.root + "/bare.kcb"
        let backup = try ctl("backup", file, "--passphrase-file", bare, "--keychain-passphrase-file", bare)
        XCTAssertEqual(backup.status, 0, backup.stderr)
        XCTAssertEqual(try ctl("delete", "-s", "com.example.bare", "-a", "a").status, 0)
        // The same passphrase given on a descriptor with a newline opens the backup.
        let restore = try ctl(
            "restore", file, "--passphrase-fd", "0", "--keychain-passphrase-file", bare, stdin: "hunter2\n")
        XCTAssertEqual(restore.status, 0, restore.stderr)
        XCTAssertEqual(try ctl("find", "-s", "com.example.bare", "-a", "a", "-w").stdout, "kept\n")
        // A line ending in CR LF is the line without either.
        let crlfSet = try ctl("passwd", "--passphrase-file", bare, "--new-passphrase-file", crlf)
        XCTAssertEqual(crlfSet.status, 0, crlfSet.stderr)
        XCTAssertEqual(try ctl("lock").status, 0)
        XCTAssertEqual(try ctl("unlock", "--passphrase-fd", "0", stdin: "backup pass\n").status, 0)
    }

    /// A passphrase on a descriptor is read before anything else, above all before the daemon is
    /// asked whether it is locked: a process of the user that stops the daemon could otherwise read
    /// it from a pipe of the user's through /proc/<keychainctl>/fd/N while keychainctl waits, dumpable
    /// again (pam_keychaind's is a socket, which cannot be opened that way). Here the daemon is
    /// stopped while keychainctl starts, and the pipe must be drained before it is resumed.
    func testAPassphraseOnADescriptorIsReadBeforeTheDaemonIsAsked() throws {
        XCTAssertEqual(try ctl("passwd", "--new-passphrase-fd", "0", stdin: "the pass\n").status, 0)
        XCTAssertEqual(try ctl("lock").status, 0)
        let daemonPID = try XCTUnwrap(daemon.process?.processIdentifier)
        let script = """
            import fcntl, json, os, signal, struct, subprocess, sys, termios, time
            kc, daemon = sys.argv[1], int(sys.argv[2])
            r, w = os.pipe()
            os.write(w, b"the pass\\n"); os.close(w)
            def waiting():
                return struct.unpack("i", fcntl.ioctl(r, termios.FIONREAD, b"\\0" * 4))[0]
            from kcwire import stop_process
            stop_process(daemon)
            try:
                p = subprocess.Popen([kc, "unlock", "--if-locked", "--passphrase-fd", str(r)], pass_fds=(r,))
                deadline = time.monotonic() + 60
                while waiting() > 0 and p.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                drained = waiting() == 0
            finally:
                os.kill(daemon, signal.SIGCONT)
            print(json.dumps({"drained": drained, "status": p.wait(60)}))
            """
        let out = try daemon.run(
            "/usr/bin/python3",
            ["-c", DaemonHarness.kcwireImportable + script, DaemonHarness.cliPath, String(daemonPID)])
        let result = try XCTUnwrap(try json(String(out.stdout.split(separator: "\n").last ?? "")) as? [String: Any])
        XCTAssertEqual(result["drained"] as? Bool, true, "read only once the daemon answered: \(out.stderr)")
        XCTAssertEqual(result["status"] as? Int, 0, out.stderr)
        let status = try XCTUnwrap(try json(try ctl("status", "--json").stdout) as? [String: Any])
        XCTAssertEqual(status["locked"] as? Bool, false, "unlocked with the passphrase it read")
    }

    /// --passphrase-fd / --new-passphrase-fd (how pam_keychaind hands over the login password, never
    /// on argv), and --if-set / --if-locked, which keep a login password that is not the keychain's
    /// passphrase from setting one or from counting as a failed unlock.
    func testPassphrasesFromADescriptorAndTheConditionalFlags() throws {
        func status() throws -> [String: Any] {
            try XCTUnwrap(try json(ctl("status", "--json").stdout) as? [String: Any])
        }
        let notSet = try ctl(
            "passwd", "--if-set", "--passphrase-fd", "0", "--new-passphrase-fd", "0", stdin: "old\nnew\n")
        XCTAssertEqual(notSet.status, 0, notSet.stderr)
        XCTAssertEqual(notSet.stdout, "no passphrase set: nothing to change\n")
        XCTAssertEqual(try status()["passphraseSet"] as? Bool, false, "--if-set never sets a first passphrase")
        XCTAssertEqual(
            try ctl("unlock", "--if-locked", "--passphrase-fd", "0", stdin: "anything\n").stdout,
            "not locked: nothing to unlock\n")

        let set = try ctl("passwd", "--new-passphrase-fd", "0", stdin: "first pass\n")
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try ctl("lock").status, 0)
        let unlocked = try ctl("unlock", "--if-locked", "--passphrase-fd", "0", "--json", stdin: "first pass\n")
        XCTAssertEqual(unlocked.status, 0, unlocked.stderr)
        XCTAssertEqual(try status()["locked"] as? Bool, false)
        // Already unlocked: a wrong passphrase is not even tried, so it is not counted.
        let skipped = try ctl("unlock", "--if-locked", "--passphrase-fd", "0", "--json", stdin: "wrong\n")
        XCTAssertEqual(skipped.stdout, "{\"ok\":true,\"unlocked\":false}\n")
        XCTAssertEqual(try status()["failedUnlocks"] as? Int, 0)

        // One descriptor, two lines: the current passphrase, then the new one.
        let changed = try ctl(
            "passwd", "--if-set", "--passphrase-fd", "0", "--new-passphrase-fd", "0", stdin: "first pass\nsecond pass\n"
        )
        XCTAssertEqual(changed.status, 0, changed.stderr)
        XCTAssertEqual(try ctl("lock").status, 0)
        assertFailure(
            try ctl("unlock", "--passphrase-fd", "0", stdin: "first pass\n"), errSecAuthFailed, "errSecAuthFailed")
        XCTAssertEqual(try ctl("unlock", "--passphrase-fd", "0", stdin: "second pass\r\n").status, 0)
        // A current passphrase that does not match changes nothing.
        assertFailure(
            try ctl("passwd", "--if-set", "--passphrase-fd", "0", "--new-passphrase-fd", "0", stdin: "nope\nthird\n"),
            errSecAuthFailed, "errSecAuthFailed")
        XCTAssertEqual(try ctl("lock").status, 0)
        XCTAssertEqual(try ctl("unlock", "--passphrase-fd", "0", stdin: "second pass\n").status, 0)

        assertFailure(try ctl("unlock", "--passphrase-fd", "zero"), errSecParam, "errSecParam")
        assertFailure(try ctl("unlock", "--passphrase-fd", "-1"), errSecParam, "errSecParam")
        assertFailure(
            try ctl("unlock", "--passphrase-fd", "0", "--passphrase-file", "/dev/null"), errSecParam, "errSecParam")
        assertFailure(
            try ctl("passwd", "--new-passphrase-fd", "0", "--new-passphrase-file", "/dev/null"), errSecParam,
            "errSecParam")
        assertFailure(try ctl("lock", "--if-locked"), errSecParam, "errSecParam")
        XCTAssertEqual(try ctl("lock").status, 0)
        let closed = try ctl("unlock", "--passphrase-fd", "987")
        assertFailure(closed, errSecParam, "errSecParam")
        XCTAssertTrue(closed.stderr.contains("descriptor 987"), closed.stderr)
    }
}
