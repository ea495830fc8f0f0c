import Foundation
import KeychainCore
import KeychainItemsTestSupport
import KeychainSystem
import Testing

@testable import KeychainItems
@testable import KeychainStore

/// The row-state record (KeychainStore/RowState.swift): rows removed, added, swapped or replayed from
/// an older copy of the database are refused when the keychain opens, with the way to accept them;
/// damage inside a sealed blob stays that item's own errSecDecode; every kind of write, including
/// writes that fail and roll back, keeps the record in step with the rows.
@Suite struct RowStateRules {
    /// Runs SQL on the database file with the keychain closed (a tamperer with the file).
    func tamper(_ fx: Fixture, _ sql: String) throws {
        fx.service.close()
        let db = try SQLiteConnection(path: fx.databasePath, create: false)
        defer { db.close() }
        try db.execute(sql)
    }

    func openError(_ fx: Fixture) throws -> KeychainError {
        try #require(failure { try fx.reopen() }, "the keychain opened over tampered rows")
    }

    /// A copy of the database as it is now (the WAL checkpointed first, by closing).
    func snapshot(_ fx: Fixture) throws -> String {
        fx.service.close()
        let copy = fx.root + "/older-\(UUID().uuidString).db"
        try FileManager.default.copyItem(atPath: fx.databasePath, toPath: copy)
        try fx.reopen()
        return copy
    }

