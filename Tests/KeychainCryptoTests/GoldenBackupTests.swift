import KeychainCore
import KeychainCrypto
import KeychainSystem
import KeychainTestSupport
import Testing

/// The backup format as an earlier keychaind wrote it (Tests/Golden/README.md) keeps opening, and the
/// primitives under it keep their promises.
@Suite struct GoldenBackupTests {
    static func secure(_ text: String) -> SecureBytes {
        Array(text.utf8).withUnsafeBytes { SecureBytes(copying: $0) }
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
            found[account] = (String(decoding: item.secret, as: UTF8.self), item.attributes["pdmn"]?.text)
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

    @Test func aeadOpensWhatItSealedAndNothingElse() throws {
        let key = SecureBytes(random: AEAD.keyBytes)
        let other = SecureBytes(random: AEAD.keyBytes)
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
