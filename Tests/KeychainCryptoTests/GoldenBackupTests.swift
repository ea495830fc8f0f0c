import KeychainCore
import KeychainCrypto
import KeychainSystem
import KeychainTestSupport
import Testing

/// The backup format as an earlier keychaind wrote it (Tests/Golden/README.md) keeps opening, and the
/// primitives under it keep their promises.
@Suite struct GoldenBackupTests {
    static func secure(_ text: String) throws(KeychainError) -> SecureBytes {
        let bytes = Array(text.utf8)
        return try SecureBytes(count: bytes.count) { out in bytes.withUnsafeBytes { out.copyMemory(from: $0) } }
    }

    @Test func theGoldenBackupOpensWithItsItemsAttributesAndSecrets() throws {
        let file = try Golden.bytes("backup-v1.kcbackup")
        let contents = try BackupFile.open(file, passphrase: Self.secure("golden backup passphrase"))
        #expect(contents.metadata["format"] == .text("keychaind-backup"))
        #expect(contents.metadata["items"] == .int(3))
        #expect(contents.parameters.opsLimit == KDFProfile.interactive.opsLimit)
        var found: [String: (String, String?)] = [:]
        for item in contents.items {
            let account = String(
                decoding: item.attributes["acct"]?.bytes ?? Array((item.attributes["acct"]?.text ?? "").utf8),
                as: UTF8.self)
            found[account] = (
                String(decoding: item.secret.unprotectedArray, as: UTF8.self), item.attributes["pdmn"]?.text
            )
            #expect(item.attributes["agrp"] == .text("GOLDEN.app"))
            #expect(item.ref.count == 16)
        }
        #expect(found["alice"]?.0 == "golden secret (ak)" && found["alice"]?.1 == "ak")
        #expect(found["bob"]?.0 == "golden secret (ck)" && found["bob"]?.1 == "ck")
        #expect(found["carol"]?.0 == "golden secret (dk)" && found["carol"]?.1 == "dk")
        #expect(found["dave"] == nil)  // ThisDeviceOnly items are never backed up
        let alice = try #require(contents.items.first { $0.attributes["labl"] != nil })
        #expect(
            alice.attributes["labl"] == .text("Golden label")
                || alice.attributes["labl"] == .bytes(Array("Golden label".utf8)))
    }

    @Test func theGoldenBackupRefusesAWrongPassphraseAndAnyChangedByte() throws {
        let file = try Golden.bytes("backup-v1.kcbackup")
        #expect(throws: KeychainError.self) { try BackupFile.open(file, passphrase: Self.secure("not the passphrase")) }
        do {
            _ = try BackupFile.open(file, passphrase: Self.secure("not the passphrase"))
        } catch {
            #expect(error.status == .authFailed)
        }
        var damaged = file
        damaged[damaged.count - 5] ^= 0x01
        do {
            _ = try BackupFile.open(damaged, passphrase: Self.secure("golden backup passphrase"))
            Issue.record("a changed byte was accepted")
        } catch {
            #expect(error.status == .decode)
        }
    }

    /// The backup of keychain-v2-gcm (a keychain of AES-256-GCM rows, passphrase set): the five items
    /// of the classes a backup carries, with their attributes, the large secret and the non-ASCII
    /// service, account and secret byte for byte.
    @Test func theGoldenGCMKeychainsBackupOpensWithItsItemsAttributesAndSecrets() throws {
        let file = try Golden.bytes("backup-v2-gcm.kcbackup")
        let contents = try BackupFile.open(file, passphrase: Self.secure("golden gcm backup passphrase"))
        #expect(contents.metadata["format"] == .text("keychaind-backup"))
        #expect(contents.metadata["items"] == .int(5) && contents.metadata["damaged"] == .int(0))
        #expect(contents.metadata["classes"] == .array([.text("ak"), .text("ck"), .text("dk")]))
        #expect(contents.parameters.opsLimit == KDFProfile.interactive.opsLimit)
        #expect(contents.parameters.memLimit == KDFProfile.interactive.memLimit)
        let large = (1...64).map { "line \($0) of the golden large secret" }.joined(separator: "\n")
        let nonASCII = ("g\u{F6}lden.s\u{E9}rvice", "\u{F1}and\u{FA} \u{2713} \u{9375}")
        let expected: [String: (service: String, protection: String, secret: String)] = [
            "alice": ("golden.service", "ak", "golden gcm secret (ak)"),
            "bob": ("golden.service", "ck", "golden gcm secret (ck)"),
            "carol": ("golden.service", "dk", "golden gcm secret (dk)"),
            "large": ("golden.service", "ck", large),
            nonASCII.1: (nonASCII.0, "dk", "s\u{E9}cret \u{2713} \u{1F511}"),
        ]
        #expect(contents.items.count == expected.count)
        var seen: Set<String> = []
        for item in contents.items {
            let account = try #require(item.attributes["acct"]?.text)
            let want = try #require(expected[account], "an item that should not be there: \(account)")
            seen.insert(account)
            #expect(item.attributes["svce"] == .text(want.service), "\(account)")
            #expect(item.attributes["pdmn"] == .text(want.protection), "\(account)")
            #expect(item.attributes["agrp"] == .text("GOLDEN.app"), "\(account)")
            #expect(item.secret.unprotectedArray == Array(want.secret.utf8), "\(account)")
            #expect(item.ref.count == 16)
        }
        #expect(seen == Set(expected.keys), "ThisDeviceOnly items (dave, erin, frank, grace) are never backed up")
        let alice = try #require(contents.items.first { $0.attributes["acct"] == .text("alice") })
        #expect(alice.attributes["labl"] == .text("Golden GCM label"))
        #expect(alice.attributes["icmt"] == .text("golden comment"))
        #expect(alice.attributes["desc"] == .text("golden description"))
    }

    @Test func theGoldenGCMKeychainsBackupRefusesAWrongPassphraseAndAnyChangedByte() throws {
        let file = try Golden.bytes("backup-v2-gcm.kcbackup")
        for passphrase in ["golden keychain passphrase", "golden gcm backup passphrasE"] {
            #expect(
                failure { try BackupFile.open(file, passphrase: Self.secure(passphrase)) }?.status == .authFailed,
                "\(passphrase)")
        }
        // A byte of the header (the salt) or of the metadata record cannot be told from a wrong
        // passphrase (both fail record 0): errSecAuthFailed. A byte of an item record or of the final
        // record is damage: errSecDecode.
        let expected: [(index: Int, status: Status)] = [
            (30, .authFailed), (BackupFile.headerBytes + 10, .authFailed), (file.count / 2, .decode),
            (file.count - 5, .decode),
        ]
        for (index, status) in expected {
            var damaged = file
            damaged[index] ^= 0x01
            let refused = failure {
                try BackupFile.open(damaged, passphrase: Self.secure("golden gcm backup passphrase"))
            }
            #expect(refused?.status == status, "byte \(index)")
        }
    }

    @Test func aeadOpensWhatItSealedAndNothingElse() throws {
        let key = try SecureBytes(random: AEAD.keyBytes)
        let other = try SecureBytes(random: AEAD.keyBytes)
        let plain = Array("secret bytes".utf8)
        let ad = Array("row 1".utf8)
        let sealed = key.withUnsafeBytes { k in ad.withUnsafeBytes { AEAD.seal(plain, key: k, ad: $0) } }
        #expect(sealed.count == plain.count + AEAD.overhead)
        let opened = try key.withUnsafeBytes { (k) throws(KeychainError) in
            try withBytes(ad) { (a) throws(KeychainError) in try AEAD.openSecret(sealed, key: k, ad: a, what: "test") }
        }
        #expect(opened == SecretBytes(plain))
        for (k, a) in [(other, ad), (key, Array("row 2".utf8))] {
            #expect(throws: KeychainError.self) {
                try k.withUnsafeBytes { (kb) throws(KeychainError) in
                    try withBytes(a) { (ab) throws(KeychainError) in
                        _ = try AEAD.open(sealed, key: kb, ad: ab, what: "test")
                    }
                }
            }
        }
    }

    @Test func constantTimeEqualityComparesWholeBuffers() {
        #expect(Sodium.equal([1, 2, 3], [1, 2, 3]))
        #expect(!Sodium.equal([1, 2, 3], [1, 2, 4]))
        #expect(!Sodium.equal([1, 2, 3], [1, 2]))
        #expect(Sodium.equal([], []))
    }
}

/// The error a call throws (nil when it returns).
private func failure(_ body: () throws -> Any?) -> KeychainError? {
    do {
        _ = try body()
        return nil
    } catch let error as KeychainError { return error } catch {
        return KeychainError(.internal, "unexpected error type \(type(of: error))")
    }
}
