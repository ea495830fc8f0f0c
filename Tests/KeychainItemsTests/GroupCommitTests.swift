import Foundation
import KeychainCore
import KeychainItemsTestSupport
import Testing

@testable import KeychainItems

/// Concurrent writes share commits (ItemStore.write); each must still be atomic and durable on its own.
@Suite("GroupCommitRules")
struct GroupCommitTests {
    @Test func concurrentWritersAreEachDurableAfterReopen() throws {
        try withKeychain { (fx) throws in
            let service = fx.service
            let results = ResultBox()
            onThreads(8) { t in
                for i in 0..<50 {
                    results.append(
                        status { try service.add(item("gc", "t\(t)-\(i)", secret: "\(t)/\(i)"), caller: Fixture.app) })
                }
            }
            #expect(results.values.count == 400)
            #expect(results.values.allSatisfy { $0 == .success })
            try fx.reopen()
            #expect(try fx.count() == 400)
            #expect(try fx.secret("gc", "t7-49") == "7/49")
        }
    }

    @Test func aFailingWriteInAGroupDoesNotUndoTheOthers() throws {
        try withKeychain { (fx) throws in
            try fx.add("gc", "taken")
            let service = fx.service
            let results = ResultBox()
            // Half the writers collide with an existing item; the other half add new ones at the same time.
            onThreads(8) { t in
                for i in 0..<30 {
                    let account = t % 2 == 0 ? "taken" : "new-\(t)-\(i)"
                    results.append(status { try service.add(item("gc", account, secret: "x"), caller: Fixture.app) })
                }
            }
            #expect(results.values.filter { $0 == .duplicateItem }.count == 120)
            #expect(results.values.filter { $0 == .success }.count == 120)
            try fx.reopen()
            #expect(try fx.count() == 121)
        }
    }
}
