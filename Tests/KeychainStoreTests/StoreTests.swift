import KeychainCore
import KeychainCrypto
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainStore

/// The store on its own: the row-state arithmetic, the SQL a filter becomes, the database lock, and
/// the golden database's row-state record.
@Suite struct StoreTests {
    @Test func sumsAddAndSubtractModulo2To256() {
        var one = Sum256()
        one.limbs.0 = 1
        var max = Sum256()
        max.limbs = (.max, .max, .max, .max)
        #expect(max + one == Sum256())  // wraps to zero
        #expect(Sum256() - one == max)
        let a = Sum256((0..<32).map { UInt8($0) })
        let b = Sum256((0..<32).map { UInt8(255 - $0) })
        #expect(a + b - b == a)
        #expect(a + b == b + a)
        #expect(Sum256(a.bytes) == a)
    }

    @Test func aRowKeepsEachColumnApartThroughChanges() {
        // One allocation holds every column: each must come back whole, whatever the others' lengths.
        func bytes(_ tag: UInt8, _ n: Int) -> [UInt8] { Array(repeating: tag, count: n) }
        var row = StoredItem(
            rowid: 7, ref: bytes(1, 16), protectionClass: 3, accessGroupIndex: bytes(2, 16), serviceIndex: [],
            accountIndex: bytes(4, 16), uniqueIndex: bytes(5, 32), wrappedKey: bytes(6, 61), attributes: bytes(7, 117),
            secret: bytes(8, 60), attributeIndexes: [[9]])
        func expectColumns(_ row: StoredItem, service: [UInt8], wrappedKey: [UInt8], secret: [UInt8]) {
            #expect(row.rowid == 7 && row.protectionClass == 3 && row.attributeIndexes == [[9]])
            #expect(row.ref == bytes(1, 16) && row.accessGroupIndex == bytes(2, 16) && row.serviceIndex == service)
            #expect(row.accountIndex == bytes(4, 16) && row.uniqueIndex == bytes(5, 32))
            #expect(row.wrappedKey == wrappedKey && row.attributes == bytes(7, 117) && row.secret == secret)
            row.withSealedColumns { c in
                #expect(Array(c.ref) == row.ref && Array(c.uniqueIndex) == row.uniqueIndex)
                #expect(Array(c.wrappedKey) == wrappedKey && Array(c.attributes) == row.attributes)
                #expect(Array(c.secret) == secret)
            }
        }
        expectColumns(row, service: [], wrappedKey: bytes(6, 61), secret: bytes(8, 60))
        let before = row
        row.serviceIndex = bytes(3, 16)
        row.wrappedKey = bytes(6, 72)
        row.secret = []
        expectColumns(row, service: bytes(3, 16), wrappedKey: bytes(6, 72), secret: [])
        expectColumns(before, service: [], wrappedKey: bytes(6, 61), secret: bytes(8, 60))  // a change copies
    }