    @Test func everyKindOfWriteKeepsTheRecordInStep() throws {
        try withKeychain { (fx) throws in
            for i in 0..<20 { try fx.add("svc", "a\(i)", secret: "s\(i)", i % 2 == 0 ? ["pdmn": .text("cku")] : [:]) }
            #expect(status { try fx.add("svc", "a1") } == .duplicateItem)  // rolled back
            try fx.service.update(query("svc", "a2"), attributes: ["v_Data": bytes("new")], caller: Fixture.app)
            try fx.service.update(
                query("svc", "a3"), attributes: ["labl": .text("only attributes")], caller: Fixture.app)
            #expect(
                status {
                    try fx.service.update(query("svc", "a4"), attributes: ["acct": .text("a5")], caller: Fixture.app)
                } == .duplicateItem)
            try fx.service.delete(query("svc", "a6"), caller: Fixture.app)
            // Many writers at once, some failing, committed in shared groups.
            let service = fx.service
            onThreads(8) { t in
                for j in 0..<25 {
                    _ = try? service.add(item("threads", "t\(t)-\(j % 20)"), caller: Fixture.app)  // 5 duplicates each
                    if j % 7 == 0 { _ = try? service.delete(query("threads", "t\(t)-\(j)"), caller: Fixture.app) }
                }
            }
            let expected = try fx.count()
            try fx.reopen()
            #expect(try fx.count() == expected)
            #expect(fx.service.rowCheck.rows == Int64(expected))
            #expect(!fx.service.rowCheck.resealed)
            // Removing the passphrase deletes every akpu row in one statement.
            _ = try fx.service.changePassphrase(old: nil, new: pass("pw-1"))
            for i in 0..<10 { try fx.add("passcode", "p\(i)", ["pdmn": .text("akpu")]) }
            _ = try fx.service.changePassphrase(old: pass("pw-1"), new: nil)
            try fx.reopen()
            #expect(try fx.count() == expected)
        }
    }

    @Test func aWriteThatFailsAfterChangingRowsLeavesTheRecordAsItWas() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            let row = StoredItem(
                ref: Array(repeating: 7, count: 16), protectionClass: 6, accessGroupIndex: [1], serviceIndex: [2],
                accountIndex: [3], uniqueIndex: Array(repeating: 9, count: 32), wrappedKey: [4], attributes: [5],
                secret: [6])
            var error: KeychainError?
            do {
                try fx.service.store.write { (w) throws(KeychainError) in
                    try w.insert(row)
                    try w.delete(rowid: 1)
                    throw KeychainError(.param, "abandoned after changing rows")
                }
            } catch let e as KeychainError { error = e }
            #expect(error?.message == "abandoned after changing rows")
            // The same among concurrent writers, where failed and kept writes share one commit.
            let service = fx.service
            onThreads(8) { t in
                for j in 0..<40 {
                    var phantom = row
                    phantom.ref = Array(repeating: UInt8(t), count: 8) + Array(repeating: UInt8(j), count: 8)
                    phantom.uniqueIndex = phantom.ref + phantom.ref
                    _ = try? service.store.write { (w) throws(KeychainError) in
                        try w.insert(phantom)
                        throw KeychainError(.param, "abandoned")
                    }
                    _ = try? service.add(item("threads", "t\(t)-\(j)"), caller: Fixture.app)
                }
            }
            try fx.reopen()
            #expect(try fx.count() == 1 + 8 * 40 && !fx.service.rowCheck.resealed)
        }
    }

    /// SQLITE_FULL in the middle of group commits (the database capped a few pages above its size):
    /// exactly the acknowledged adds are there afterwards, and the record still matches the rows.
    @Test func aFullDiskAmongConcurrentWritersLosesNoAcknowledgedWriteAndKeepsTheRecordInStep() throws {
        try withKeychain { (fx) throws in
            for i in 0..<20 { try fx.add("base", "b\(i)") }
            try fx.service.store.write { (w) throws(KeychainError) in
                let pages = try w.db.withStatement("PRAGMA page_count") { (s) throws(KeychainError) in
                    _ = try s.step()
                    return s.int64(0)
                }
                try w.db.execute("PRAGMA max_page_count = \(pages + 4)")
            }
            let acknowledged = Locked<Set<String>>([])
            let failed = Locked<[Status: Int]>([:])
            let service = fx.service
            onThreads(8) { t in
                for j in 0..<30 {
                    let account = "t\(t)-\(j)"
                    do throws(KeychainError) {
                        _ = try service.add(
                            item("full", account, secret: String(repeating: "x", count: 3000)), caller: Fixture.app)
                        acknowledged.withLock { _ = $0.insert(account) }
                    } catch {
                        failed.withLock { $0[error.status, default: 0] += 1 }
                    }
                }
            }
            let failures = failed.withLock { $0 }
            #expect(failures[.io, default: 0] > 0, "the cap never filled the database: \(failures)")
            #expect(Set(failures.keys).isSubset(of: [.io]), "\(failures)")
            try fx.reopen()  // the cap was the writer connection's: gone now
            #expect(!fx.service.rowCheck.resealed)
            let listed = try fx.copy([
                "class": .text("genp"), "svce": .text("full"), "m_Limit": .text("m_LimitAll"),
                "r_Attributes": .bool(true),
            ])
            let present = Set((listed?.array ?? []).compactMap { $0.map?["acct"]?.text })
            #expect(present == acknowledged.withLock { $0 })
            #expect(try fx.count() == 20 + present.count)
        }
    }

    @Test func anItemsOlderRowPutBackIsRefusedAtOpenAndCanBeAccepted() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "old")
            try fx.add("svc", "b", secret: "b")
            let older = try snapshot(fx)
            try fx.service.update(query("svc", "a"), attributes: ["v_Data": bytes("new")], caller: Fixture.app)
            try tamper(
                fx,
                "ATTACH '\(older)' AS old; DELETE FROM items WHERE rowid = 1; INSERT INTO items SELECT * FROM old.items WHERE rowid = 1;"
            )
            let error = try openError(fx)
            #expect(error.status == .decode)
            #expect(error.message.contains("holds 2 items, as recorded") && error.message.contains("older copy"))
            #expect(error.message.contains("keychaind --accept-database"))
            // Refusing changed nothing: refused again. Accepting trusts the rows as they are.
            #expect(try openError(fx).status == .decode)
            try fx.reopen(acceptCurrentRows: true)
            #expect(fx.service.rowCheck.resealed && fx.service.rowCheck.rows == 2)
            #expect(try fx.secret("svc", "a") == "old")
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            #expect(try fx.secret("svc", "b") == "b")
        }
    }

    @Test func anOlderSecretColumnAloneIsRefused() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "old")
            let older = try snapshot(fx)
            // Only the label changes: the item key stays, so the old secret blob would still open.
            try fx.service.update(query("svc", "a"), attributes: ["v_Data": bytes("new")], caller: Fixture.app)
            try tamper(
                fx,
                "ATTACH '\(older)' AS old; UPDATE items SET secret = (SELECT secret FROM old.items WHERE rowid = 1) WHERE rowid = 1;"
            )
            #expect(
                try openError(fx).message.contains("not the versions of its items or settings keychaind last wrote"))
        }
    }

    @Test func aRemovedOrResurrectedRowIsRefused() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            try fx.add("svc", "b")
            let older = try snapshot(fx)
            try tamper(fx, "DELETE FROM items WHERE rowid = 2")
            #expect(try openError(fx).message.contains("holds 1 item where keychaind last recorded 2"))
            try fx.reopen(acceptCurrentRows: true)
            try fx.add("svc", "c")
            try fx.service.delete(query("svc", "a"), caller: Fixture.app)
            try tamper(fx, "ATTACH '\(older)' AS old; INSERT INTO items SELECT * FROM old.items WHERE rowid = 1;")
            #expect(try openError(fx).message.contains("holds 2 items where keychaind last recorded 1"))
        }
    }

    @Test func anOlderKeyringPutBackIsRefused() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            let older = try snapshot(fx)
            // Setting a passphrase re-wraps the same class keys: the older keyring would open the
            // keychain without it. Meta rows are in the sum, so it is refused instead.
            _ = try fx.service.changePassphrase(old: nil, new: pass("pw-1"))
            try tamper(
                fx,
                "ATTACH '\(older)' AS old; UPDATE meta SET value = (SELECT value FROM old.meta WHERE name = 'keyring') WHERE name = 'keyring';"
            )
            #expect(
                try openError(fx).message.contains("not the versions of its items or settings keychaind last wrote"))
        }
    }

    @Test func aClassColumnMovedPastEightBitsIsRefused() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", ["pdmn": .text("ck")])
            try tamper(fx, "UPDATE items SET class = class + 256")
            #expect(try openError(fx).status == .decode)
        }
    }

    @Test func aSecondStoreOnTheSameDatabaseIsRefusedWhileTheFirstIsOpen() throws {
        try withKeychain { (fx) throws in
            let second = try #require(failure { try ItemService(directory: fx.directory) })
            #expect(second.status == .notAvailable && second.message.contains("already serving"))
            try fx.reopen()  // closing lets go of the lock
            #expect(try fx.count() == 0)
        }
    }

    @Test func blobsSwappedBetweenRowsAreRefused() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "alice")
            try fx.add("svc", "b", secret: "bob")
            try tamper(
                fx,
                """
                CREATE TEMP TABLE t AS SELECT rowid AS r, secret FROM items;
                UPDATE items SET secret = (SELECT secret FROM t WHERE r = 3 - items.rowid);
                """)
            #expect(try openError(fx).status == .decode)
            // Accepted anyway: AEAD still refuses each swapped secret, never hands out the other one.
            try fx.reopen(acceptCurrentRows: true)
            #expect(status { try fx.secret("svc", "a") } == .decode)
            #expect(status { try fx.secret("svc", "b") } == .decode)
        }
    }

    @Test func aDeletedOrDamagedRecordIsRefusedNotRecreated() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            try tamper(fx, "DELETE FROM meta WHERE name = 'rows'")
            let missing = try openError(fx)
            #expect(missing.status == .decode && missing.message.contains("no row-state record"))
            #expect(try openError(fx).message.contains("no row-state record"))  // still refused: not recreated
            try fx.reopen(acceptCurrentRows: true)
            try tamper(fx, "UPDATE meta SET value = x'01' WHERE name = 'rows'")
            let damaged = try openError(fx)
            #expect(
                damaged.message.contains("row-state record is damaged") && damaged.message.contains("--accept-database")
            )
            try fx.reopen(acceptCurrentRows: true)  // a damaged record is rewritten like a missing one
            #expect(fx.service.rowCheck.resealed)
            try fx.reopen()
            // Emptying the table and dropping the record does not pass as a new, empty keychain.
            try tamper(fx, "DELETE FROM items; DELETE FROM meta WHERE name = 'rows'")
            #expect(try openError(fx).message.contains("no row-state record"))
        }
    }

    /// Keyring, record and items all gone, device.key and the generation mark still there: not a
    /// first start, so not a new empty keychain.
    @Test func aDatabaseEmptiedOfEverythingIsNotTakenForANewKeychain() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            try tamper(fx, "DELETE FROM items; DELETE FROM meta")
            let error = try openError(fx)
            #expect(error.status == .decode && error.message.contains("holds no keychain"), "\(error.message)")
            #expect(try openError(fx).message.contains("holds no keychain"))  // nothing was created meanwhile
        }
    }

    @Test func damageInsideASealedBlobStaysThatItemsOwnError() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "alice")
            try fx.add("svc", "b", secret: "bob")
            // Flip the last byte of a's secret (its tag, not its nonce): the row keeps its fingerprint.
            fx.service.close()
            let db = try SQLiteConnection(path: fx.databasePath, create: false)
            var sealed = try db.withStatement("SELECT secret FROM items WHERE rowid = 1") { (s) throws(KeychainError) in
                _ = try s.step()
                return s.blob(0)
            }
            sealed[sealed.count - 1] ^= 0x01
            try db.withStatement("UPDATE items SET secret = ? WHERE rowid = 1") { (s) throws(KeychainError) in
                try s.bind(1, sealed)
                try s.run()
            }
            db.close()
            try fx.reopen()
            #expect(status { try fx.secret("svc", "a") } == .decode)
            #expect(try fx.secret("svc", "b") == "bob")
        }
    }

    /// The whole file replaced by an older copy: consistent rows, consistent record, but a generation
    /// below the mark kept beside it.
    @Test func anOlderCopyOfTheWholeDatabaseIsRefusedByTheGenerationMark() throws {
        try withKeychain { (fx) throws in
            let fm = FileManager.default
            try fx.add("svc", "a", secret: "old")
            let older = try snapshot(fx)
            let olderMark = fx.root + "/older.mark"
            try fm.copyItem(atPath: fx.databasePath + "-generation", toPath: olderMark)
            try fx.service.update(query("svc", "a"), attributes: ["v_Data": bytes("new")], caller: Fixture.app)
            try fx.add("svc", "b")
            fx.service.close()
            let current = fx.root + "/current.db"
            try fm.copyItem(atPath: fx.databasePath, toPath: current)

            try fm.removeItem(atPath: fx.databasePath)
            try fm.copyItem(atPath: older, toPath: fx.databasePath)
            let error = try openError(fx)
            #expect(error.status == .decode && error.message.contains("is an older copy"), "\(error.message)")
            #expect(error.message.contains("--accept-database"))

            // The current file back: opens as if nothing happened.
            try fm.removeItem(atPath: fx.databasePath)
            try fm.copyItem(atPath: current, toPath: fx.databasePath)
            try fx.reopen()
            #expect(try fx.secret("svc", "a") == "new" && !fx.service.rowCheck.resealed)

            // The older copy accepted on purpose: it is the keychain from then on, and stays accepted.
            fx.service.close()
            try fm.removeItem(atPath: fx.databasePath)
            try fm.copyItem(atPath: older, toPath: fx.databasePath)
            try fx.reopen(acceptCurrentRows: true)
            #expect(fx.service.rowCheck.resealed && fx.service.rowCheck.rows == 1)
            #expect(try fx.secret("svc", "a") == "old")
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            #expect(try fx.secret("svc", "a") == "old")
            try fx.add("svc", "c")

            // A missing mark is recreated from the database; a damaged one likewise (neither refuses).
            fx.service.close()
            try fm.removeItem(atPath: fx.databasePath + "-generation")
            try fx.reopen()
            #expect(fm.fileExists(atPath: fx.databasePath + "-generation"))
            fx.service.close()
            try Data([1, 2, 3]).write(to: URL(fileURLWithPath: fx.databasePath + "-generation"))
            try fx.reopen()
            #expect(try fx.count() == 2)

            // The database and its mark restored together (a whole data-directory backup): accepted,
            // as nothing tells it from a keychain that was never changed since.
            fx.service.close()
            for (from, to) in [(older, fx.databasePath), (olderMark, fx.databasePath + "-generation")] {
                try fm.removeItem(atPath: to)
                try fm.copyItem(atPath: from, toPath: to)
            }
            try fx.reopen()
            #expect(try fx.count() == 1 && !fx.service.rowCheck.resealed)
        }
    }

    /// (That the mark is never ahead after a kill -9 is shown by scripts/crash-test, whose restarts
    /// after every SIGKILL would be refused otherwise.)
    @Test func theMarkCatchesUpWithTheDatabaseAtClose() throws {
        try withKeychain { (fx) throws in
            for i in 0..<30 { try fx.add("svc", "a\(i)") }
            let committed = fx.service.rowCheck.generation
            fx.service.close()
            // 1 (create) + 30 adds: each add is its own commit here, so the generation moved 30 times.
            let mark = try Data(contentsOf: URL(fileURLWithPath: fx.databasePath + "-generation"))
            let generation = mark[1..<9].enumerated().reduce(UInt64(0)) {
                $0 | UInt64($1.element) << (8 * UInt64($1.offset))
            }
            #expect(generation == committed + 30)
            try fx.reopen()
            #expect(fx.service.rowCheck.generation == generation)
        }
    }
}
