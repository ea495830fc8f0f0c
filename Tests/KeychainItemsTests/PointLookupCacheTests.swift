import Foundation
import KeychainCore
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
}
