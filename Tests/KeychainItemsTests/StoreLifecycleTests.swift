import Foundation
import KeychainCore
import KeychainItemsTestSupport
import KeychainStore
import Testing

@testable import KeychainItems

@Suite struct StoreLifecycle {
    @Test func reopenAfterCloseKeepsEverything() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "1", ["pdmn": .text("cku"), "labl": .text("L")])
            try fx.add("svc", "b", secret: "2", ["sync": .bool(true)])
            let before = try fx.attributes("svc", "a")
            try fx.reopen()
            #expect(try fx.count() == 2)
            #expect(try fx.secret("svc", "a") == "1")
            #expect(try fx.secret("svc", "b", ["sync": .bool(true)]) == "2")
            #expect(try fx.attributes("svc", "a") == before)
            #expect(status { try fx.add("svc", "a") } == .duplicateItem)
        }
    }

    /// The WAL's index is in memory while the store is open: no `-shm` file, and one left by an
    /// earlier version is removed at open without losing anything. (That another process's SQLite
    /// is told the database is locked is checked end to end, through the daemon, in
    /// `DaemonLifecycleTests.testALinkToTheDatabaseInAppsDIsRefusedAndTheLockHolds`.)
    @Test func noShmFileAndAStaleOneIsRemoved() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "1")
            let shm = fx.databasePath + "-shm"
            #expect(!FileManager.default.fileExists(atPath: shm))
            fx.service.close()
            try Data(repeating: 0xA5, count: 32768).write(to: URL(fileURLWithPath: shm))
            try fx.reopen()
            #expect(!FileManager.default.fileExists(atPath: shm))
            #expect(try fx.secret("svc", "a") == "1")
        }
    }

    @Test func callsAfterCloseAreNotAvailable() throws {
        try withKeychain { (fx) throws in
            fx.service.close()
            #expect(status { try fx.copy(query("svc", "a")) } == .notAvailable)
            #expect(status { try fx.add("svc", "a") } == .notAvailable)
        }
    }

    @Test func missingDeviceKeyWithAnExistingDatabaseIsAClearErrorNotAReset() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            fx.service.close()
            try FileManager.default.removeItem(atPath: fx.keyPath)
            let error = try #require(failure { try ItemService(directory: fx.directory) })
            #expect(error.status == .notAvailable)
            #expect(error.message.contains("device.key") && error.message.contains("missing"))
            #expect(!FileManager.default.fileExists(atPath: fx.keyPath))
        }
    }

    @Test func anotherDevicesKeyDoesNotOpenTheDatabase() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            fx.service.close()
            let other = try Fixture()
            defer { other.cleanup() }
            try FileManager.default.removeItem(atPath: fx.keyPath)
            try FileManager.default.copyItem(atPath: other.keyPath, toPath: fx.keyPath)
            #expect(failure { try ItemService(directory: fx.directory) }?.status == .decode)
        }
    }

    @Test func aDatabaseFromANewerSchemaIsRefused() throws {
        try withKeychain { (fx) throws in
            fx.service.close()
            let db = try SQLiteConnection(path: fx.databasePath, create: false)
            try db.execute("PRAGMA user_version = 99")
            db.close()
            let error = try #require(failure { try ItemService(directory: fx.directory) })
            #expect(error.message.contains("newer"))
        }
    }

    @Test func concurrentAddsOfOneItemLetExactlyOneWin() throws {
        try withKeychain { (fx) throws in
            let service = fx.service
            let results = ResultBox()
            let threads = 16
            let group = DispatchGroup()
            for i in 0..<threads {
                group.enter()
                Thread.detachNewThread {
                    let s = status { try service.add(item("race", "same", secret: "t\(i)"), caller: Fixture.app) }
                    results.append(s)
                    group.leave()
                }
            }
            group.wait()
            let all = results.values
            #expect(all.count == threads)
            #expect(all.filter { $0 == .success }.count == 1)
            #expect(all.filter { $0 == .duplicateItem }.count == threads - 1)
            #expect(try fx.count() == 1)
        }
    }

    @Test func readsAndWritesFromManyThreadsAgree() throws {
        try withKeychain { (fx) throws in
            let service = fx.service
            let results = ResultBox()
            let group = DispatchGroup()
            for t in 0..<8 {
                group.enter()
                Thread.detachNewThread {
                    for i in 0..<20 {
                        results.append(
                            status {
                                try service.add(item("svc", "t\(t)-\(i)", secret: "\(t)-\(i)"), caller: Fixture.app)
                            })
                        var q = query("svc", "t\(t)-\(i)")
                        q["r_Data"] = .bool(true)
                        let got = try? service.copyMatching(q, caller: Fixture.app)
                        results.append(got == bytes("\(t)-\(i)") ? .success : .internal)
                    }
                    group.leave()
                }
            }
            group.wait()
            #expect(results.values.allSatisfy { $0 == .success })
            #expect(try fx.count() == 160)
        }
    }
}

final class ResultBox: @unchecked Sendable {
    private let lock = NSLock()
    private var storage: [Status] = []
    func append(_ s: Status) {
        lock.lock()
        storage.append(s)
        lock.unlock()
    }
    var values: [Status] {
        lock.lock()
        defer { lock.unlock() }
        return storage
    }
}
