import Foundation
import KeychainCore
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import Testing

@testable import KeychainCrypto
@testable import KeychainItems

/// Rows are sealed with AES-256-GCM where the CPU runs it and with XChaCha20-Poly1305 before that
/// (and on CPUs without AES-NI); a row says which by its sealed item key, and every row keeps opening
/// whichever construction sealed it.
@Suite struct ItemSealingTests {
    let key: SecureBytes

    init() throws { key = try SecureBytes(random: AEAD.keyBytes) }
    let ad: [UInt8] = Array("kc-test".utf8)

    /// Each construction opens its own boxes and refuses the other's, a changed byte and the wrong
    /// associated data.
    @Test func eachConstructionOpensOnlyItsOwnBoxes() throws {
        let plain = Array("the device UUID".utf8)
        let available = ItemSealing.allCases
        for sealing in available {
            let sealed = key.withUnsafeBytes { k in
                plain.withUnsafeBytes { p in ad.withUnsafeBytes { try! AEAD.seal(p, key: k, ad: $0, sealing: sealing) }
                }
            }
            #expect(sealed.count == plain.count + sealing.overhead)
            let opened = try key.withUnsafeBytes { (k) throws(KeychainError) in
                try withBytes(ad) { (a) throws(KeychainError) in
                    try AEAD.open(sealed, key: k, ad: a, what: "t", sealing: sealing)
                }
            }
            #expect(opened == plain)
            var flipped = sealed
            flipped[sealing.nonceBytes] ^= 1
            for (box, data) in [(flipped, ad), (sealed, ad + [0])] {
                let s = status {
                    try key.withUnsafeBytes { (k) throws(KeychainError) in
                        try withBytes(data) { (a) throws(KeychainError) in
                            try AEAD.open(box, key: k, ad: a, what: "t", sealing: sealing)
                        }
                    }
                }
                #expect(s == .decode, "\(sealing.name): a changed box or associated data must not open")
            }
            for other in available where other != sealing {
                let s = status {
                    try key.withUnsafeBytes { (k) throws(KeychainError) in
                        try withBytes(ad) { (a) throws(KeychainError) in
                            try AEAD.open(sealed, key: k, ad: a, what: "t", sealing: other)
                        }
                    }
                }
                #expect(s == .decode, "a \(sealing.name) box opened as \(other.name)")
            }
        }
    }

    /// A sealed item key names its construction by its layout: 72 bytes for XChaCha20-Poly1305, the tag
    /// byte 2 and 60 bytes for AES-256-GCM; anything else is no construction (a damaged row).
    @Test func aSealedItemKeyNamesItsConstruction() {
        let itemKey = [UInt8](repeating: 7, count: AEAD.keyBytes)
        for sealing in ItemSealing.allCases {
            let sealed = key.withUnsafeBytes { k in
                itemKey.withUnsafeBytes { ik in
                    ad.withUnsafeBytes { try! AEAD.sealKey(ik, key: k, ad: $0, sealing: sealing) }
                }
            }
            #expect(sealed.count == sealing.sealedKeyBytes)
            #expect(ItemSealing(sealedItemKey: sealed) == sealing)
        }
        #expect(ItemSealing.xchacha20Poly1305.sealedKeyBytes == 72 && ItemSealing.aes256GCM.sealedKeyBytes == 61)
        #expect(ItemSealing(sealedItemKey: [1] + [UInt8](repeating: 0, count: 60)) == nil)
        #expect(ItemSealing(sealedItemKey: [UInt8](repeating: 2, count: 60)) == nil)
        #expect(ItemSealing(sealedItemKey: []) == nil)
    }

