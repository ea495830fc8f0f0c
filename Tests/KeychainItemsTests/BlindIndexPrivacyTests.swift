import KeychainCore
import KeychainItemsTestSupport
import KeychainSecretService
import KeychainStore
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainCrypto
@testable import KeychainItems

/// What `device.key` and a copy of the database tell about the items (docs/security.md §3): with a
/// passphrase set, no guess of a group, service, account or Secret Service attribute is confirmed
/// by the index columns, because they are keyed by the passphrase index key, not by the device
/// index key anyone holding `device.key` unwraps. And what users rely on still holds: lookups while
/// locked, after the first unlock, answer as Apple's do.
@Suite struct BlindIndexPrivacyTests {
    /// Everything the attacker reads: the files, as any process of the user can.
    struct Stolen {
        var deviceIndex: BlindIndexer
        var itemColumns: Set<[UInt8]>
        var attributeIndexes: Set<[UInt8]>

        /// Reads `device.key` and `keychain.db` of `directory` directly (no keychaind) and unwraps
        /// the keyring's "index" entry with the device key, as the keyring format allows anyone to.
        init(_ directory: String) throws {
            let deviceKey = try #require(try DeviceKeyFile.load(path: directory + "/" + ItemService.deviceKeyName))
            let db = try SQLiteConnection(path: directory + "/" + ItemService.databaseName, create: false)
            defer { db.close() }
            let keyring = try db.withStatement("SELECT value FROM meta WHERE name = 'keyring'") {
                (s) throws(KeychainError) -> [UInt8] in
                _ = try s.step()
                return s.blob(0)
            }
            let wrapped = try #require(try CBOR.decode(keyring).map?["index"]?.bytes)
            let kek = try KeyedHash.deriveKey(from: deviceKey, label: "keychaind device-kek v1")
            deviceIndex = BlindIndexer(
                key: try Vault.unwrap(wrapped, under: kek, name: "index", length: BlindIndexer.keyLength))
            var columns = Set<[UInt8]>()
            try db.withStatement("SELECT agrp_ix, svce_ix, acct_ix, key_ix FROM items") { (s) throws(KeychainError) in
                while try s.step() { for i in 0..<4 { columns.insert(s.blob(Int32(i))) } }
            }
            itemColumns = columns
            var attributes = Set<[UInt8]>()
            try db.withStatement("SELECT ix FROM item_attributes") { (s) throws(KeychainError) in
                while try s.step() { attributes.insert(s.blob(0)) }
            }
            attributeIndexes = attributes
        }

        /// Which of the guesses about one item the stored columns confirm.
        func confirmed(group: String, service: String, account: String) -> [String] {
            let i = deviceIndex
            var out: [String] = []
            if itemColumns.contains(i.column(.accessGroup, Array(group.utf8))) { out.append("group") }
            if itemColumns.contains(i.column(.service, Array(service.utf8))) { out.append("service") }
            if itemColumns.contains(i.column(.account, Array(account.utf8))) { out.append("account") }
            let key = i.uniqueKey(
                accessGroup: Array(group.utf8), service: Array(service.utf8), account: Array(account.utf8),
                synchronizable: false)
            if itemColumns.contains(key) { out.append("uniqueness key") }
            return out
        }

        func confirmed(attribute name: String, _ value: String) -> Bool {
            attributeIndexes.contains(
                deviceIndex.secretServiceAttribute(name: Array(name.utf8), value: Array(value.utf8)))
        }
    }

