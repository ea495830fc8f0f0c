import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import Testing

@testable import KeychainItems

@Suite struct CopyRules {
    @Test func noMatchIsItemNotFound() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.copy(query("svc", "nobody")) } == .itemNotFound)
        }
    }

    @Test func implicitSyncFilterHidesSynchronizableItems() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", ["sync": .bool(true)])
            #expect(status { try fx.copy(query("svc", "alice")) } == .itemNotFound)
            #expect(status { try fx.copy(["class": .text("genp")]) } == .itemNotFound)
            #expect(try fx.secret("svc", "alice", ["sync": .int(1)]) == "pw")
        }
    }

    @Test func synchronizableAnyMatchesBoth() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "local")
            try fx.add("svc", "alice", secret: "synced", ["sync": .bool(true)])
            let all = try fx.copy(
                query("svc", "alice", ["sync": .text("syna"), "m_Limit": .text("m_LimitAll"), "r_Data": .bool(true)]))
            #expect(Set(all?.array ?? []) == [bytes("local"), bytes("synced")])
            // Without service/account (no point lookup) too.
            let scan = try fx.copy(["class": .text("genp"), "sync": .text("syna"), "m_Limit": .text("m_LimitAll")])
            #expect(scan == nil)
        }
    }

    @Test func matchingIsByteExactAndCaseSensitive() throws {
        try withKeychain { (fx) throws in
            try fx.add("Svc", "Alice")
            #expect(status { try fx.copy(query("svc", "alice")) } == .itemNotFound)
            #expect(status { try fx.copy(query("svc", "alice", ["m_CaseInsensitive": .bool(true)])) } == .itemNotFound)
            #expect(status { try fx.copy(query("Svc", "Alice ")) } == .itemNotFound)
            #expect(try fx.secret("Svc", "Alice", ["m_CaseInsensitive": .bool(true)]) == "pw")
        }
    }

    @Test func everySuppliedAttributeMustMatch() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", ["labl": .text("Label"), "gena": .bytes([1, 2]), "crtr": .int(7)])
            #expect(
                try fx.secret("svc", "alice", ["labl": .text("Label"), "gena": .bytes([1, 2]), "crtr": .int(7)]) == "pw"
            )
            #expect(status { try fx.copy(query("svc", "alice", ["labl": .text("label")])) } == .itemNotFound)
            #expect(status { try fx.copy(query("svc", "alice", ["gena": .bytes([1, 3])])) } == .itemNotFound)
            #expect(status { try fx.copy(query("svc", "alice", ["crtr": .int(8)])) } == .itemNotFound)
            #expect(status { try fx.copy(query("svc", "alice", ["icmt": .text("unset")])) } == .itemNotFound)
            // Attributes alone (no service/account) filter too.
            #expect(try fx.copy(["class": .text("genp"), "labl": .text("Label")]) == nil)
            #expect(status { try fx.copy(["class": .text("genp"), "labl": .text("Other")]) } == .itemNotFound)
        }
    }

    @Test func datesCanBeUsedAsFilters() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let mdat = try #require(try fx.attributes("svc", "alice")["mdat"])
            #expect(try fx.secret("svc", "alice", ["mdat": mdat]) == "pw")
            #expect(status { try fx.copy(query("svc", "alice", ["mdat": .date(1)])) } == .itemNotFound)
        }
    }

    @Test func valueDataInAQueryIsNotUsedForMatching() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "real")
            #expect(try fx.secret("svc", "alice", ["v_Data": bytes("wrong")]) == "real")
        }
    }

    @Test func accessibilityIsAFilter() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", ["pdmn": .text("dk")])
            try fx.add("svc", "b", ["pdmn": .text("ck")])
            let found = try fx.copy([
                "class": .text("genp"), "pdmn": .text("dk"), "m_Limit": .text("m_LimitAll"),
                "r_Attributes": .bool(true),
            ])
            #expect(found?.array?.compactMap { $0.map?["acct"] } == [.text("a")])
        }
    }

    @Test func limitOneReturnsASingleValue() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "1")
            try fx.add("svc", "b", secret: "2")
            #expect(try fx.copy(["class": .text("genp"), "svce": .text("svc"), "r_Data": .bool(true)]) == bytes("1"))
            #expect(
                try fx.copy(["class": .text("genp"), "svce": .text("svc"), "r_Data": .bool(true), "m_Limit": .int(1)])
                    == bytes("1"))
        }
    }

    @Test func limitAllReturnsAnArrayEvenForOneMatch() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            #expect(
                try fx.copy(query("svc", "a", ["r_Data": .bool(true), "m_Limit": .text("m_LimitAll")]))
                    == .array([bytes("pw")]))
        }
    }

    @Test func limitNCapsTheResults() throws {
        try withKeychain { (fx) throws in
            for i in 0..<5 { try fx.add("svc", "acct\(i)") }
            let q: [String: Value] = ["class": .text("genp"), "svce": .text("svc"), "r_PersistentRef": .bool(true)]
            #expect(try fx.copy(q.merging(["m_Limit": .int(3)]) { $1 })?.array?.count == 3)
            #expect(try fx.copy(q.merging(["m_Limit": .text("m_LimitAll")]) { $1 })?.array?.count == 5)
        }
    }

    @Test func resultShapeForEachReturnCombination() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "s", ["labl": .text("L")])
            func copy(_ flags: [String]) throws -> Value? {
                var q = query("svc", "alice")
                for f in flags { q[f] = .bool(true) }
                return try fx.copy(q)
            }
            #expect(try copy([]) == nil)
            #expect(try copy(["r_Data"]) == bytes("s"))
            let ref = try #require(copy(["r_PersistentRef"])?.bytes)
            #expect(ref.count == 20 && ref.starts(with: Array("genp".utf8)))
            let attrs = try #require(copy(["r_Attributes"])?.map)
            for key in ["agrp", "pdmn", "sync", "cdat", "mdat", "svce", "acct", "labl"] {
                #expect(attrs[key] != nil, "\(key)")
            }
            #expect(attrs["v_Data"] == nil && attrs["v_PersistentRef"] == nil && attrs["class"] == nil)
            let dataAndRef = try #require(copy(["r_Data", "r_PersistentRef"])?.map)
            #expect(dataAndRef == ["v_Data": bytes("s"), "v_PersistentRef": .bytes(ref)])
            let all = try #require(copy(["r_Data", "r_Attributes", "r_PersistentRef"])?.map)
            #expect(all["v_Data"] == bytes("s") && all["v_PersistentRef"] == .bytes(ref) && all["labl"] == .text("L"))
            let attrsAndData = try #require(copy(["r_Data", "r_Attributes"])?.map)
            #expect(
                attrsAndData["v_Data"] == bytes("s") && attrsAndData["v_PersistentRef"] == nil
                    && attrsAndData["acct"] == .text("alice"))
            // False flags are the same as absent ones.
            var q = query("svc", "alice")
            q["r_Data"] = .bool(false)
            #expect(try fx.copy(q) == nil)
        }
    }

    @Test func aLockedClassAbortsTheWholeCopy() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "always", ["pdmn": .text("dk")])
            try fx.add("svc", "unlocked", ["pdmn": .text("ak")])
            fx.service.vault.lock([.whenUnlocked, .whenUnlockedThisDeviceOnly])
            let all: [String: Value] = [
                "class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            ]
            #expect(status { try fx.copy(all) } == .interactionNotAllowed)
            #expect(status { try fx.copy(query("svc", "unlocked", ["r_Data": .bool(true)])) } == .interactionNotAllowed)
            #expect(status { try fx.add("svc", "new") } == .interactionNotAllowed)
            // Filtering by class in SQL avoids the locked rows, as on Apple's keychain.
            #expect(try fx.copy(all.merging(["pdmn": .text("dk")]) { $1 })?.array?.count == 1)
            try fx.service.vault.unlock()
            #expect(try fx.copy(all)?.array?.count == 2)
        }
    }

    @Test func alwaysItemsStayReadableWhileLocked() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "dev", secret: "uuid", ["pdmn": .text("dku")])
            fx.service.vault.lock(ProtectionClass.allCases.filter { !$0.isAlways })
            #expect(try fx.secret("svc", "dev") == "uuid")
        }
    }

    @Test func lookupByServiceAndAccountIsAnIndexedPointSelect() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let parsed = try ParsedQuery(query("svc", "alice", ["r_Data": .bool(true)]), for: .copy)
            let scope = try AccessPolicy.scope(naming: parsed.attributes[.accessGroup]?.text, Fixture.app)
            let filter = fx.service.rowFilter(
                parsed, scope: scope, withSecret: true, indexer: try fx.service.vault.indexer())
            #expect(filter.uniqueIndexes?.count == 2)  // one digest per caller group
            let plan = try explain(fx, filter.sql, parameters: filter.uniqueIndexes!)
            #expect(plan.contains("USING INDEX sqlite_autoindex_items_2"), "\(plan)")
            #expect(!plan.contains("SCAN"), "\(plan)")
            // Service only: a search of the (agrp_ix, svce_ix, acct_ix) index by the caller's groups
            // and the service, for the rowids alone (the index covers it).
            let svcOnly = fx.service.rowFilter(
                try ParsedQuery(["class": .text("genp"), "svce": .text("svc")], for: .copy), scope: scope,
                withSecret: false, indexer: try fx.service.vault.indexer())
            let plan2 = try explain(fx, svcOnly.sql, parameters: [svcOnly.serviceIndex!] + svcOnly.accessGroupIndexes!)
            #expect(
                plan2.contains(
                    "SEARCH items USING COVERING INDEX items_by_group_service_account (agrp_ix=? AND svce_ix=?)"),
                "\(plan2)")
        }
    }

    /// Queries an app makes without a service or account still search the index by its groups: all
    /// its items, and its items of one account (the account is matched inside the index, on digests).
    /// The index gives the matching rowids alone, and the rows are read by rowid in order: no
    /// temporary b-tree, which would hold every matching row, sealed secret and all, before the
    /// first came back (300 items of 1 MB: 180 MB, even for m_Limit 1).
    @Test func lookupsByGroupOrAccountSearchTheCallersGroups() throws {
        func expectIndexedWithoutSort(
            _ plan: String, _ condition: String, sourceLocation: SourceLocation = #_sourceLocation
        ) {
            #expect(
                plan.contains("SEARCH items USING COVERING INDEX items_by_group_service_account \(condition)"),
                "\(plan)", sourceLocation: sourceLocation)
            #expect(
                plan.contains("SEARCH items USING INTEGER PRIMARY KEY (rowid=?)"), "\(plan)",
                sourceLocation: sourceLocation)
            #expect(!plan.contains("TEMP B-TREE"), "\(plan)", sourceLocation: sourceLocation)
            #expect(!plan.contains("SCAN items"), "\(plan)", sourceLocation: sourceLocation)
        }
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let scope = try AccessPolicy.scope(naming: nil, Fixture.app)
            for withSecret in [false, true] {
                let all = fx.service.rowFilter(
                    try ParsedQuery(["class": .text("genp"), "m_Limit": .text("m_LimitAll")], for: .copy), scope: scope,
                    withSecret: withSecret, indexer: try fx.service.vault.indexer())
                expectIndexedWithoutSort(try explain(fx, all.sql, parameters: all.accessGroupIndexes!), "(agrp_ix=?)")
            }
            let byAccount = fx.service.rowFilter(
                try ParsedQuery(["class": .text("genp"), "acct": .text("alice")], for: .copy), scope: scope,
                withSecret: true, indexer: try fx.service.vault.indexer())
            expectIndexedWithoutSort(
                try explain(fx, byAccount.sql, parameters: [byAccount.accountIndex!] + byAccount.accessGroupIndexes!),
                "(agrp_ix=?)")
            // An app of one group asking by service: the search names group and service. (With an
            // index per column SQLite took the group's index here and read every row of the group.)
            let oneGroup = try AccessPolicy.scope(naming: nil, Caller(accessGroups: ["TEAM.app"]))
            let byService = fx.service.rowFilter(
                try ParsedQuery(["class": .text("genp"), "svce": .text("svc")], for: .copy), scope: oneGroup,
                withSecret: true, indexer: try fx.service.vault.indexer())
            expectIndexedWithoutSort(
                try explain(fx, byService.sql, parameters: [byService.serviceIndex!] + byService.accessGroupIndexes!),
                "(agrp_ix=? AND svce_ix=?)")
        }
    }
}

func explain(_ fx: Fixture, _ sql: String, parameters: [[UInt8]]) throws -> String {
    let db = try SQLiteConnection(path: fx.databasePath, create: false)
    defer { db.close() }
    return try db.withStatement("EXPLAIN QUERY PLAN " + sql) { (s) throws(KeychainError) -> String in
        for (i, p) in parameters.enumerated() { try s.bind(Int32(i + 1), p) }
        var lines: [String] = []
        while try s.step() { lines.append(s.text(3) ?? "") }
        return lines.joined(separator: "\n")
    }
}
