import Foundation
import XCTest

/// What `device.key` reveals (docs/security.md §3), tried for real: keychaind as a throwaway uid, the
/// attacker a process of that same uid that reads `device.key` and copies the database, then checks
/// guesses of an item's group, service and account offline against the index columns, with the key
/// the keyring wraps under the device key. With a passphrase set, the items of classes that need it
/// must be confirmable by nothing; and the daemon must still answer lookups while locked as Apple's.
final class BlindIndexAttackTests: XCTestCase {
    /// The attacker: reads the files, unwraps the keyring's "index" entry with the device key
    /// (XChaCha20-Poly1305, decrypted here in plain Python: HChaCha20, then the ChaCha20 keystream
    /// from block 1; the tag is not checked — wrong bytes would only confirm nothing, and the check
    /// without a passphrase shows they are right), computes the digests keychaind's blind index would
    /// store for each guess (KeychainCrypto/KeyedHash.swift) and says which are in the copied
    /// database. argv: data directory, then JSON guesses [[group, service, account], …]. Prints
    /// {"confirmed": [[what…] per guess]}.
    static let attacker = """
        import hashlib, json, os, shutil, sqlite3, struct, sys, tempfile
        import kcwire as kw
        M = 0xffffffff
        SIGMA = [0x61707865, 0x3320646e, 0x79622d32, 0x6b206574]
        def rotl(v, c): return ((v << c) & M) | (v >> (32 - c))
        def qr(s, a, b, c, d):
            s[a] = (s[a] + s[b]) & M; s[d] = rotl(s[d] ^ s[a], 16)
            s[c] = (s[c] + s[d]) & M; s[b] = rotl(s[b] ^ s[c], 12)
            s[a] = (s[a] + s[b]) & M; s[d] = rotl(s[d] ^ s[a], 8)
            s[c] = (s[c] + s[d]) & M; s[b] = rotl(s[b] ^ s[c], 7)
        def rounds(s):
            for _ in range(10):
                qr(s, 0, 4, 8, 12); qr(s, 1, 5, 9, 13); qr(s, 2, 6, 10, 14); qr(s, 3, 7, 11, 15)
                qr(s, 0, 5, 10, 15); qr(s, 1, 6, 11, 12); qr(s, 2, 7, 8, 13); qr(s, 3, 4, 9, 14)
        def hchacha(key, n):
            s = SIGMA + list(struct.unpack('<8I', key)) + list(struct.unpack('<4I', n))
            rounds(s)
            return struct.pack('<8I', *(s[0:4] + s[12:16]))
        def block(key, counter, nonce):
            s = SIGMA + list(struct.unpack('<8I', key)) + [counter] + list(struct.unpack('<3I', nonce))
            w = list(s)
            rounds(w)
            return struct.pack('<16I', *[(a + b) & M for a, b in zip(w, s)])
        def xdecrypt(key, box, length):
            n = box[:24]
            stream = block(hchacha(key, n[:16]), 1, b'\\0' * 4 + n[16:])
            return bytes(a ^ b for a, b in zip(box[24:24 + length], stream))
        def kh(key, domain, parts, size):
            h = hashlib.blake2b(key=key, digest_size=size)
            h.update(bytes([domain]))
            for p in parts:
                h.update(struct.pack('<Q', len(p))); h.update(p)
            return h.digest()
        data, guesses = sys.argv[1], json.loads(sys.argv[2])
        device_key = open(os.path.join(data, 'device.key'), 'rb').read()
        copy = tempfile.mkdtemp()
        for name in ('keychain.db', 'keychain.db-wal'):
            if os.path.exists(os.path.join(data, name)):
                shutil.copy(os.path.join(data, name), os.path.join(copy, name))
        db = sqlite3.connect(os.path.join(copy, 'keychain.db'))
        keyring = kw.decode(db.execute("SELECT value FROM meta WHERE name = 'keyring'").fetchone()[0])
        columns = set()
        for row in db.execute('SELECT agrp_ix, svce_ix, acct_ix, key_ix FROM items'):
            columns.update(bytes(c) for c in row)
        kek = kh(device_key, 0xD0, [b'keychaind device-kek v1'], 32)
        index = xdecrypt(kek, keyring['index'], 32)
        confirmed = []
        for g, s, a in guesses:
            g, s, a = g.encode(), s.encode(), a.encode()
            found = [what for what, digest in (
                ('group', kh(index, 1, [g], 16)), ('service', kh(index, 2, [s], 16)),
                ('account', kh(index, 3, [a], 16)), ('uniqueness key', kh(index, 4, [g, s, a, b'\\0'], 32)))
                if digest in columns]
            confirmed.append(found)
        print(json.dumps({'confirmed': confirmed}))
        """

    static let app1Client =
        IsolationAttackTests.client + """
            def add(account, pdmn, secret):
                return show(call('add', query=kw.item('bank.example', account, v_Data=secret.encode(), agrp='TEAM.shared', pdmn=pdmn)))
            def get(account):
                return show(call('copy', query=kw.item('bank.example', account, r_Data=True, agrp='TEAM.shared')))

            """