    /// The attack: a ck item and a Secret Service item of a keychain with a passphrase, locked; the
    /// attacker holds `device.key` and the database and guesses right. Without a passphrase the same
    /// computation confirms the guesses (so it is the right computation); with one, nothing.
    @Test func deviceKeyAndDatabaseConfirmNoGuessOfAPassphraseClassItem() throws {
        try withProtectedKeychain { fx in
            try fx.add("bank.example", "alice", secret: "s1", pdmn: "ck")
            #expect(
                try Stolen(fx.directory).confirmed(group: "TEAM.app", service: "bank.example", account: "alice")
                    == ["group", "service", "account", "uniqueness key"], "without a passphrase nothing is private")
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            try fx.add("mail.example", "bob", secret: "s2", pdmn: "cku")
            try fx.add("vpn.example", "carol", secret: "s3", pdmn: "ak")
            _ = try fx.service.secretServiceCreate(
                group: "TEAM.app", label: "L",
                attributes: SecretServiceAttributes(strings: [("xdg:schema", "org.example.Password"), ("user", "dave")]
                ),
                secret: SecretBytes(Array("s4".utf8)), contentType: "text/plain", replace: false, caller: Fixture.app)
            try fx.service.lock()
            fx.service.close()
            let stolen = try Stolen(fx.directory)
            for (service, account) in [("bank.example", "alice"), ("mail.example", "bob"), ("vpn.example", "carol")] {
                #expect(
                    stolen.confirmed(group: "TEAM.app", service: service, account: account) == [],
                    "\(service) \(account)")
            }
            #expect(
                !stolen.confirmed(attribute: "user", "dave")
                    && !stolen.confirmed(attribute: "xdg:schema", "org.example.Password"))
            #expect(!stolen.attributeIndexes.contains(stolen.deviceIndex.secretServiceItemMark))
            try fx.reopen()
            try fx.service.unlock(passphrase: pass("pw"))
            #expect(try fx.secret("bank.example", "alice") == "s1" && fx.secret("mail.example", "bob") == "s2")
        }
    }

    /// Before the first unlock no digest can be computed: Always items are still found; anything that
    /// could be an item of a passphrase class is errSecInteractionNotAllowed (Apple's answer for
    /// AfterFirstUnlock items before the first unlock). After it, a locked keychain answers as
    /// Apple's: errSecInteractionNotAllowed for a locked item, errSecItemNotFound for none, and the
    /// Secret Service's search lists the locked items.
    @Test func lookupsBeforeAndAfterTheFirstUnlockAnswerAsApplesDo() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            try fx.service.unlock(passphrase: pass("pw"))
            try fx.add("svc", "ak-item", secret: "a", pdmn: "ak")
            try fx.add("svc", "ck-item", secret: "c", pdmn: "ck")
            try fx.add("svc", "dk-item", secret: "d", pdmn: "dk")
            let ss = try fx.service.secretServiceCreate(
                group: "TEAM.app", label: "L", attributes: SecretServiceAttributes(strings: [("user", "erin")]),
                secret: SecretBytes(Array("e".utf8)), contentType: "text/plain", replace: false, caller: Fixture.app
            ).id
            try fx.reopen()

            // Before the first unlock.
            #expect(try fx.service.itemCount(visibleTo: Fixture.app) == 1, "the app's dk item only")
            #expect(try fx.service.itemCount(visibleTo: Fixture.admin) == 4)
            #expect(try fx.secret("svc", "dk-item") == "d")
            #expect(try fx.secret("svc", "dk-item", ["pdmn": .text("dk")]) == "d")
            #expect(status { try fx.secret("svc", "ck-item") } == .interactionNotAllowed)
            #expect(status { try fx.secret("svc", "ak-item") } == .interactionNotAllowed)
            #expect(status { try fx.secret("svc", "missing") } == .interactionNotAllowed)
            #expect(status { try fx.secret("svc", "missing", ["pdmn": .text("dk")]) } == .itemNotFound)
            #expect(status { try fx.secret("svc", "ck-item", ["pdmn": .text("dku")]) } == .itemNotFound)
            let all: [String: Value] = ["class": .text("genp"), "m_Limit": .text("m_LimitAll")]
            #expect(status { try fx.service.copyMatching(all, caller: Fixture.app) } == .interactionNotAllowed)
            #expect(status { try fx.add("svc", "new", pdmn: "dk") } == .interactionNotAllowed)
            #expect(
                status {
                    try fx.service.secretServiceSearch(
                        SecretServiceAttributes(strings: [("user", "erin")]), groups: ["TEAM.app"], caller: Fixture.app)
                } == .interactionNotAllowed)

            // After the first unlock, locked again.
            try fx.service.unlock(passphrase: pass("pw"))
            try fx.service.lock()
            #expect(try fx.service.itemCount(visibleTo: Fixture.app) == 4)
            #expect(fx.service.isLocked)
            #expect(status { try fx.secret("svc", "ak-item") } == .interactionNotAllowed)
            #expect(status { try fx.secret("svc", "missing") } == .itemNotFound)
            #expect(try fx.secret("svc", "ck-item") == "c" && fx.secret("svc", "dk-item") == "d")
            let found = try fx.service.secretServiceSearch(
                SecretServiceAttributes(strings: [("user", "erin")]), groups: ["TEAM.app"], caller: Fixture.app)
            #expect(found.locked.map(\.id) == [ss] && found.unlocked.isEmpty)
            try fx.add("svc", "new", secret: "n", pdmn: "dk")
            #expect(try fx.secret("svc", "new") == "n")
        }
    }

    /// Changing the passphrase keeps the passphrase index key (re-wrapped): every item is found
    /// after it, before and after a restart; removing the passphrase leaves every row as it was
    /// and every item found.
    @Test func passphraseChangesAndRemovalKeepEveryItemFound() throws {
        try withProtectedKeychain { fx in
            for code in allCodes where code != "akpu" { try fx.add("svc", code, secret: code, pdmn: code) }
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            try fx.add("svc", "akpu", secret: "akpu", pdmn: "akpu")
            try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            for code in allCodes { #expect(try fx.secret("svc", code) == code, "\(code)") }
            try fx.reopen()
            try fx.service.unlock(passphrase: pass("two"))
            for code in allCodes { #expect(try fx.secret("svc", code) == code, "\(code)") }
            try fx.service.changePassphrase(old: pass("two"), new: nil)
            for code in allCodes where code != "akpu" { #expect(try fx.secret("svc", code) == code, "\(code)") }
            try fx.reopen()
            for code in allCodes where code != "akpu" { #expect(try fx.secret("svc", code) == code, "\(code)") }
            // A passphrase set again draws a fresh index key: what device.key unwrapped meanwhile
            // confirms nothing afterwards.
            try fx.service.changePassphrase(old: nil, new: pass("three"))
            fx.service.close()
            #expect(try Stolen(fx.directory).confirmed(group: "TEAM.app", service: "svc", account: "ck") == [])
            try fx.reopen()
            try fx.service.unlock(passphrase: pass("three"))
            for code in allCodes where code != "akpu" { #expect(try fx.secret("svc", code) == code, "\(code)") }
        }
    }

    /// A keychain of today's format with a passphrase (its rows keyed by the device index key) opens,
    /// answers as before until the first unlock, and is migrated by it, in one step and without loss:
    /// every item reads back, before and after a restart, and `device.key` confirms no guess any more.
    @Test func theGoldenGCMKeychainIsMigratedByItsFirstUnlock() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden-gcm")
        let directory = try GoldenGCMKeychainTests.copy(to: temporary)
        let bob = GoldenGCMKeychainTests.items[1]
        #expect(
            try Stolen(directory).confirmed(group: "GOLDEN.app", service: bob.service, account: bob.account).count == 4,
            "the golden keychain's rows are keyed by the device index key")
        do {
            let service = try GoldenGCMKeychainTests.open(directory)
            defer { service.close() }
            // Not migrated yet: searched with the device index key, as by the keychaind that wrote it.
            let missing: [String: Value] = [
                "class": .text("genp"), "svce": .text("golden.service"), "acct": .text("nobody"),
            ]
            #expect(status { try service.copyMatching(missing, caller: GoldenGCMKeychainTests.app) } == .itemNotFound)
            #expect(status { try GoldenGCMKeychainTests.secret(service, bob) } == .interactionNotAllowed)
            try service.unlock(passphrase: GoldenGCMKeychainTests.secure(GoldenGCMKeychainTests.keychainPassphrase))
            try GoldenGCMKeychainTests.expectEveryItemReadsBack(service)
            try service.lock()
            #expect(status { try service.copyMatching(missing, caller: GoldenGCMKeychainTests.app) } == .itemNotFound)
        }
        let stolen = try Stolen(directory)
        for item in GoldenGCMKeychainTests.items {
            #expect(stolen.confirmed(group: "GOLDEN.app", service: item.service, account: item.account) == [])
        }
        let service = try GoldenGCMKeychainTests.open(directory)
        defer { service.close() }
        #expect(service.rowCheck.rows == GoldenGCMKeychainTests.items.count && !service.rowCheck.resealed)
        #expect(try CBOR.decode(try #require(try service.store.meta("keyring"))).map?["v"] == .int(2))
        #expect(status { try GoldenGCMKeychainTests.secret(service, bob) } == .interactionNotAllowed)
        #expect(try GoldenGCMKeychainTests.secret(service, GoldenGCMKeychainTests.items[2]) == "golden gcm secret (dk)")
        try service.unlock(passphrase: GoldenGCMKeychainTests.secure(GoldenGCMKeychainTests.keychainPassphrase))
        try GoldenGCMKeychainTests.expectEveryItemReadsBack(service)
    }
}

extension ProtectedFixture {
    /// The secret of an item of the test app found by service, account and the other `extra` keys.
    func secret(_ svce: String, _ acct: String, _ extra: [String: Value]) throws -> String? {
        var q = query(svce, acct, extra)
        q["r_Data"] = .bool(true)
        guard let b = try service.copyMatching(q, caller: Fixture.app)?.secretBytes?.unprotectedArray else {
            return nil
        }
        return String(decoding: b, as: UTF8.self)
    }
}
