import Foundation
import XCTest

/// Who can keep the keychain unlocked (docs/security.md §2, "Successful requests keep the keychain
/// unlocked"), run for real: keychaind as a throwaway uid with a passphrase set, the "attacker" as
/// that same uid. Failing requests do not count as activity for `autoLockSeconds`, and
/// `maxUnlockedSeconds` locks whatever the activity. Every wait is for the lock itself (status
/// polled until it says locked).
final class AutoLockAttackTests: XCTestCase {
    static let passphrase = "correct horse"

    /// A session with the admin keychainctl registered root-owned, the passphrase set, unlocked.
    func session(_ settings: [String: Any]) throws -> (UserSession, pass: String) {
        var c = settings
        c["kdfProfile"] = "interactive"
        let json = String(decoding: try JSONSerialization.data(withJSONObject: c), as: UTF8.self)
        let s = try UserSession(config: json)
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        let pass = try s.privateFile("pass", Self.passphrase + "\n")
        let set = try s.run(s.adminCLIPath, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(set.status, 0, set.stderr)
        let unlock = try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass])
        XCTAssertEqual(unlock.status, 0, unlock.stderr)
        return (s, pass)
    }

    /// `keychainctl status --json`, asked by the admin (status requests never count as activity).
    func status(_ s: UserSession, as cli: String? = nil) throws -> [String: Any] {
        let out = try s.run(cli ?? s.adminCLIPath, ["--json", "status"])
        guard out.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(out.stdout.utf8)) as? [String: Any]
        else { throw HarnessError("status failed (\(out.status)): \(out.stdout) \(out.stderr)") }
        return object
    }

    /// Polls status until the keychain says it is locked, for at most the harness's event timeout.
    func waitUntilLocked(_ s: UserSession) throws -> Bool {
        let deadline = Date().addingTimeInterval(DaemonHarness.eventTimeout)
        repeat {
            if try status(s)["locked"] as? Bool == true { return true }
            usleep(50_000)
        } while Date() < deadline
        return try status(s)["locked"] as? Bool == true
    }

    /// Runs `keychainctl ARGS` as the session's uid in a loop (paced so it asks far more often than
    /// the lock would strike), appending each exit status to a file; stopped with the returned stop.
    func loop(_ s: UserSession, _ args: [String]) throws -> (statuses: () -> [String], stop: () -> Void) {
        let record = try s.privateFile("statuses", "")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments =
            s.setpriv + [
                "/bin/sh", "-c", #"while :; do "$@" >/dev/null 2>&1; echo $? >> "$0"; sleep 0.3; done"#, record,
                s.cliPath,
            ] + args
        p.environment = s.environment
        try p.run()
        let statuses = { () -> [String] in
            ((try? String(contentsOfFile: record, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }
        return (
            statuses,
            {
                kill(p.processIdentifier, SIGKILL)
                p.waitUntilExit()
            }
        )
    }

    // MARK: Failing requests

    /// The bundled keychainctl is an identified app; a `find` of an item that does not exist,
    /// repeated every 0.3 s, kept a 2-second auto-lock from ever striking. A failing request is not
    /// activity: the idle clock runs through it and the keychain locks with the loop still running.
    func testFailingRequestsOfAnIdentifiedAppDoNotPostponeAutoLock() throws {
        let (s, pass) = try session(["autoLockSeconds": 2])
        let who = try status(s, as: s.cliPath)
        XCTAssertEqual(who["caller"] as? String, "keychainctl", "the bundled CLI is an identified app: \(who)")

        // The attack: failing finds in a loop, started on a freshly unlocked keychain.
        let attack = try loop(s, ["find", "-s", "no.such.service", "-a", "nobody"])
        defer { attack.stop() }
        XCTAssertTrue(try s.waitForStatuses(attack.statuses, atLeast: 1), "the loop never ran")
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        let started = attack.statuses().count
        XCTAssertTrue(try waitUntilLocked(s), "failing finds kept the keychain unlocked:\n\(s.log)")
        attack.stop()
        let ran = attack.statuses()
        XCTAssertGreaterThan(ran.count, started, "the loop stopped before the lock")
        XCTAssertEqual(Set(ran), ["44"], "every find of the loop was answered errSecItemNotFound: \(ran)")
        XCTAssertTrue(s.log.contains("by=auto-lock"), s.log)
    }

    // MARK: The bound

    /// Successful requests do count as activity, so with `autoLockSeconds` alone an app that reads
    /// its item every 0.3 s keeps the keychain open; `maxUnlockedSeconds` locks it anyway, counted
    /// from the unlock, and `status` shows the bound.
    func testMaxUnlockedSecondsLocksWhateverTheActivity() throws {
        let (s, pass) = try session(["autoLockSeconds": 60, "maxUnlockedSeconds": 4])
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        let added = try s.run(s.cliPath, ["add", "-s", "svc", "-a", "alice", "-w", "s3cret"])
        XCTAssertEqual(added.status, 0, added.stderr)
        let shown = try status(s)
        XCTAssertEqual(shown["maxUnlockedSeconds"] as? Int, 4, "\(shown)")
        XCTAssertEqual(shown["autoLockSeconds"] as? Int, 60, "\(shown)")
        let human = try s.run(s.adminCLIPath, ["status"])
        XCTAssertTrue(human.stdout.contains("at most 4s unlocked"), human.stdout)

        let reader = try loop(s, ["find", "-s", "svc", "-a", "alice", "-w"])
        defer { reader.stop() }
        XCTAssertTrue(try s.waitForStatuses(reader.statuses, atLeast: 1), "the loop never ran")
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        XCTAssertTrue(try waitUntilLocked(s), "successful reads kept the keychain unlocked past the bound:\n\(s.log)")
        reader.stop()
        // Some read succeeded while it was unlocked (not necessarily the first: on a slow machine,
        // under ThreadSanitizer, the first unlock's bound can pass before the loop's first read).
        XCTAssertTrue(
            reader.statuses().contains("0"), "the reads succeeded while it was unlocked: \(reader.statuses())")
        XCTAssertTrue(s.log.contains("by=max-unlocked"), s.log)
        let locked = try s.run(s.cliPath, ["find", "-s", "svc", "-a", "alice", "-w"])
        XCTAssertNotEqual(locked.status, 0, "the item is unreadable once locked")
        // A right passphrase opens it again, for another bound.
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        let reopened = try status(s)
        XCTAssertEqual(reopened["locked"] as? Bool, false)
        XCTAssertNotNil(reopened["unlockedSeconds"] as? Double, "\(reopened)")
        XCTAssertEqual(try s.run(s.cliPath, ["find", "-s", "svc", "-a", "alice", "-w"]).stdout, "s3cret\n")
    }

    /// A bad value is refused with the file and the reason, at start and by --check-config.
    func testABadMaxUnlockedSecondsIsRefused() throws {
        for bad in [#"-1"#, #""8h""#, "true", "31536001"] {
            let s = try UserSession(config: #"{"maxUnlockedSeconds": \#(bad)}"#)
            for extra in [["--check-config"], []] {
                let out = try s.run(
                    s.daemonPath,
                    ["--socket", s.socketPath, "--data-dir", s.dataDirectory, "--config", s.configFile] + extra)
                XCTAssertEqual(out.status, 1, "\(bad) \(extra): \(out.stdout)")
                XCTAssertTrue(
                    out.stderr.contains(s.configFile)
                        && out.stderr.contains("\"maxUnlockedSeconds\" must be an integer from 0 to 31536000"),
                    "\(bad) \(extra): \(out.stderr)")
            }
        }
    }
}

extension UserSession {
    /// Waits (event timeout) until `statuses` lists at least `count` runs.
    fileprivate func waitForStatuses(_ statuses: () -> [String], atLeast count: Int) throws -> Bool {
        let deadline = Date().addingTimeInterval(DaemonHarness.eventTimeout)
        while statuses().count < count {
            guard Date() < deadline else { return false }
            usleep(20_000)
        }
        return true
    }
}
