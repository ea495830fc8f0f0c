import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import Testing

@testable import KeychainItems

@Suite struct ProtectionAtRest {
    static let stored = [
        "svc-Zanzibar-7731", "acct-Quixotic-5512", "TEAM.grp-Marzipan-9920", "label-Obsidian-4410",
        "desc-Periwinkle-3307", "comment-Gossamer-2231", "generic-Halcyon-6658", "secret-Vermilion-1184",
    ]

    func addRevealingItem(_ fx: Fixture) throws {
        let caller = Caller(accessGroups: [Self.stored[2]])
        _ = try fx.service.add(
            [
                "class": .text("genp"), "svce": .text(Self.stored[0]), "acct": .text(Self.stored[1]),
                "agrp": .text(Self.stored[2]),
                "labl": .text(Self.stored[3]), "desc": .text(Self.stored[4]), "icmt": .text(Self.stored[5]),
                "gena": bytes(Self.stored[6]), "v_Data": bytes(Self.stored[7]),
            ], caller: caller)
        try fx.service.update(
            ["class": .text("genp"), "svce": .text(Self.stored[0])], attributes: ["labl": .text(Self.stored[3] + "-2")],
            caller: caller)
    }

    /// Every file of the data directory, read as bytes.
    func dataFiles(_ fx: Fixture) throws -> [String: Data] {
        var files: [String: Data] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: fx.directory) {
            files[name] = try Data(contentsOf: URL(fileURLWithPath: fx.directory + "/" + name))
        }
        return files
    }

    func expectNoPlaintext(_ fx: Fixture) throws {
        let files = try dataFiles(fx)
        #expect(files.keys.contains(ItemService.databaseName) && files.keys.contains(ItemService.deviceKeyName))
        for (name, data) in files {
            for s in Self.stored {
                // Whole strings and their distinctive middle parts, in UTF-8 and UTF-16.
                let word = String(s.split(separator: "-")[1])
                for needle in [s, word] {
                    #expect(data.range(of: Data(needle.utf8)) == nil, "\(name) contains \(needle)")
                    #expect(
                        data.range(of: needle.data(using: .utf16LittleEndian)!) == nil,
                        "\(name) contains \(needle) (UTF-16)")
                }
            }
        }
    }

    @Test func nothingStoredAppearsInPlaintextInTheDataDirectory() throws {
        try withKeychain { (fx) throws in
            try addRevealingItem(fx)
            #expect(FileManager.default.fileExists(atPath: fx.databasePath + "-wal"))
            try expectNoPlaintext(fx)  // while open: the WAL holds the recent pages
            fx.service.close()
            try expectNoPlaintext(fx)  // after the checkpoint
        }
    }

    @Test func filesAreOwnerOnly() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            let fm = FileManager.default
            let dirMode = try fm.attributesOfItem(atPath: fx.directory)[.posixPermissions] as? Int
            #expect(dirMode == 0o700)
            for name in try fm.contentsOfDirectory(atPath: fx.directory) {
                let mode = try fm.attributesOfItem(atPath: fx.directory + "/" + name)[.posixPermissions] as? Int
                #expect(mode == 0o600, "\(name)")
                #expect(!name.contains(".tmp-"), "\(name) left behind")
            }
            #expect(try fm.attributesOfItem(atPath: fx.keyPath)[.size] as? Int == 32)
        }
    }

    // MARK: Tampering (raw SQL on the database file)

    func withDatabase(_ fx: Fixture, _ body: (SQLiteConnection) throws -> Void) throws {
        let db = try SQLiteConnection(path: fx.databasePath, create: false)
        defer { db.close() }
        try body(db)
    }

    func blob(_ db: SQLiteConnection, _ column: String, acctIndex rowid: Int64) throws -> [UInt8] {
        try db.withStatement("SELECT \(column) FROM items WHERE rowid = ?") { (s) throws(KeychainError) in
            try s.bind(1, rowid)
            _ = try s.step()
            return s.blob(0)
        }
    }

    func set(_ db: SQLiteConnection, _ column: String, rowid: Int64, _ value: [UInt8]) throws {
        try db.withStatement("UPDATE items SET \(column) = ? WHERE rowid = ?") { (s) throws(KeychainError) in
            try s.bind(1, value)
            try s.bind(2, rowid)
            try s.run()
        }
    }

    @Test(arguments: ["attributes", "secret", "item_key"])
    func aFlippedByteIsErrSecDecode(column: String) throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "s")
            try withDatabase(fx) { db in
                var b = try blob(db, column, acctIndex: 1)
                b[b.count / 2] ^= 0x01
                try set(db, column, rowid: 1, b)
            }
            let error = try #require(
                failure { try fx.copy(query("svc", "alice", ["r_Data": .bool(true), "r_Attributes": .bool(true)])) })
            #expect(error.status == .decode)
            // Data-only point lookups skip the attributes but still never return damaged data.
            if column != "attributes" {
                #expect(status { try fx.copy(query("svc", "alice", ["r_Data": .bool(true)])) } == .decode)
            }
        }
    }

    @Test(arguments: ["attributes", "secret", "item_key"])
    func aBlobMovedIntoAnotherRowIsErrSecDecode(column: String) throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "alice-secret")
            try fx.add("svc", "bob", secret: "bob-secret")
            try withDatabase(fx) { db in try set(db, column, rowid: 2, try blob(db, column, acctIndex: 1)) }
            #expect(
                status { try fx.copy(query("svc", "bob", ["r_Data": .bool(true), "r_Attributes": .bool(true)])) }
                    == .decode)
            if column != "attributes" {
                #expect(status { try fx.copy(query("svc", "bob", ["r_Data": .bool(true)])) } == .decode)
            }
        }
    }

    @Test func aChangedClassColumnIsErrSecDecode() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", ["pdmn": .text("ak")])
            try withDatabase(fx) { db in try db.execute("UPDATE items SET class = 8") }
            #expect(status { try fx.copy(query("svc", "alice", ["r_Data": .bool(true)])) } == .decode)
        }
    }

    @Test func swappedUniquenessDigestsAreErrSecDecodeNotTheOtherSecret() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "alice-secret")
            try fx.add("svc", "bob", secret: "bob-secret")
            try withDatabase(fx) { db in
                let a = try blob(db, "key_ix", acctIndex: 1)
                let b = try blob(db, "key_ix", acctIndex: 2)
                try set(db, "key_ix", rowid: 1, Array(repeating: 0, count: 32))
                try set(db, "key_ix", rowid: 2, a)
                try set(db, "key_ix", rowid: 1, b)
            }
            // The hot path (point lookup, data only) must not hand out bob's secret for alice.
            #expect(status { try fx.copy(query("svc", "alice", ["r_Data": .bool(true)])) } == .decode)
            #expect(status { try fx.copy(query("svc", "alice")) } == .decode)
            #expect(status { try fx.copy(query("svc", "bob", ["r_Attributes": .bool(true)])) } == .decode)
        }
    }

    @Test func aForgedGroupIndexDoesNotRevealAnItemToAnotherApp() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "mine")
            try fx.add("svc", "bob", caller: Fixture.other)
            // Point the app's row at the other app's group digest: the decrypted agrp still decides.
            try withDatabase(fx) { db in try set(db, "agrp_ix", rowid: 1, try blob(db, "agrp_ix", acctIndex: 2)) }
            let all = try fx.copy(
                ["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true)],
                caller: Fixture.other)
            #expect(all?.array?.compactMap { $0.map?["acct"] } == [.text("bob")])
        }
    }

    @Test func keyMaterialNeverShowsInDescriptions() throws {
        let key = try [UInt8](repeating: 0x41, count: 32).withUnsafeBytes { try SecureBytes(copying: $0) }
        #expect(key.description == "SecureBytes(32 bytes)")
        #expect(Value.bytes(Array("secret".utf8)).description == "<6 bytes>")
    }

    @Test func sealedBoxesAuthenticateTheirAssociatedData() throws {
        let key = try SecureBytes(random: 32)
        let sealed = key.withUnsafeBytes { k in
            Array("ad1".utf8).withUnsafeBytes { AEAD.seal(Array("hello".utf8), key: k, ad: $0) }
        }
        let opened = try key.withUnsafeBytes { (k) throws(KeychainError) in
            try withBytes(Array("ad1".utf8)) { (ad) throws(KeychainError) in
                try AEAD.open(sealed, key: k, ad: ad, what: "test")
            }
        }
        #expect(opened == Array("hello".utf8))
        let wrongAD = failure {
            try key.withUnsafeBytes { (k) throws(KeychainError) in
                try withBytes(Array("ad2".utf8)) { (ad) throws(KeychainError) in
                    try AEAD.open(sealed, key: k, ad: ad, what: "test")
                }
            }
        }
        #expect(wrongAD?.status == .decode)
    }
}
