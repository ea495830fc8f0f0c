import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainStore
import KeychainSystem
import KeychainTestSupport
import Testing

/// The keychain an earlier keychaind wrote (Tests/Golden/README.md): its rows, keyring and row-state
/// record keep opening, and it keeps working after this version writes to it.
@Suite struct GoldenKeychainTests {
    static let app = Caller(accessGroups: ["GOLDEN.app"])

    func secret(_ service: ItemService, _ account: String) throws -> String? {
        let q: [String: Value] = [
            "class": .text("genp"), "svce": .text("golden.service"), "acct": .text(account),
            "r_Data": .bool(true),
        ]
        guard let s = try service.copyMatching(q, caller: Self.app)?.secretBytes else { return nil }
        return String(decoding: s.unprotectedArray, as: UTF8.self)
    }

    @Test func theGoldenKeychainOpensAndEveryRowReadsBack() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden")
        try Golden.copyKeychain("keychain-v1", to: temporary.appending("data"))
        let service = try ItemService(directory: temporary.appending("data"), kdfProfile: .interactive)
        defer { service.close() }
        #expect(service.rowCheck.rows == 4 && !service.rowCheck.resealed)
        #expect(try secret(service, "alice") == "golden secret (ak)")
        #expect(try secret(service, "bob") == "golden secret (ck)")
        #expect(try secret(service, "carol") == "golden secret (dk)")
        #expect(try secret(service, "dave") == "golden secret (cku, this device only)")
        let q: [String: Value] = [
            "class": .text("genp"), "svce": .text("golden.service"), "acct": .text("alice"),
            "r_Attributes": .bool(true),
        ]
        let attributes = try #require(try service.copyMatching(q, caller: Self.app)?.map)
        #expect(attributes["labl"] == .text("Golden label") || attributes["labl"] == .bytes(Array("Golden label".utf8)))
        #expect(attributes["pdmn"] == .text("ak") && attributes["agrp"] == .text("GOLDEN.app"))
        // Opened by a keychaind whose schema has one (group, service, account) index where the
        // file has three: queries by group alone and by account alone still find their items.
        let all = try service.copyMatching(
            ["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true)], caller: Self.app)
        #expect(all?.array?.count == 4)
        let bob = try service.copyMatching(
            [
                "class": .text("genp"), "acct": .text("bob"), "m_Limit": .text("m_LimitAll"),
                "r_Attributes": .bool(true),
            ],
            caller: Self.app)
        #expect(bob?.array?.count == 1)
    }

    @Test func theGoldenKeychainTakesNewWritesAndReopens() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden")
        try Golden.copyKeychain("keychain-v1", to: temporary.appending("data"))
        do {
            let service = try ItemService(directory: temporary.appending("data"), kdfProfile: .interactive)
            _ = try service.add(
                [
                    "class": .text("genp"), "svce": .text("golden.service"), "acct": .text("erin"),
                    "v_Data": .bytes(Array("written now".utf8)),
                ], caller: Self.app)
            try service.update(
                ["class": .text("genp"), "svce": .text("golden.service"), "acct": .text("bob")],
                attributes: ["v_Data": .bytes(Array("changed now".utf8))], caller: Self.app)
            service.close()
        }
        let service = try ItemService(directory: temporary.appending("data"), kdfProfile: .interactive)
        defer { service.close() }
        #expect(service.rowCheck.rows == 5 && !service.rowCheck.resealed)
        #expect(try secret(service, "erin") == "written now")
        #expect(try secret(service, "bob") == "changed now")
        #expect(try secret(service, "alice") == "golden secret (ak)")
    }

    /// The golden keychain needs no migration for internet passwords: its rows are generic passwords
    /// as they always were (no class entry, the same digests), and internet passwords go beside them
    /// in the same columns under hash domains of their own. Every generic item is still found, no
    /// query of one class returns the other's, and the file reopens with its row-state record intact.
    @Test func theGoldenKeychainTakesInternetPasswordsBesideItsGenericOnes() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-golden")
        try Golden.copyKeychain("keychain-v1", to: temporary.appending("data"))
        let login: [String: Value] = [
            "class": .text("inet"), "srvr": .text("golden.service"), "acct": .text("alice"), "ptcl": .text("htps"),
        ]
        do {
            let service = try ItemService(directory: temporary.appending("data"), kdfProfile: .interactive)
            #expect(service.rowCheck.rows == 4 && !service.rowCheck.resealed)
            _ = try service.add(login.merging(["v_Data": .bytes(Array("internet".utf8))]) { $1 }, caller: Self.app)
            service.close()
        }
        let service = try ItemService(directory: temporary.appending("data"), kdfProfile: .interactive)
        defer { service.close() }
        #expect(service.rowCheck.rows == 5 && !service.rowCheck.resealed)
        #expect(try secret(service, "alice") == "golden secret (ak)")
        #expect(try secret(service, "dave") == "golden secret (cku, this device only)")
        let generic = try service.copyMatching(
            ["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true)], caller: Self.app)
        #expect(generic?.array?.count == 4)
        #expect(generic?.array?.allSatisfy { $0.map?["srvr"] == nil } == true)
        let internet = try service.copyMatching(
            ["class": .text("inet"), "m_Limit": .text("m_LimitAll"), "r_Data": .bool(true)], caller: Self.app)
        #expect(internet?.array?.map { $0.secretBytes?.unprotectedArray } == [Array("internet".utf8)])
        #expect(
            try service.copyMatching(login.merging(["r_Data": .bool(true)]) { $1 }, caller: Self.app)?.secretBytes?
                .unprotectedArray == Array("internet".utf8))
    }
}
