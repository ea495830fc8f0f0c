import KeychainCore
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainCrypto
@testable import KeychainItems

/// The keychain a keychaind with AES-256-GCM rows wrote, passphrase set (Tests/Golden/README.md,
/// `keychain-v2-gcm`): its rows, keyring, registrations and row-state record keep opening, through
/// libsodium and through libgcrypt (as on a machine without AES-NI), and it keeps working after this
/// version writes to it.
@Suite struct GoldenGCMKeychainTests {
    static let app = Caller(accessGroups: ["GOLDEN.app"])
    static let keychainPassphrase = "golden keychain passphrase"

    /// One item of the golden keychain, as the README lists it.
    struct Item {
        var service = "golden.service"
        var account: String
        var protection: String
        var secret: String
    }

    static let largeSecret = (1...64).map { "line \($0) of the golden large secret" }.joined(separator: "\n")
    static let nonASCIIService = "g\u{F6}lden.s\u{E9}rvice"
    static let nonASCIIAccount = "\u{F1}and\u{FA} \u{2713} \u{9375}"

    static let items: [Item] = [
        Item(account: "alice", protection: "ak", secret: "golden gcm secret (ak)"),
        Item(account: "bob", protection: "ck", secret: "golden gcm secret (ck)"),
        Item(account: "carol", protection: "dk", secret: "golden gcm secret (dk)"),
        Item(account: "dave", protection: "cku", secret: "golden gcm secret (cku, this device only)"),
        Item(account: "erin", protection: "aku", secret: "golden gcm secret (aku, this device only)"),
        Item(account: "frank", protection: "dku", secret: "golden gcm secret (dku, this device only)"),
        Item(account: "grace", protection: "akpu", secret: "golden gcm secret (akpu, passcode set, this device only)"),
        Item(account: "large", protection: "ck", secret: largeSecret),
        Item(
            service: nonASCIIService, account: nonASCIIAccount, protection: "dk",
            secret: "s\u{E9}cret \u{2713} \u{1F511}"),
    ]

    static func secure(_ text: String) -> SecureBytes { try! PasswordHash.passphrase(Array(text.utf8))! }

    /// A copy of the golden keychain in `temporary`/data (git does not keep keychaind's modes).
    static func copy(to temporary: TemporaryDirectory) throws -> String {
        let directory = temporary.appending("data")
        try Golden.copyKeychain("keychain-v2-gcm", to: directory)
        return directory
    }

    static func open(_ directory: String) throws -> ItemService {
        try ItemService(directory: directory, kdfProfile: .interactive)
    }

    static func query(_ item: Item, _ extra: [String: Value] = [:]) -> [String: Value] {
        var q: [String: Value] = ["class": .text("genp"), "svce": .text(item.service), "acct": .text(item.account)]
        for (k, v) in extra { q[k] = v }
        return q
    }

    static func secret(_ service: ItemService, _ item: Item) throws -> String? {
        guard let s = try service.copyMatching(query(item, ["r_Data": .bool(true)]), caller: app)?.secretBytes else {
            return nil
        }
        return String(decoding: s.unprotectedArray, as: UTF8.self)
    }

    static func attributes(_ service: ItemService, _ item: Item) throws -> [String: Value] {
        try service.copyMatching(query(item, ["r_Attributes": .bool(true)]), caller: app)?.map ?? [:]
    }

