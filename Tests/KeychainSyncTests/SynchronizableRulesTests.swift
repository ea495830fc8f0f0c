import KeychainCore
import KeychainItems
import KeychainSystem
import KeychainTestSupport
import Testing

/// Apple's rule for `kSecAttrSynchronizable` and the `…ThisDeviceOnly` classes.
@Suite struct SynchronizableRulesTests {
    static let app = Caller(accessGroups: ["TEAM.app"])

    /// Adding a synchronizable item of each ThisDeviceOnly class is errSecParam, and stores nothing;
    /// the same item not synchronizable, or synchronizable of a class that travels, is accepted.
    /// Updating an item into the forbidden combination (either half of it) is refused too.
    @Test func synchronizableThisDeviceOnlyIsRefused() throws {
        let dir = try TemporaryDirectory(prefix: "kc-syncrule")
        let s = try ItemService(directory: dir.appending("data"))
        defer { s.close() }
        func add(_ svce: String, _ extra: [String: Value]) throws {
            var q: [String: Value] = ["class": .text("genp"), "svce": .text(svce), "acct": .text("me")]
            for (k, v) in extra { q[k] = v }
            _ = try s.add(q, caller: Self.app)
        }
        for code in ["aku", "cku", "dku"] {
            do {
                try add("s-\(code)", ["sync": .bool(true), "pdmn": .text(code)])
                Issue.record("a synchronizable \(code) item was added")
            } catch let error as KeychainError {
                #expect(error.status == .param)
            }
            try add("l-\(code)", ["pdmn": .text(code)])
        }
        #expect(try s.itemCount() == 3)
        try add("travels", ["sync": .bool(true), "pdmn": .text("ck")])
        // ck → cku while synchronizable: refused.
        do {
            try s.update(
                ["class": .text("genp"), "svce": .text("travels"), "sync": .bool(true)],
                attributes: ["pdmn": .text("cku")], caller: Self.app)
            Issue.record("an update made a synchronizable item ThisDeviceOnly")
        } catch let error as KeychainError {
            #expect(error.status == .param)
        }
        // A local aku item made synchronizable: refused.
        do {
            try s.update(
                ["class": .text("genp"), "svce": .text("l-aku")], attributes: ["sync": .bool(true)], caller: Self.app)
            Issue.record("an update made a ThisDeviceOnly item synchronizable")
        } catch let error as KeychainError {
            #expect(error.status == .param)
        }
    }
}
