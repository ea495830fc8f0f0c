import Foundation
import XCTest

/// A passphrase handed to keychainctl on a descriptor (`--passphrase-fd`, as pam_keychaind's helper
/// does with the login password), attacked by another process of the same uid while keychainctl
/// waits to read it: keychaind and keychainctl as a throwaway uid, the attacker that uid too.
final class PassphraseDescriptorAttackTests: XCTestCase {
    /// keychainctl is started with the read end of a pipe the attacker made (the worst case: a pipe
    /// is what a process of the user can open again through /proc/<pid>/fd/N, and this one is the
    /// user's) and nothing written yet. While it waits to read, it is non-dumpable: its /proc files
    /// belong to root and opening /proc/<keychainctl>/fd/N is refused. Once the line is written it
    /// unlocks — which takes keychaind identifying it through /proc/<pid>/exe, so it is dumpable
    /// again by then.
    func testADescriptorHoldingThePassphraseCannotBeOpenedThroughProc() throws {
        let s = try UserSession()
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        let pass = try s.privateFile("pass", "correct horse\n")
        let set = try s.run(s.adminCLIPath, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(set.status, 0, set.stderr)
        XCTAssertEqual(try s.run(s.adminCLIPath, ["lock"]).status, 0)

        let result = try s.script(
            """
            import errno, json, os, subprocess, sys, time
            kc, sock = sys.argv[1], sys.argv[2]
            r, w = os.pipe()
            p = subprocess.Popen([kc, "--socket", sock, "unlock", "--passphrase-fd", str(r)], pass_fds=(r,))
            os.close(r)
            proc = f"/proc/{p.pid}"
            def hidden():
                # A non-dumpable process's /proc files (not its /proc/<pid> directory) are root's.
                return os.stat(proc + "/fd").st_uid == 0
            def reading():
                # Blocked in read(2) on the pipe (readable only while keychainctl is dumpable).
                try:
                    f = open(proc + "/syscall").read().split()
                except OSError:
                    return False
                return len(f) > 1 and f[0] == "0" and int(f[1], 16) == r
            deadline = time.monotonic() + 120
            while not (hidden() or reading()) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            result = {"hidden": hidden()}
            try:
                fd = os.open(f"{proc}/fd/{r}", os.O_RDONLY | os.O_NONBLOCK)
                result["reopened"] = "opened"
                os.close(fd)
            except OSError as e:
                result["reopened"] = errno.errorcode[e.errno]
            os.write(w, b"correct horse\\n")
            result["status"] = p.wait(120)
            print(json.dumps(result))
            """, [s.cliPath, s.socketPath])
        XCTAssertEqual(result["hidden"] as? Bool, true, "non-dumpable while it waits to read: \(result)")
        XCTAssertEqual(result["reopened"] as? String, "EACCES", "the attacker opened its descriptor: \(result)")
        XCTAssertEqual(result["status"] as? Int, 0, "identified and unlocked once it read the line: \(result)")
        let status = try s.run(s.adminCLIPath, ["status", "--json"])
        XCTAssertTrue(status.stdout.contains("\"locked\":false"), status.stdout)
    }
}