    @Test func aFilterBecomesBoundSQLOfItsShape() {
        let point = RowFilter(uniqueIndexes: [[1], [2]], includeSecret: true)
        #expect(point.sql.contains("key_ix IN (?,?)") && point.sql.contains(", secret FROM items"))
        #expect(point.pointLookupKeys?.count == 2)
        let scan = RowFilter(serviceIndex: [3], accessGroupIndexes: [], classes: [6, 7])
        #expect(
            scan.sql.contains("svce_ix = ?") && scan.sql.contains("agrp_ix IN (NULL)")
                && scan.sql.contains("class IN (6,7)"))
        #expect(!scan.sql.contains("secret"))
        #expect(scan.pointLookupKeys == nil)
        // The item calls read rows without the search digests, a key-only copy without the attributes
        // either, and a lookup by one digest takes key_ix from the filter: fewer blob columns per row.
        let bare = RowFilter(uniqueIndexes: [[1]], includeSecret: true, includeSearchIndexes: false)
        #expect(bare.sql.hasPrefix("SELECT rowid, ref, class, item_key, attributes, secret FROM items"))
        var keyOnly = bare
        keyOnly.includeAttributes = false
        #expect(keyOnly.sql.hasPrefix("SELECT rowid, ref, class, item_key, secret FROM items"))
        #expect(
            point.sql.hasPrefix(
                "SELECT rowid, ref, class, item_key, key_ix, attributes, agrp_ix, svce_ix, acct_ix, secret FROM items"))
        // Point lookups of one to four digests take SQL made once; any other shape builds its own.
        for count in 1...6 {
            for secret in [false, true] {
                let marks = Array(repeating: "?", count: count).joined(separator: ",")
                let plain = RowFilter(uniqueIndexes: Array(repeating: [9], count: count), includeSecret: secret)
                #expect(plain.sql.hasSuffix("FROM items WHERE key_ix IN (\(marks)) ORDER BY rowid"))
                #expect(plain.sql.contains(", secret FROM") == secret)
                var classes = plain
                classes.classes = [6]
                #expect(classes.sql.hasSuffix("WHERE key_ix IN (\(marks)) AND class IN (6) ORDER BY rowid"))
                #expect(classes.sql.contains(", secret FROM") == secret)
            }
        }
    }

    @Test func oneDatabaseIsOpenedByOneStoreAtATime() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-store")
        let path = temporary.appending("keychain.db")
        let first = try ItemStore(path: path)
        do {
            _ = try ItemStore(path: path)
            Issue.record("a second store opened a database that is in use")
        } catch {
            #expect(error.status == .notAvailable && error.message.contains("another keychaind"))
        }
        first.close()
        let again = try ItemStore(path: path)
        again.close()
    }

    @Test func theGoldenDatabasesRowStateRecordVerifies() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-store-golden")
        try Golden.copyKeychain("keychain-v1", to: temporary.appending("data"))
        let store = try ItemStore(path: temporary.appending("data/keychain.db"))
        defer { store.close() }
        let deviceKey = try #require(try DeviceKeyFile.load(path: temporary.appending("data/device.key")))
        let keyring = try #require(try store.meta("keyring"))
        let vault = try Vault.open(deviceKey: deviceKey, keyring: keyring)
        let check = try store.attachRowState(key: vault.rowStateKey, policy: .verify)
        #expect(check.rows == 4 && !check.resealed && check.markProblem == nil)
    }

    @Test func aRowReadInPartIsNeverWrittenBack() throws {
        // Copies read rows without their search digests: written back, such a row would blank three
        // columns and record them blank in the row state. The writer refuses it; a whole row passes.
        let temporary = try TemporaryDirectory(prefix: "kc-store-partial")
        try Golden.copyKeychain("keychain-v1", to: temporary.appending("data"))
        let path = temporary.appending("data/keychain.db")
        let deviceKey = try #require(try DeviceKeyFile.load(path: temporary.appending("data/device.key")))
        let store = try ItemStore(path: path)
        let vault = try Vault.open(deviceKey: deviceKey, keyring: try #require(try store.meta("keyring")))
        _ = try store.attachRowState(key: vault.rowStateKey, policy: .verify)
        func firstRow(_ filter: RowFilter) throws -> StoredItem? {
            try store.read { (reader) throws(KeychainError) in
                var found: StoredItem?
                try reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                    found = row
                    return false
                }
                return found
            }
        }
        let partial = try #require(try firstRow(RowFilter(includeSecret: true, includeSearchIndexes: false)))
        #expect(partial.isPartial && partial.accessGroupIndex.isEmpty)
        do {
            try store.write { (w) throws(KeychainError) in try w.update(partial) }
            Issue.record("a row read without its search digests was written back")
        } catch {
            #expect(error.status == .internal && error.message.contains("read in part"))
        }
        let whole = try #require(try firstRow(RowFilter(includeSecret: true)))
        #expect(!whole.isPartial && whole.accessGroupIndex.count == 16 && whole.rowid == partial.rowid)
        try store.write { (w) throws(KeychainError) in try w.update(whole) }
        store.close()
        // The row state still verifies: nothing was written blank.
        let again = try ItemStore(path: path)
        defer { again.close() }
        let check = try again.attachRowState(key: vault.rowStateKey, policy: .verify)
        #expect(check.rows == 4 && check.markProblem == nil)
    }
}
