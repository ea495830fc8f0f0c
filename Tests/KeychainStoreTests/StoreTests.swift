import Dispatch
import Glibc
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
        // The lookup cache keys digests of 32 bytes only: a point lookup by others reads the database.
        #expect(point.isPointLookup && point.pointLookupKeys == nil)
        let digests = RowFilter(uniqueIndexes: [Array(repeating: 1, count: 32), Array(repeating: 2, count: 32)])
        #expect(digests.pointLookupKeys?.count == 2)
        let scan = RowFilter(serviceIndex: [3], accessGroupIndexes: [], classes: [6, 7])
        #expect(
            scan.sql.contains("svce_ix = ?") && scan.sql.contains("agrp_ix IN (NULL)")
                && scan.sql.contains("class IN (6,7)"))
        #expect(!scan.sql.contains("secret"))
        #expect(!scan.isPointLookup && scan.pointLookupKeys == nil)
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
    /// What a read saw of one row: its class and columns (the secret and the attributes only when
    /// the filter asks for them; a row the cache keeps has them all the same).
    struct Seen: Equatable, Sendable, CustomStringConvertible {
        var protectionClass: UInt8
        var ref: [UInt8], uniqueIndex: [UInt8], wrappedKey: [UInt8], attributes: [UInt8], secret: [UInt8]

        init(_ protectionClass: UInt8, _ c: StoredItem.SealedColumns, _ filter: RowFilter) {
            self.protectionClass = protectionClass
            ref = Array(c.ref)
            uniqueIndex = Array(c.uniqueIndex)
            wrappedKey = Array(c.wrappedKey)
            attributes = filter.includeAttributes ? Array(c.attributes) : []
            secret = filter.includeSecret ? Array(c.secret) : []
        }

        var description: String { "class \(protectionClass) ref \(ref.first ?? 0) secret \(secret)" }
    }

    /// The ways a point lookup is asked: sealed columns or rows, the digests in a buffer (`Digests`)
    /// or in the filter.
    enum Way: CaseIterable {
        case sealedBuffer, sealedFilter, rowsBuffer, rowsFilter
    }

    /// `filter` asked of `reader` the way `way` says (a way with a buffer only when every digest has
    /// `Digests.length` bytes; else with the filter's).
    static func ask(_ reader: StoreReader, _ way: Way, _ filter: RowFilter) throws(KeychainError) -> [Seen] {
        var seen: [Seen] = []
        let digests = filter.uniqueIndexes ?? []
        let buffered =
            (way == .sealedBuffer || way == .rowsBuffer) && !digests.isEmpty
            && digests.allSatisfy { $0.count == Digests.length }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: digests.count * Digests.length, alignment: 8)
        defer { buffer.deallocate() }
        var given: Digests?
        if buffered {
            for (i, d) in digests.enumerated() {
                UnsafeMutableRawBufferPointer(rebasing: buffer[i * Digests.length..<(i + 1) * Digests.length])
                    .copyBytes(from: d)
            }
            given = Digests(UnsafeRawBufferPointer(buffer))
        }
        switch way {
        case .sealedBuffer, .sealedFilter:
            try reader.forEachSealed(filter, uniqueIndexes: given) {
                (protectionClass, c) throws(KeychainError) -> Bool in
                seen.append(Seen(protectionClass, c, filter))
                return true
            }
        case .rowsBuffer, .rowsFilter:
            try reader.forEach(filter, uniqueIndexes: given) { (row) throws(KeychainError) -> Bool in
                row.withSealedColumns { seen.append(Seen(row.protectionClass, $0, filter)) }
                return true
            }
        }
        return seen
    }

    @Test("a read gives back the reader connection it took, when it returns and when it throws")
    func aReadGivesBackItsConnection() throws {
        let fx = try CacheFixture()
        let digest = Array(repeating: UInt8(7), count: Digests.length)
        try fx.insert(fx.row(digest, secret: "s"))
        let filter = RowFilter(uniqueIndexes: [digest], includeSecret: true)
        // A miss takes a connection (lazily, through the lease); a hit takes none.
        for expectConnection in [true, false] {
            let took = try fx.store.read { (r) throws(KeychainError) -> Bool in
                try r.forEach(filter) { _ in true }
                return r.tookConnection
            }
            #expect(took == expectConnection)
        }
        let pooled = fx.store.idleReaders
        #expect(pooled.count == 1, "the connection of the first read is back in the pool")
        // A read that takes the connection and then throws gives it back too, and the next reads
        // take that same one.
        // Not a pure point lookup (a service digest too): never answered by the cache.
        let other = RowFilter(uniqueIndexes: [Array(repeating: UInt8(8), count: Digests.length)], serviceIndex: [2])
        #expect(throws: KeychainError.self) {
            try fx.store.read { (r) throws(KeychainError) in
                try r.forEach(other) { _ in true }
                #expect(r.tookConnection)
                throw KeychainError(.internal, "thrown after the connection was taken")
            }
        }
        for _ in 0..<3 {
            try fx.store.read { (r) throws(KeychainError) in try r.forEach(other) { _ in true } }
        }
        let after = fx.store.idleReaders
        #expect(after.count == 1 && after.first === pooled.first, "a new connection was opened instead")
    }

    /// A store with the point-lookup cache on and rows made here (sealed by no one: the store
    /// never opens them).
    final class CacheFixture {
        let temporary: TemporaryDirectory
        let store: ItemStore
        private var refs = 0

        init(
            lookupCacheEntries: Int = PointLookupCache.defaultCapacity,
            logLimitBytes: Int64 = ItemStore.defaultLogLimitBytes, logCheckSeconds: Double = 1
        ) throws {
            temporary = try TemporaryDirectory(prefix: "kc-store-cache")
            store = try ItemStore(
                path: temporary.appending("keychain.db"), lookupCacheEntries: lookupCacheEntries,
                logLimitBytes: logLimitBytes, logCheckSeconds: logCheckSeconds)
            _ = try store.attachRowState(key: try SecureBytes(random: 32), policy: .create)
        }

        /// The size of the database's write-ahead log (0 when there is none).
        var logSize: Int64 { (try? FileSystem.status(store.path + "-wal").size) ?? 0 }

        deinit { store.close() }

        /// A row with the uniqueness digest `digest`.
        func row(_ digest: [UInt8], class protectionClass: UInt8 = 6, secret: String, rowid: Int64 = 0) -> StoredItem {
            refs += 1
            let tag = UInt8(truncatingIfNeeded: refs)
            return StoredItem(
                rowid: rowid, ref: (0..<16).map { UInt8(truncatingIfNeeded: refs >> (8 * ($0 % 8))) },
                protectionClass: protectionClass, accessGroupIndex: [1], serviceIndex: [2], accountIndex: [3],
                uniqueIndex: digest, wrappedKey: [tag, 4], attributes: [tag, 5], secret: Array(secret.utf8))
        }

        @discardableResult
        func insert(_ row: StoredItem) throws -> Int64 {
            try store.write { (w) throws(KeychainError) in try w.insert(row) }
        }

        /// What the database holds for `filter`, read on the writer's connection (no cache; the
        /// transaction's commit clears the cache).
        func truth(_ way: Way, _ filter: RowFilter) throws -> [Seen] {
            try store.write { (w) throws(KeychainError) in try StoreTests.ask(w.reader, way, filter) }
        }

        /// `filter` read through the cache, and whether the cache answered it (no connection taken).
        func cached(_ way: Way, _ filter: RowFilter) throws -> (seen: [Seen], answeredByCache: Bool) {
            try store.read { (r) throws(KeychainError) in (try StoreTests.ask(r, way, filter), !r.tookConnection) }
        }
    }

    /// A digest of `count` bytes: its first word all `first`, the rest counting up from `rest`.
    static func digest(_ first: UInt8, rest: UInt8 = 0, count: Int = Digests.length) -> [UInt8] {
        (0..<count).map { $0 < 8 ? first : rest &+ UInt8($0) }
    }

    @Test func theLookupCacheAnswersEveryPointLookupAsTheDatabase() throws {
        let fx = try CacheFixture()
        let d = Self.digest
        let a = d(1, 0, 32)
        let sameFirstWord = d(1, 100, 32)
        let c = d(2, 0, 32)
        let absent = d(5, 0, 32)
        let short = d(3, 0, 5)
        let long = d(4, 0, 40)
        let longPrefix = d(4, 0, 32)
        try fx.insert(fx.row(a, class: 6, secret: "a"))
        try fx.insert(fx.row(c, class: 6, secret: "c"))
        try fx.insert(fx.row(sameFirstWord, class: 7, secret: "same first word"))
        try fx.insert(fx.row(short, secret: "short"))
        try fx.insert(fx.row(long, secret: "long"))
        func lookup(_ digests: [[UInt8]], secret: Bool = true, classes: [UInt8]? = nil, attributes: Bool = false)
            -> RowFilter
        {
            RowFilter(
                uniqueIndexes: digests, classes: classes, includeSecret: secret, includeSearchIndexes: false,
                includeAttributes: attributes)
        }
        /// Asked every way: the database's answer, then the cache's twice (the first after `primed`,
        /// if any, was read through it), all the same; the second from the cache when it may be.
        func check(
            _ filter: RowFilter, primed: RowFilter? = nil, found: Int, sourceLocation: SourceLocation = #_sourceLocation
        )
            throws
        {
            let cacheable = filter.pointLookupKeys != nil
            for way in Way.allCases {
                let truth = try fx.truth(way, filter)
                #expect(truth.count == found, "\(way)", sourceLocation: sourceLocation)
                if let primed { _ = try fx.cached(way, primed) }
                let first = try fx.cached(way, filter)
                let second = try fx.cached(way, filter)
                #expect(first.seen == truth, "\(way) first", sourceLocation: sourceLocation)
                #expect(second.seen == truth, "\(way) second", sourceLocation: sourceLocation)
                #expect(second.answeredByCache == cacheable, "\(way)", sourceLocation: sourceLocation)
            }
        }
        // One digest: found, with or without the secret or the attributes, of its class or not.
        try check(lookup([a]), found: 1)
        try check(lookup([a], secret: false), found: 1)
        try check(lookup([a], attributes: true), found: 1)
        try check(lookup([a], classes: [6]), found: 1)
        try check(lookup([a], classes: [7, 8]), found: 0)
        // A digest that shares its first word (its hash) with a cached one is another key.
        try check(lookup([sameFirstWord]), primed: lookup([a]), found: 1)
        try check(lookup([a]), primed: lookup([sameFirstWord]), found: 1)
        // Known absent.
        try check(lookup([absent]), found: 0)
        try check(lookup([absent], classes: [6]), found: 0)
        // Cached without the secret, asked with it: read again, secret and all.
        try check(lookup([a]), primed: lookup([a], secret: false), found: 1)
        // Cached whole, then asked for another class.
        try check(lookup([a], classes: [7]), primed: lookup([a]), found: 0)
        try check(lookup([sameFirstWord], classes: [7]), primed: lookup([sameFirstWord], classes: [6]), found: 1)
        // Several digests: rowid order, absent ones skipped, the class filter on each.
        try check(lookup([sameFirstWord, absent, c, a]), found: 3)
        try check(lookup([sameFirstWord, c, a], classes: [6]), primed: lookup([a]), found: 2)
        try check(lookup([c, a], secret: true), primed: lookup([c, a], secret: false), found: 2)
        // Digests of another length are never cached: read from the database each time, and a
        // 40-byte digest is not the 32-byte one it begins with.
        try check(lookup([short]), found: 1)
        try check(lookup([long]), found: 1)
        try check(lookup([longPrefix]), primed: lookup([long]), found: 0)
        try check(lookup([short, a]), found: 2)
    }

    @Test func aWriteIsSeenByTheNextLookupOfACachedDigest() throws {
        let fx = try CacheFixture()
        for (i, way) in Way.allCases.enumerated() {
            let a = Self.digest(UInt8(10 + i))
            let b = Self.digest(UInt8(50 + i))
            let rowid = try fx.insert(fx.row(a, secret: "one"))
            let filter = RowFilter(uniqueIndexes: [a], includeSecret: true, includeSearchIndexes: false)
            let other = RowFilter(uniqueIndexes: [b], includeSecret: true, includeSearchIndexes: false)
            /// The secrets a warm lookup finds (the cache answers it).
            func secrets(_ filter: RowFilter) throws -> [String] {
                let read = try fx.cached(way, filter)
                #expect(read.answeredByCache, "\(way): the cache did not answer a warm lookup")
                return read.seen.map { String(decoding: $0.secret, as: UTF8.self) }
            }
            func warm() throws {
                _ = try fx.cached(way, filter)
                _ = try fx.cached(way, other)
            }
            try warm()
            #expect(try secrets(filter) == ["one"], "\(way)")
            // Updated: the new secret and class, not the cached row.
            try fx.store.write { (w) throws(KeychainError) in
                try w.update(fx.row(a, class: 7, secret: "two", rowid: rowid))
            }
            #expect(try fx.cached(way, filter).seen.map(\.secret) == [Array("two".utf8)], "\(way)")
            try warm()
            #expect(try secrets(filter) == ["two"], "\(way)")
            var six = filter
            six.classes = [6]
            #expect(try secrets(six).isEmpty, "\(way)")
            // A write rolled back changes nothing: the cached answers stay right.
            #expect(throws: KeychainError.self) {
                try fx.store.write { (w) throws(KeychainError) in
                    try w.delete(rowid: rowid)
                    throw KeychainError(.param, "abandoned")
                }
            }
            try warm()
            #expect(try secrets(filter) == ["two"], "\(way)")
            // Deleted: found no more.
            try fx.store.write { (w) throws(KeychainError) in try w.delete(rowid: rowid) }
            #expect(try fx.cached(way, filter).seen.isEmpty, "\(way)")
            try warm()
            #expect(try secrets(filter).isEmpty, "\(way)")
            // Added where the cache knew there was nothing: found.
            #expect(try secrets(other).isEmpty, "\(way)")
            try fx.insert(fx.row(b, secret: "three"))
            #expect(try fx.cached(way, other).seen.map(\.secret) == [Array("three".utf8)], "\(way)")
            try warm()
            #expect(try secrets(other) == ["three"], "\(way)")
        }
    }

    /// A pooled reader keeps its read transaction between reads (ItemStore). A write that finishes
    /// while a read holds its connection is not seen by that read, but by every read that starts
    /// after it, whether the cache answers or SQLite does, on the same pooled connection; and a
    /// lookup that read the older snapshot leaves nothing in the cache.
    @Test(arguments: [0, PointLookupCache.defaultCapacity])
    func aWriteFinishedDuringAReadIsSeenByEveryReadAfterIt(lookupCacheEntries: Int) throws {
        let fx = try CacheFixture(lookupCacheEntries: lookupCacheEntries)
        for (i, way) in Way.allCases.enumerated() {
            let digest = Self.digest(UInt8(20 + i))
            let rowid = try fx.insert(fx.row(digest, secret: "before"))
            let filter = RowFilter(uniqueIndexes: [digest], includeSecret: true, includeSearchIndexes: false)
            func secrets(_ reader: StoreReader) throws(KeychainError) -> [String] {
                try Self.ask(reader, way, filter).map { String(decoding: $0.secret, as: UTF8.self) }
            }
            #expect(try fx.store.read { (r) throws(KeychainError) in try secrets(r) } == ["before"], "\(way)")
            let during = try fx.store.read { (r) throws(KeychainError) -> [String] in
                _ = try r.itemCount()  // the connection is taken and its snapshot begun
                try fx.store.write { (w) throws(KeychainError) in
                    try w.update(fx.row(digest, secret: "after", rowid: rowid))
                }
                return try secrets(r)
            }
            #expect(during == ["before"], "\(way): the read saw a write that finished after it began")
            let pooled = fx.store.idleReaders
            for attempt in 0..<2 {
                let seen = try fx.store.read { (r) throws(KeychainError) in try secrets(r) }
                #expect(seen == ["after"], "\(way), read \(attempt) after the write")
            }
            #expect(pooled.count == 1, "\(way): \(pooled.count) readers in the pool")
            #expect(fx.store.idleReaders.first === pooled.first, "\(way): not the connection that held the snapshot")
        }
    }

    /// Pooled readers keep read transactions between reads. Held in the pool while a write commits,
    /// they would keep the commit's checkpoint from copying its frames, and SQLite could never
    /// restart the log (it grows with every write); held during a truncating checkpoint, they would
    /// make it wait out the busy timeout and fail. Readers read after each write, and (in another
    /// pass) during each write, in its transaction: the log stays small and truncates to nothing.
    @Test(arguments: [false, true])
    func readersHoldUpNeitherTheLogNorItsTruncation(readDuringWrite: Bool) throws {
        let fx = try CacheFixture(lookupCacheEntries: 0)
        let secret = String(repeating: "s", count: 3000)
        func count() throws(KeychainError) -> Int {
            try fx.store.read { (r) throws(KeychainError) in try r.itemCount() }
        }
        var largest: Int64 = 0
        for i in 0..<1200 {
            let row = fx.row(Self.digest(UInt8(i % 200), rest: UInt8(i / 200)), secret: secret)
            let seen = try fx.store.write { (w) throws(KeychainError) -> Int in
                try w.insert(row)
                // (A read inside a write: fine here, where no key change waits for reads.)
                return readDuringWrite ? try count() : i
            }
            #expect(seen == i, "a read during the write saw \(seen) rows before it")
            #expect(try count() == i + 1)
            largest = max(largest, fx.logSize)
        }
        #expect(!fx.store.idleReaders.isEmpty, "no reader was left idle in the pool")
        // SQLite checkpoints at 1 000 pages of log and restarts it after that; 1 200 writes of a
        // row this size write over 4 000 pages.
        #expect(largest < 2_000 * 4096, "the log grew to \(largest) bytes: it did not restart")
        fx.store.truncateLog()
        #expect(fx.logSize == 0, "a truncating checkpoint left \(fx.logSize) bytes of log")
    }

    /// A read in progress at every commit keeps SQLite from ever restarting the log. Once the log is
    /// past its limit, the first commit after such reads pause truncates it.
    @Test func aLogPastItsLimitIsTruncatedOnceReadsPause() throws {
        let limit: Int64 = 1 << 20
        // The size looked at after every commit (not once a second), so the test waits for nothing.
        let fx = try CacheFixture(lookupCacheEntries: 0, logLimitBytes: limit, logCheckSeconds: 0)
        let store = fx.store
        let taken = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let returned = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            _ = try? store.read { (r) throws(KeychainError) -> Int in
                let n = try r.itemCount()  // a snapshot held across the writes below
                taken.signal()
                release.wait()
                return n
            }
            returned.signal()
        }
        taken.wait()
        let secret = String(repeating: "s", count: 3000)
        var i = 0
        while fx.logSize <= limit {
            try fx.insert(fx.row(Self.digest(UInt8(i % 200), rest: UInt8(i / 200)), secret: secret))
            i += 1
            #expect(i < 2_000, "the log did not grow past its limit")
            if i >= 2_000 { break }
        }
        release.signal()
        returned.wait()
        try fx.insert(fx.row(Self.digest(255, rest: 255), secret: secret))
        #expect(fx.logSize < limit, "the log is still \(fx.logSize) bytes after reads paused")
        #expect(try store.itemCount() == i + 1)
    }

    /// A read in progress when a truncating checkpoint starts holds it up only until the read gives
    /// its connection back: then the checkpoint completes and the log is empty.
    @Test func aTruncatingCheckpointWaitsOnlyForReadsInProgress() throws {
        let fx = try CacheFixture(lookupCacheEntries: 0)
        for i in 0..<50 { try fx.insert(fx.row(Self.digest(UInt8(i)), secret: "s")) }
        #expect(fx.logSize > 0)
        let store = fx.store
        let taken = DispatchSemaphore(value: 0)
        let returned = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            _ = try? store.read { (r) throws(KeychainError) -> Int in
                let n = try r.itemCount()  // the snapshot is taken
                taken.signal()
                while !store.isWriting { sched_yield() }  // the checkpoint has begun
                return n
            }
            returned.signal()
        }
        taken.wait()
        store.truncateLog()
        returned.wait()
        #expect(fx.logSize == 0, "the checkpoint left \(fx.logSize) bytes of log behind the read")
        #expect(try store.itemCount() == 50)
    }
}