    func app1(_ s: UserSession, _ app: String, _ code: String) throws -> [String: Any] {
        try s.script(Self.app1Client + code, interpreter: app)
    }

    func confirmed(_ s: UserSession, _ guesses: [[String]]) throws -> [[String]] {
        let json = String(decoding: try JSONSerialization.data(withJSONObject: guesses), as: UTF8.self)
        let out = try s.script(Self.attacker, [s.dataDirectory, json])
        return try XCTUnwrap(out["confirmed"] as? [[String]], "\(out)")
    }

    func status(_ r: [String: Any]) -> Int? { r["status"] as? Int }

    /// Before a passphrase the guesses about a ck item are confirmed (nothing is private against
    /// device.key then: this shows the attacker computes what keychaind stores). Once one is set, no
    /// guess about an item of a passphrase class is confirmed, the item added before it included;
    /// while locked after the first unlock, the daemon answers as Apple's; after a restart, before
    /// the first unlock, a ck item is errSecInteractionNotAllowed and a dk item is found.
    func testDeviceKeyAndACopyOfTheDatabaseConfirmNoGuessOfAPassphraseClassItem() throws {
        let s = try UserSession()
        let app = try s.makeApp("app1")
        try s.registerSystem(
            .init(id: "TEAM.app1", groups: ["TEAM.app1", "TEAM.shared"], executables: [app]), name: "app1")
        try s.registerSystem(
            .init(id: "keychainctl", groups: ["keychainctl"], executables: [s.adminCLIPath], admin: true),
            name: "keychainctl")
        try s.start()
        XCTAssertEqual(status(try app1(s, app, "print(json.dumps(add('alice', 'ck', 'a')))")), 0)
        let alice = ["TEAM.shared", "bank.example", "alice"]
        XCTAssertEqual(
            try confirmed(s, [alice]), [["group", "service", "account", "uniqueness key"]],
            "without a passphrase the attacker's digests are keychaind's")

        let pass = try s.privateFile("pass", "correct horse\n")
        let set = try s.run(s.adminCLIPath, ["passwd", "--new-passphrase-file", pass])
        XCTAssertEqual(set.status, 0, set.stderr)
        let added = try app1(
            s, app,
            "print(json.dumps({'bob': add('bob', 'cku', 'b'), 'carol': add('carol', 'ak', 'c'), 'dave': add('dave', 'dk', 'd')}))"
        )
        for name in ["bob", "carol", "dave"] { XCTAssertEqual(status(added[name] as? [String: Any] ?? [:]), 0) }
        XCTAssertEqual(try s.run(s.adminCLIPath, ["lock"]).status, 0)
        let guesses = [alice, ["TEAM.shared", "bank.example", "bob"], ["TEAM.shared", "bank.example", "carol"]]
        XCTAssertEqual(try confirmed(s, guesses), [[], [], []], "device.key confirms guesses about locked items")

        // Locked after the first unlock: Apple's answers.
        let locked = try app1(
            s, app,
            "print(json.dumps({'alice': get('alice'), 'carol': get('carol'), 'dave': get('dave'), 'none': get('nobody')}))"
        )
        XCTAssertEqual((locked["alice"] as? [String: Any])?["result"] as? String, "a", "\(locked)")
        XCTAssertEqual((locked["dave"] as? [String: Any])?["result"] as? String, "d", "\(locked)")
        XCTAssertEqual(status(locked["carol"] as? [String: Any] ?? [:]), -25308, "\(locked)")
        XCTAssertEqual(status(locked["none"] as? [String: Any] ?? [:]), -25300, "\(locked)")

        // A restart: before the first unlock only the Always items can be found.
        s.stop()
        try s.start()
        let before = try app1(
            s, app, "print(json.dumps({'alice': get('alice'), 'dave': get('dave'), 'none': get('nobody')}))")
        XCTAssertEqual(status(before["alice"] as? [String: Any] ?? [:]), -25308, "\(before)")
        XCTAssertEqual((before["dave"] as? [String: Any])?["result"] as? String, "d", "\(before)")
        XCTAssertEqual(status(before["none"] as? [String: Any] ?? [:]), -25308, "\(before)")
        XCTAssertEqual(try s.run(s.adminCLIPath, ["unlock", "--passphrase-file", pass]).status, 0)
        let after = try app1(
            s, app, "print(json.dumps({'alice': get('alice'), 'bob': get('bob'), 'carol': get('carol')}))")
        XCTAssertEqual((after["alice"] as? [String: Any])?["result"] as? String, "a", "\(after)")
        XCTAssertEqual((after["bob"] as? [String: Any])?["result"] as? String, "b", "\(after)")
        XCTAssertEqual((after["carol"] as? [String: Any])?["result"] as? String, "c", "\(after)")
    }
}