    /// New rows are sealed with the machine's preferred construction (AES-256-GCM with AES-NI).
    @Test func newRowsUseThePreferredConstruction() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            for code in allCodes { try fx.add("svc", code, secret: "s-" + code, pdmn: code) }
            for row in try fx.rawColumns() {
                #expect(ItemSealing(sealedItemKey: row.itemKey) == .preferred)
            }
            for code in allCodes { #expect(try fx.secret("svc", code) == "s-" + code) }
        }
    }

    /// A keychain written with XChaCha20-Poly1305 (every keychain before AES-256-GCM) opens with the
    /// current code: every secret and attribute reads, an updated row is sealed anew with the preferred
    /// construction, and a passphrase change re-wraps every row's item key in the construction the
    /// row already has (its secret and attributes are sealed with it), after which all of them still read.
    @Test func rowsSealedWithXChaChaKeepOpeningThroughUpdatesAndPassphraseChanges() throws {
        try withProtectedKeychain(sealing: .xchacha20Poly1305) { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            for code in allCodes { try fx.add("svc", "old-" + code, secret: "o-" + code, pdmn: code) }
            #expect(try fx.rawColumns().allSatisfy { ItemSealing(sealedItemKey: $0.itemKey) == .xchacha20Poly1305 })

            try fx.reopen()
            try fx.service.unlock(passphrase: pass("one"))
            for code in allCodes { #expect(try fx.secret("svc", "old-" + code) == "o-" + code) }
            let listed =
                try fx.service.copyMatching(
                    ["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true)],
                    caller: Fixture.app)?.array ?? []
            #expect(Set(listed.compactMap { $0.map?["acct"]?.text }) == Set(allCodes.map { "old-" + $0 }))

            for code in allCodes { try fx.add("svc", "new-" + code, secret: "n-" + code, pdmn: code) }
            try fx.service.update(query("svc", "old-ck"), attributes: ["v_Data": bytes("changed")], caller: Fixture.app)
            let sealings = Dictionary(uniqueKeysWithValues: try fx.rawColumns().map { ($0.ref, $0.itemKey) })
            func sealing(of account: String) throws -> ItemSealing? {
                var q = query("svc", account)
                q["r_PersistentRef"] = .bool(true)
                let ref = try #require(try fx.service.copyMatching(q, caller: Fixture.app)?.bytes)
                let id = try #require(PersistentRef.id(from: ref))
                return ItemSealing(sealedItemKey: try #require(sealings[id]))
            }
            #expect(try sealing(of: "old-ck") == .preferred, "an update seals the row anew")
            #expect(try sealing(of: "old-ak") == .xchacha20Poly1305, "a row nobody wrote keeps its construction")
            #expect(try sealing(of: "new-ak") == .preferred)

            let before = try fx.rawColumns()
            try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            let after = try fx.rawColumns()
            for (b, a) in zip(before, after) {
                #expect(ItemSealing(sealedItemKey: a.itemKey) == ItemSealing(sealedItemKey: b.itemKey))
                #expect(a.secret == b.secret && a.attributes == b.attributes)
            }
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("two"))
            for code in allCodes {
                #expect(try fx.secret("svc", "old-" + code) == (code == "ck" ? "changed" : "o-" + code))
                #expect(try fx.secret("svc", "new-" + code) == "n-" + code)
            }
        }
    }

    /// On a machine without AES-NI, libgcrypt runs AES-256-GCM for the whole item path: GCM rows are
    /// read, updated, added and re-wrapped by a passphrase change through it, and everything it wrote
    /// reads back through libsodium afterwards (the two libraries are interchangeable on disk).
    @Test func gcmRowsGoThroughLibgcryptAsOnAMachineWithoutAESNI() throws {
        try withProtectedKeychain(sealing: .aes256GCM) { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            for code in allCodes { try fx.add("svc", code, secret: "s-" + code, pdmn: code) }
            try AEAD.withLibgcryptForGCM { () throws in
                try fx.reopen(sealing: .aes256GCM)
                try fx.service.unlock(passphrase: pass("one"))
                for code in allCodes { #expect(try fx.secret("svc", code) == "s-" + code) }
                try fx.service.update(
                    query("svc", "ck"), attributes: ["v_Data": bytes("changed")], caller: Fixture.app)
                try fx.add("svc", "through-libgcrypt", secret: "new", pdmn: "ak")
                try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            }
            try fx.reopen(sealing: .aes256GCM)
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("two"))
            #expect(try fx.rawColumns().allSatisfy { ItemSealing(sealedItemKey: $0.itemKey) == .aes256GCM })
            for code in allCodes {
                #expect(try fx.secret("svc", code) == (code == "ck" ? "changed" : "s-" + code))
            }
            #expect(try fx.secret("svc", "through-libgcrypt") == "new")
        }
    }

    /// A GCM row's layout, spelled out here by hand rather than through ItemCodec: the item key is the
    /// byte 2 ‖ nonce (12) ‖ ciphertext ‖ tag under the class key, with associated data "kc2" ‖ ref ‖
    /// class ‖ "K" ‖ key_ix; the attributes and the secret are nonce (12) ‖ ciphertext ‖ tag under the
    /// item key, with "kc2" ‖ ref ‖ class ‖ "A" or "S". Rows written today must open the same way later.
    @Test func aGCMRowHasTheDocumentedLayout() throws {
        try withProtectedKeychain(sealing: .aes256GCM) { fx in
            try fx.add("svc", "laid-out", secret: "the secret", pdmn: "ak")
            let row = try #require(try fx.rawColumns().first)
            #expect(row.itemKey.count == 61 && row.itemKey[0] == 2)
            let protection = try #require(ProtectionClass(rawValue: row.protectionClass))
            let head: [UInt8] = Array("kc2".utf8) + row.ref + [row.protectionClass]
            let classKey = try fx.service.vault.classKey(protection)
            let itemKey = try classKey.withUnsafeBytes { (ck) throws(KeychainError) in
                try withBytes(head + Array("K".utf8) + row.keyIndex) { (ad) throws(KeychainError) in
                    try AEAD.open(
                        Array(row.itemKey.dropFirst()), key: ck, ad: ad, what: "item key", sealing: .aes256GCM)
                }
            }
            func part(_ blob: [UInt8], _ name: String) throws -> [UInt8] {
                try itemKey.withUnsafeBytes { (ik) throws(KeychainError) in
                    try withBytes(head + Array(name.utf8)) { (ad) throws(KeychainError) in
                        try AEAD.open(blob, key: ik, ad: ad, what: "part", sealing: .aes256GCM)
                    }
                }
            }
            #expect(try part(row.secret, "S") == Array("the secret".utf8))
            let attributes = try CBOR.decode(try part(row.attributes, "A"))
            #expect(attributes.map?["acct"] == .text("laid-out") && attributes.map?["svce"] == .text("svc"))
        }
    }

    /// A row whose item key has lost its layout, or whose tag byte names the other construction, is
    /// errSecDecode for that row, never another construction's guess at it.
    @Test func anItemKeyWithAChangedLayoutDoesNotOpen() throws {
        for written in ItemSealing.allCases {
            try withProtectedKeychain(sealing: written) { fx in
                try fx.add("svc", "a", secret: "s", pdmn: "ak")
                let row = try #require(try fx.rawColumns().first).stored
                let codec = ItemCodec(vault: fx.service.vault)
                #expect(try codec.open(row, withSecret: true).secret?.unprotectedArray == Array("s".utf8))
                var changed: [[UInt8]] = [Array(row.wrappedKey.dropLast()), row.wrappedKey + [0]]
                if written == .aes256GCM {
                    changed.append([ItemSealing.xchacha20Poly1305.rawValue] + row.wrappedKey.dropFirst())
                    changed.append(Array(row.wrappedKey.dropFirst()))
                } else {
                    changed.append([ItemSealing.aes256GCM.rawValue] + row.wrappedKey.prefix(60))
                }
                for bytes in changed {
                    var damaged = row
                    damaged.wrappedKey = bytes
                    #expect(failure { try codec.open(damaged, withSecret: true) }?.status == .decode)
                }
            }
        }
    }
}
