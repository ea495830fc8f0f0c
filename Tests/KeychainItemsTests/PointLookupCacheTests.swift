import Foundation
import KeychainCore
import KeychainItemsTestSupport
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainItems

/// Warm point lookups are served from a cache of sealed rows; every write must be visible at once.
@Suite("PointLookupCacheRules")
struct PointLookupCacheTests {
    @Test func anUpdateIsSeenByTheNextCopyOfACachedItem() throws {
        try withKeychain { (fx) throws in
            try fx.add("cache", "a", secret: "one")
            #expect(try fx.secret("cache", "a") == "one")
            #expect(try fx.secret("cache", "a") == "one")
            try fx.service.update(
                query("cache", "a"), attributes: ["v_Data": .bytes(Array("two".utf8))], caller: Fixture.app)
            #expect(try fx.secret("cache", "a") == "two")
        }
    }

    @Test func aDeleteIsSeenByTheNextCopyOfACachedItem() throws {
        try withKeychain { (fx) throws in
            try fx.add("cache", "a")
            #expect(try fx.secret("cache", "a") == "pw")
            try fx.service.delete(query("cache", "a"), caller: Fixture.app)
            #expect(status { try fx.secret("cache", "a") } == .itemNotFound)
        }
    }

    @Test func anAddIsSeenAfterACachedNotFound() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.secret("cache", "later") } == .itemNotFound)
            try fx.add("cache", "later", secret: "here")
            #expect(try fx.secret("cache", "later") == "here")
        }
    }

    @Test func aCachedAttributesOnlyReadStillReturnsTheSecretWhenAskedLater() throws {
        try withKeychain { (fx) throws in
            try fx.add("cache", "a", secret: "s")
            _ = try fx.attributes("cache", "a")
            #expect(try fx.secret("cache", "a") == "s")
        }
    }

    @Test func withTheCacheOffEveryCopyReadsTheDatabase() throws {
        try withKeychain { (fx) throws in
            fx.service.close()
            fx.service = try ItemService(directory: fx.directory, lookupCacheEntries: 0)
            #expect(status { try fx.secret("nocache", "a") } == .itemNotFound)
            try fx.add("nocache", "a", secret: "one")
            #expect(try fx.secret("nocache", "a") == "one")
            try fx.service.update(
                query("nocache", "a"), attributes: ["v_Data": .bytes(Array("two".utf8))], caller: Fixture.app)
            #expect(try fx.secret("nocache", "a") == "two")
            #expect(try fx.attributes("nocache", "a")["acct"] == .text("a"))
            try fx.service.delete(query("nocache", "a"), caller: Fixture.app)
            #expect(status { try fx.secret("nocache", "a") } == .itemNotFound)
            fx.service.close()
            #expect(status { try fx.secret("nocache", "a") } == .notAvailable)
        }
    }

    @Test func concurrentReadersNeverSeeAnAcknowledgedUpdateUndone() throws {
        try withKeychain { (fx) throws in
            try fx.add("cache", "counter", secret: "0")
            let service = fx.service
            let stop = ResultBox()
            let readers = Thread {
                onThreads(4) { _ in
                    var q = query("cache", "counter")
                    q["r_Data"] = .bool(true)
                    while stop.values.isEmpty { _ = try? service.copyMatching(q, caller: Fixture.app) }
                }
                stop.append(.internal)  // marks "readers finished"
            }
            readers.start()
            for i in 1...200 {
                try service.update(
                    query("cache", "counter"), attributes: ["v_Data": .bytes(Array("\(i)".utf8))], caller: Fixture.app)
                #expect(try fx.secret("cache", "counter") == "\(i)")
            }
            stop.append(.success)
            while !stop.values.contains(.internal) { usleep(1000) }
        }
    }

    /// One group (`agrp` named): a point lookup by one digest, which the cache answers from that
    /// digest alone. Every answer, warm or cold, in place or in full, is the uncached store's.
    @Test func aCopyByOneDigestAnswersAsWithoutTheCache() throws {
        typealias Answer = CopyInPlaceTests.Answer
        let temporary = try TemporaryDirectory(prefix: "kc-cache-one")
        defer { temporary.remove() }
        let directory = temporary.appending("data")
        let group: [String: Value] = ["agrp": .text("TEAM.app")]
        let shapes: [[String: Value]] = [
            ["r_Data": .bool(true)], ["r_PersistentRef": .bool(true)], [:],
            ["r_Data": .bool(true), "pdmn": .text("ak")], ["r_Data": .bool(true), "pdmn": .text("ck")],
            ["r_Attributes": .bool(true)], ["r_Attributes": .bool(true), "r_Data": .bool(true)],
        ].map { $0.merging(group) { a, _ in a } }
        let pairs = [("one", "ak"), ("one", "ck"), ("one", "none"), ("two", "ak")]
        func answers(_ service: ItemService, _ queries: [([String: Value], String, String)]) -> [Answer] {
            queries.map { (shape, svce, acct) in
                Answer { () throws(KeychainError) in
                    try service.copyMatching(query(svce, acct, shape), caller: Fixture.app)
                }
            }
        }
        func inPlace(_ service: ItemService, _ shape: [String: Value], _ svce: String, _ acct: String) throws -> Answer
        {
            let base = try service.compileCopy(query("base", "base", shape), caller: Fixture.app)
            guard service.copiesInPlace(base) else {
                return Answer { () throws(KeychainError) in
                    try service.copyMatching(query(svce, acct, shape), caller: Fixture.app)
                }
            }
            return Array(svce.utf8).withUnsafeBytes { s in
                Array(acct.utf8).withUnsafeBytes { a in
                    Answer { () throws(KeychainError) in try service.copy(base, service: s, account: a) }
                }
            }
        }
        let queries = shapes.flatMap { shape in pairs.map { (shape, $0.0, $0.1) } }
        // The truth, without the cache.
        var service = try ItemService(directory: directory, lookupCacheEntries: 0)
        _ = try service.add(item("one", "ak", secret: "s-ak", ["pdmn": .text("ak")]), caller: Fixture.app)
        _ = try service.add(item("one", "ck", secret: "s-ck", ["pdmn": .text("ck")]), caller: Fixture.app)
        _ = try service.add(
            item("two", "ak", secret: "other group", ["agrp": .text("TEAM.shared")]), caller: Fixture.app)
        let truth = answers(service, queries)
        #expect(truth.filter { if case .value = $0 { true } else { false } }.count > 10)
        service.close()
        // With the cache, from empty each round: each query cold and warm, in orders of the shapes
        // that leave a row cached by a read without the secret, then asked with it, and one cached
        // by a lookup of its class, then asked as another.
        let attributesFirst = queries.indices.sorted {
            (queries[$0].0["r_Data"] == nil) && (queries[$1].0["r_Data"] != nil)
        }
        for (round, order) in [Array(queries.indices), Array(queries.indices.reversed()), attributesFirst].enumerated()
        {
            service = try ItemService(directory: directory)
            defer { service.close() }
            for _ in 0..<2 {
                for i in order {
                    let (shape, svce, acct) = queries[i]
                    #expect(answers(service, [queries[i]]) == [truth[i]], "round \(round) \(shape) \(svce)/\(acct)")
                    #expect(
                        try inPlace(service, shape, svce, acct) == truth[i], "round \(round) \(shape) \(svce)/\(acct)")
                }
            }
        }
    }

    @Test func aWriteIsSeenByTheNextInPlaceCopyOfACachedItem() throws {
        try withKeychain { (fx) throws in
            let shape: [String: Value] = ["r_Data": .bool(true), "agrp": .text("TEAM.app")]
            let base = try fx.service.compileCopy(query("base", "base", shape), caller: Fixture.app)
            #expect(fx.service.copiesInPlace(base))
            func secret() throws -> String? {
                let value = try Array("cache".utf8).withUnsafeBytes { s in
                    try Array("a".utf8).withUnsafeBytes { a in try fx.service.copy(base, service: s, account: a) }
                }
                return value?.secretBytes.map { String(decoding: $0.unprotectedArray, as: UTF8.self) }
            }
            #expect(status { try secret() } == .itemNotFound)
            #expect(status { try secret() } == .itemNotFound)
            try fx.add("cache", "a", secret: "one")
            #expect(try secret() == "one")
            #expect(try secret() == "one")
            try fx.service.update(
                query("cache", "a"), attributes: ["v_Data": .bytes(Array("two".utf8))], caller: Fixture.app)
            #expect(try secret() == "two")
            #expect(try secret() == "two")
            try fx.service.delete(query("cache", "a"), caller: Fixture.app)
            #expect(status { try secret() } == .itemNotFound)
        }
    }
}