    /// Every item's secret and attributes read back as written (and `extra` more items are listed).
    static func expectEveryItemReadsBack(_ service: ItemService, extra: Int = 0) throws {
        for item in items {
            #expect(try secret(service, item) == item.secret, "\(item.account)")
            let a = try attributes(service, item)
            #expect(a["svce"] == .text(item.service) && a["acct"] == .text(item.account), "\(item.account)")
            #expect(a["pdmn"] == .text(item.protection) && a["agrp"] == .text("GOLDEN.app"), "\(item.account)")
            #expect(a["sync"] == .bool(false), "\(item.account)")
        }
        let alice = try attributes(service, items[0])
        #expect(alice["labl"] == .text("Golden GCM label"))
        #expect(alice["icmt"] == .text("golden comment") && alice["desc"] == .text("golden description"))
        let all = try service.copyMatching(
            ["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true)], caller: app)
        #expect(all?.array?.count == items.count + extra)
    }

    /// The columns of one row of the items table, as stored.
    struct RawRow {
        var ref: [UInt8]
        var protectionClass: UInt8
        var keyIndex: [UInt8]
        var itemKey: [UInt8]
        var attributes: [UInt8]
        var secret: [UInt8]
    }

    /// Every row of the items table, read with a connection of its own (the keychain closed).
    static func rawRows(_ directory: String) throws -> [RawRow] {
        let db = try SQLiteConnection(path: directory + "/" + ItemService.databaseName, create: false)
        defer { db.close() }
        var rows: [RawRow] = []
        try db.withStatement("SELECT ref, class, key_ix, item_key, attributes, secret FROM items ORDER BY rowid") {
            (s) throws(KeychainError) in
            while try s.step() {
                rows.append(
                    RawRow(
                        ref: s.blob(0), protectionClass: UInt8(s.int64(1)), keyIndex: s.blob(2), itemKey: s.blob(3),
                        attributes: s.blob(4), secret: s.blob(5)))
            }
        }
        return rows
    }

    /// Opens one AES-256-GCM box (nonce ‖ ciphertext ‖ tag) with `engine`, whatever another test has
    /// asked the process for meanwhile.
    static func openBox(
        _ box: [UInt8], key: UnsafeRawBufferPointer, ad: [UInt8], engine: AEAD.GCMEngine
    ) throws(KeychainError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: box.count - ItemSealing.aes256GCM.overhead)
        try withBytes(box) { (b) throws(KeychainError) in
            try withBytes(ad) { (a) throws(KeychainError) in
                try withMutableBytes(&out) { (o) throws(KeychainError) in
                    try AEAD.open(b, key: key, ad: a, into: o, what: "golden box", sealing: .aes256GCM, engine: engine)
                }
            }
        }
        return out
    }

    /// The fixture really is what it pins: every row is an AES-256-GCM row (a 61-byte item key
    /// starting with the tag byte 2; boxes of 12-byte nonce ‖ ciphertext ‖ 16-byte tag).
    @Test func everyRowOfTheGoldenGCMKeychainIsAnAES256GCMRow() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let rows = try Self.rawRows(try Self.copy(to: temporary))
        #expect(rows.count == Self.items.count)
        for row in rows {
            #expect(row.itemKey.count == 61 && row.itemKey.first == ItemSealing.aes256GCM.rawValue)
            #expect(row.attributes.count > ItemSealing.aes256GCM.overhead)
            #expect(ItemSealing(sealedItemKey: row.itemKey) == .aes256GCM)
        }
        #expect(
            rows.map { $0.secret.count }.sorted()
                == Self.items.map { $0.secret.utf8.count + ItemSealing.aes256GCM.overhead }.sorted())
    }

    /// Every row opened by hand, as the layout is documented (ItemCodec), with each library that runs
    /// AES-256-GCM here, named explicitly: the item key is the byte 2 ‖ box under the class key with
    /// associated data "kc2" ‖ ref ‖ class ‖ "K" ‖ key_ix; the attributes (CBOR) and the secret are
    /// boxes under the item key with "kc2" ‖ ref ‖ class ‖ "A" or "S". libsodium only where the CPU
    /// has AES-NI (it cannot run GCM elsewhere); libgcrypt everywhere.
    @Test func everyGoldenGCMRowOpensByHandWithEachLibrary() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let directory = try Self.copy(to: temporary)
        let rows = try Self.rawRows(directory)
        let service = try Self.open(directory)
        defer { service.close() }
        try service.unlock(passphrase: Self.secure(Self.keychainPassphrase))
        let engines: [AEAD.GCMEngine] = AEAD.machineGCMEngine == .libsodium ? [.libsodium, .libgcrypt] : [.libgcrypt]
        for engine in engines {
            var found: [String: String] = [:]
            for row in rows {
                let protection = try #require(ProtectionClass(rawValue: row.protectionClass))
                let head = Array("kc2".utf8) + row.ref + [row.protectionClass]
                let itemKey = try service.vault.classKey(protection).withUnsafeBytes { (ck) throws(KeychainError) in
                    try Self.openBox(
                        Array(row.itemKey.dropFirst()), key: ck, ad: head + Array("K".utf8) + row.keyIndex,
                        engine: engine)
                }
                func part(_ box: [UInt8], _ name: String) throws(KeychainError) -> [UInt8] {
                    try withBytes(itemKey) { (ik) throws(KeychainError) in
                        try Self.openBox(box, key: ik, ad: head + Array(name.utf8), engine: engine)
                    }
                }
                let secret = try part(row.secret, "S")
                let attributes = try part(row.attributes, "A")
                let map = try #require(try CBOR.decode(attributes).map)
                #expect(map["pdmn"] == .text(protection.code))
                found[map["acct"]?.text ?? ""] = String(decoding: secret, as: UTF8.self)
                // The same box with one changed tag byte does not open.
                var changed = row.secret
                changed[changed.count - 1] ^= 0x01
                let refused = failure { try part(changed, "S") }
                #expect(refused?.status == .decode, "\(engine)")
            }
            #expect(found == Dictionary(uniqueKeysWithValues: Self.items.map { ($0.account, $0.secret) }), "\(engine)")
        }
    }

    /// It opens locked, with its row-state record verified as it is; only the dk and dku items read
    /// before the passphrase is given, the others are errSecInteractionNotAllowed, and so is every
    /// attribute read of them.
    @Test func theGoldenGCMKeychainOpensLockedAndOnlyItsAlwaysClassesReadWithoutThePassphrase() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let service = try Self.open(try Self.copy(to: temporary))
        defer { service.close() }
        #expect(service.rowCheck.rows == Self.items.count && !service.rowCheck.resealed)
        let status = service.protectionStatus
        #expect(status.locked && status.passphraseSet && status.failedUnlocks == 0)
        #expect(try service.approvedRegistrations() == nil, "the approved apps need the passphrase")
        for item in Self.items {
            if item.protection.hasPrefix("dk") {
                #expect(try Self.secret(service, item) == item.secret, "\(item.account)")
            } else {
                #expect(failure { try Self.secret(service, item) }?.status == .interactionNotAllowed, "\(item.account)")
                #expect(
                    failure { try Self.attributes(service, item) }?.status == .interactionNotAllowed, "\(item.account)")
            }
        }
    }

    /// A wrong passphrase is errSecAuthFailed and leaves it locked; the right one reads every row,
    /// every attribute and the approved registrations back as they were written.
    @Test func theGoldenGCMKeychainReadsBackWithItsPassphraseOnly() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let service = try Self.open(try Self.copy(to: temporary))
        defer { service.close() }
        #expect(
            failure { try service.unlock(passphrase: Self.secure("golden keychain passphrasE")) }?.status == .authFailed
        )
        #expect(service.isLocked && service.protectionStatus.failedUnlocks == 1)
        #expect(failure { try Self.secret(service, Self.items[0]) }?.status == .interactionNotAllowed)
        try service.unlock(passphrase: Self.secure(Self.keychainPassphrase))
        #expect(!service.isLocked && service.protectionStatus.failedUnlocks == 0)
        try Self.expectEveryItemReadsBack(service)
        #expect(
            try service.approvedRegistrations() == [
                ApprovedRegistration(
                    applicationIdentifier: "GOLDEN.keychainctl", accessGroups: ["GOLDEN.app"],
                    executables: ["/opt/keychaind-golden/bin/keychainctl"], admin: true)
            ])
    }

    /// The same rows read back with AES-256-GCM run by libgcrypt, as on a machine without AES-NI.
    @Test func theGoldenGCMKeychainReadsBackThroughLibgcrypt() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let directory = try Self.copy(to: temporary)
        try AEAD.withLibgcryptForGCM { () throws in
            #expect(AEAD.gcmEngine == .libgcrypt)
            let service = try Self.open(directory)
            defer { service.close() }
            #expect(service.rowCheck.rows == Self.items.count && !service.rowCheck.resealed)
            try service.unlock(passphrase: Self.secure(Self.keychainPassphrase))
            try Self.expectEveryItemReadsBack(service)
        }
    }

    /// It takes new rows, an update and a passphrase change (which re-wraps every GCM item key under
    /// new class keys), and everything reads back after reopening, through either library.
    @Test func theGoldenGCMKeychainTakesNewWritesAndReopens() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let directory = try Self.copy(to: temporary)
        let written = Item(account: "henry", protection: "ak", secret: "written now")
        var expected = Self.items
        expected[1].secret = "changed now"
        do {
            let service = try Self.open(directory)
            defer { service.close() }
            try service.unlock(passphrase: Self.secure(Self.keychainPassphrase))
            _ = try service.add(
                Self.query(written, ["v_Data": .bytes(Array(written.secret.utf8)), "pdmn": .text("ak")]),
                caller: Self.app)
            try service.update(
                Self.query(Self.items[1]), attributes: ["v_Data": .bytes(Array("changed now".utf8))], caller: Self.app)
            try service.changePassphrase(
                old: Self.secure(Self.keychainPassphrase), new: Self.secure("a new golden passphrase"))
        }
        for libgcrypt in [false, true] {
            func reopenAndRead() throws {
                let service = try Self.open(directory)
                defer { service.close() }
                #expect(service.rowCheck.rows == Self.items.count + 1 && !service.rowCheck.resealed)
                #expect(
                    failure { try service.unlock(passphrase: Self.secure(Self.keychainPassphrase)) }?.status
                        == .authFailed, "the passphrase before the change")
                try service.unlock(passphrase: Self.secure("a new golden passphrase"))
                for item in expected + [written] {
                    #expect(try Self.secret(service, item) == item.secret, "\(item.account)")
                }
            }
            if libgcrypt { try AEAD.withLibgcryptForGCM(reopenAndRead) } else { try reopenAndRead() }
        }
    }

    /// Its backup (`backup-v2-gcm.kcbackup`) restores into a new keychain, every item that a backup
    /// carries reading back there, and into the keychain it was made from as five items skipped.
    @Test func theGoldenGCMKeychainsBackupRestores() throws {
        let file = try Golden.bytes("backup-v2-gcm.kcbackup")
        let backupPassphrase = Self.secure("golden gcm backup passphrase")
        let carried = Self.items.filter { ["ak", "ck", "dk"].contains($0.protection) }
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        do {
            let fresh = try Self.open(temporary.appending("fresh"))
            defer { fresh.close() }
            let counts = try fresh.restore(passphrase: backupPassphrase, data: file)
            #expect(counts.restored == carried.count && counts.skipped == 0)
            for item in carried { #expect(try Self.secret(fresh, item) == item.secret, "\(item.account)") }
            #expect(try Self.attributes(fresh, Self.items[0])["labl"] == .text("Golden GCM label"))
            #expect(try fresh.itemCount() == carried.count)
        }
        let original = try Self.open(try Self.copy(to: temporary))
        defer { original.close() }
        #expect(
            failure { try original.restore(passphrase: backupPassphrase, data: file) }?.status
                == .interactionNotAllowed, "locked")
        try original.unlock(passphrase: Self.secure(Self.keychainPassphrase))
        let counts = try original.restore(passphrase: backupPassphrase, data: file)
        #expect(counts.restored == 0 && counts.skipped == carried.count)
    }

    /// A changed byte in the body or tag of a row's sealed item key, attributes or secret keeps the row's
    /// fingerprint (which covers the nonces), so the keychain opens and that item alone is
    /// errSecDecode, through either library; a changed nonce is refused when the keychain opens.
    @Test(arguments: ["item_key", "attributes", "secret"])
    func aChangedByteInAGoldenGCMRowIsRefused(column: String) throws {
        for libgcrypt in [false, true] {
            let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
            let directory = try Self.copy(to: temporary)
            let alice = Self.items[0]
            let ref: [UInt8]
            do {
                let service = try Self.open(directory)
                defer { service.close() }
                try service.unlock(passphrase: Self.secure(Self.keychainPassphrase))
                let persistent = try #require(
                    try service.copyMatching(Self.query(alice, ["r_PersistentRef": .bool(true)]), caller: Self.app)?
                        .bytes)
                ref = try #require(PersistentRef.id(from: persistent))
            }
            try Self.flip(column, ofRef: ref, at: { $0 - 1 }, in: directory)
            func read() throws {
                let service = try Self.open(directory)
                defer { service.close() }
                #expect(!service.rowCheck.resealed)
                try service.unlock(passphrase: Self.secure(Self.keychainPassphrase))
                let part: [String: Value] = column == "secret" ? ["r_Data": .bool(true)] : ["r_Attributes": .bool(true)]
                let error = failure { try service.copyMatching(Self.query(alice, part), caller: Self.app) }
                #expect(error?.status == .decode, "\(column), libgcrypt \(libgcrypt)")
                #expect(try Self.secret(service, Self.items[1]) == Self.items[1].secret)
            }
            if libgcrypt { try AEAD.withLibgcryptForGCM(read) } else { try read() }

            // A nonce byte (the item key's first nonce byte follows its tag byte) is in the fingerprint.
            try Self.flip(column, ofRef: ref, at: { _ in column == "item_key" ? 1 : 0 }, in: directory)
            let refused = failure { try Self.open(directory) }
            #expect(refused?.status == .decode, "\(column): a changed nonce must not open")
        }
    }

    /// Flips the low bit of byte `at(count)` of `column` in the row `ref` (the keychain closed).
    static func flip(_ column: String, ofRef ref: [UInt8], at index: (Int) -> Int, in directory: String) throws {
        let db = try SQLiteConnection(path: directory + "/" + ItemService.databaseName, create: false)
        defer { db.close() }
        var sealed = try db.withStatement("SELECT \(column) FROM items WHERE ref = ?") {
            (s) throws(KeychainError) -> [UInt8] in
            try s.bind(1, ref)
            guard try s.step() else { throw KeychainError(.itemNotFound, "no row") }
            return s.blob(0)
        }
        sealed[index(sealed.count)] ^= 0x01
        try db.withStatement("UPDATE items SET \(column) = ? WHERE ref = ?") { (s) throws(KeychainError) in
            try s.bind(1, sealed)
            try s.bind(2, ref)
            try s.run()
        }
    }
}
