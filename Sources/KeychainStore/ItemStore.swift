public import KeychainCore
import KeychainSystem
import Synchronization

/// The item database: one writer connection behind a `WriterGate` (writes run in `BEGIN IMMEDIATE`
/// transactions, committed in groups) and a small pool of reader connections, so reads never wait
/// for a write (WAL).
///
/// A pooled reader keeps its read transaction open between reads while no write finishes: a point
/// lookup then skips SQLite's work of beginning and ending one (about 2 000 instructions, a tenth of
/// an uncached `copy`). Each held transaction is labelled with the count of finished writes from
/// before it began (`PointLookupCache.generation`); a reader taken from the pool whose label is not
/// the current count ends it and begins a new one, so a read never misses a write acknowledged
/// before it started.
///
/// No reader waits in the pool with a read transaction while a write transaction or a checkpoint is
/// open: the writer ends the idle readers' transactions when it begins one, and a reader given back
/// meanwhile (or with an outdated label) ends its own. Read marks held in the pool would otherwise
/// keep the commit's automatic checkpoint from copying the commit's frames, so the log would never
/// restart and would grow with every write, and a TRUNCATE checkpoint would wait out the busy
/// timeout. Only a read in progress holds the log back, as before; reads in progress at every
/// commit can still keep SQLite from restarting it, so a commit truncates a log past
/// `logLimitBytes` (WriterGate's `boundLog`).
public final class ItemStore: Sendable {
    /// The SQLite database file this store opened.
    public let path: String

    let writer: WriterGate
    private let pointCache: PointLookupCache
    private let readers: Locked<ReaderPool>
    /// Set by `close` before anything else: a read after it fails at once, cache or not.
    private let closed = Atomic<Bool>(false)
    /// Reads against the commit of `writeAlone` (see `TransitionLock`).
    private let transition = TransitionLock()
    private let lock: DatabaseLock
    private static let maxIdleReaders = 4
    /// 16 MiB: four times what SQLite's automatic checkpoint lets the log reach (1 000 pages of 4 KiB)
    /// when it can restart it.
    public static let defaultLogLimitBytes: Int64 = 16 << 20

    private struct ReaderPool {
        var idle: [PooledReader] = []
        var closed = false
        /// A write transaction or a checkpoint is open (`WriterGate`'s `writing`).
        var writing = false

        /// Ends the read transactions the idle readers hold (one that cannot end is closed).
        mutating func endSnapshots() {
            var kept: [PooledReader] = []
            for var reader in idle {
                if reader.endSnapshot() { kept.append(reader) }
            }
            idle = kept
        }
    }

    /// Opens the database at `path`, creating it (mode 0600, before SQLite touches it, so `-wal`
    /// inherits 0600) and migrating its schema to the current version. The WAL's index is kept in
    /// memory (SQLiteConnection, `unix-excl`): a `-shm` file that an earlier version left is removed.
    /// `lookupCacheEntries`: how many point lookups to keep as sealed rows (0 turns the cache off).
    /// `logLimitBytes`: the size of the write-ahead log above which a commit truncates it, looked at
    /// once per `logCheckSeconds` at most.
    public init(
        path: String, lookupCacheEntries: Int = PointLookupCache.defaultCapacity,
        logLimitBytes: Int64 = ItemStore.defaultLogLimitBytes, logCheckSeconds: Double = 1
    ) throws(KeychainError) {
        self.path = path
        pointCache = PointLookupCache(capacity: lookupCacheEntries)
        lock = try DatabaseLock(databasePath: path)
        do { try FileDescriptor.open(path, [.readWrite, .create, .noFollow], permissions: 0o600).close() } catch {
            throw KeychainError(.notAvailable, "cannot open database \(path)", error)
        }
        let connection = try SQLiteConnection(path: path, create: false)
        try Schema.migrate(connection, path: path)
        // SQLite holds its exclusive lock now and rebuilt the index from the WAL; only this process
        // opens the database (the lock file above), so the old file holds nothing that is needed.
        FileSystem.removeIfPresent(path + "-shm")
        identity = (try? FileSystem.status(path)).map { ($0.device, $0.inode) }
        if let identity { Self.openFiles.withLock { $0.append(identity) } }
        let cache = pointCache
        let readers = Locked(ReaderPool())
        self.readers = readers
        writer = WriterGate(
            connection, log: (path + "-wal", logLimitBytes, logCheckSeconds),
            writing: { open in
                readers.withLock { pool in
                    pool.writing = open
                    if open { pool.endSnapshots() }
                }
            },
            afterTransaction: { cache.invalidate() })
    }

    /// Whether point lookups go through the cache of sealed rows (`lookupCacheEntries` above 0).
    public var hasLookupCache: Bool { pointCache.capacity > 0 }
    /// How many write transactions have finished since the store opened: a change of it says the
    /// items may have changed (sync looks at it to find local writes).
    public var writeGeneration: UInt64 { pointCache.generation }

    /// Closes every connection (finalizing their statements). Later calls are errSecNotAvailable;
    /// readers in use are closed when they are handed back.
    public func close() {
        closed.store(true, ordering: .sequentiallyConsistent)
        writer.close()
        pointCache.invalidate()
        let idle = readers.withLock { pool -> [PooledReader] in
            pool.closed = true
            defer { pool.idle = [] }
            return pool.idle
        }
        for reader in idle { reader.db.close() }
        if let identity {
            Self.openFiles.withLock { files in
                if let i = files.firstIndex(where: { $0 == identity }) { files.remove(at: i) }
            }
        }
        lock.release()
    }

    /// The database files (device, inode) of the stores open in this process.
    private static let openFiles = Locked<[(UInt64, UInt64)]>([])
    /// This store's database file, as `openFiles` holds it.
    private let identity: (UInt64, UInt64)?

    /// True when `path` (symbolic links followed) is the database file of a store open in this
    /// process. Such a file must not be opened anywhere else in the process: closing any descriptor
    /// of it drops the POSIX lock SQLite holds on it (`unix-excl`), and with it what keeps other
    /// SQLite users out. Readers of paths that others name (registration files) ask first.
    public static func isOpenDatabase(_ path: String) -> Bool {
        guard let st = try? FileSystem.status(path) else { return false }
        return isOpenDatabase(device: st.device, inode: st.inode)
    }

    /// True when the file (device, inode) is the database file of a store open in this process.
    public static func isOpenDatabase(device: UInt64, inode: UInt64) -> Bool {
        openFiles.withLock { $0.contains { $0 == (device, inode) } }
    }

    // MARK: Transactions

    /// Runs `body` atomically on the writer connection and returns once its changes are durable:
    /// its effects are kept if it returns and undone if it throws.
    ///
    /// Group commit: each body runs in its own savepoint inside a shared `BEGIN IMMEDIATE`
    /// transaction; a writer that sees others queued behind it leaves the commit (and its fsync) to
    /// the last of them and waits for it. One writer alone commits at once, so nothing waits for a
    /// timer; eight concurrent writers share one fsync. A failed commit fails every body of the group.
    public func write<R: Sendable>(_ body: (StoreWriter) throws(KeychainError) -> R) throws(KeychainError) -> R {
        try writer.run(body)
    }

    /// Runs `body` in a transaction of its own, committed before this returns, and runs `committed`
    /// right after the commit, before any other write starts and while no `read` runs: a change of
    /// keys commits its rows and puts the new keys in force (`committed`) as one step for every reader
    /// and writer. `body` holds the writer for as long as it runs (other writes wait). Its effects are
    /// kept if it returns and undone if it throws or the commit fails (then `committed` does not run).
    public func writeAlone<R>(
        _ body: (StoreWriter) throws(KeychainError) -> R,
        committed: () -> Void
    ) throws(KeychainError) -> R {
        try writer.runAlone(body, readers: transition, committed: committed)
    }

    /// Runs `body` on a reader connection, never blocked by ordinary writes; only the commit of a
    /// `writeAlone` (a key change) waits for reads to finish and holds new ones back until its new
    /// keys are in force. `body` must not call `read` again. The statements it runs on its connection
    /// share one WAL snapshot, which holds every write acknowledged before the connection was taken
    /// (writes that finish during `body` are not seen by them; a lookup the cache answers may be newer).
    /// The reader connection is taken from the pool when `body` first needs one: a point lookup the
    /// cache answers takes none (and none of the pool's two locks). With the cache off it is taken at
    /// once, without the lease object that defers it.
    public func read<R>(_ body: (StoreReader) throws(KeychainError) -> R) throws(KeychainError) -> R {
        try transition.shared { () throws(KeychainError) -> R in
            if closed.load(ordering: .sequentiallyConsistent) { throw Self.closedError }
            if pointCache.capacity == 0 {
                // No cache to answer first: every read needs a connection, taken at once (no lease).
                let reader = try takeReader()
                defer { giveBack(reader) }
                return try body(StoreReader(db: reader.db))
            }
            // The lease's one slot is a variable of this call: no object allocated and freed per read.
            var taken: PooledReader? = nil
            defer { if let reader = taken { giveBack(reader) } }
            return try withUnsafeMutablePointer(to: &taken) { (slot) throws(KeychainError) -> R in
                try body(StoreReader(lease: ReaderLease(store: self, taken: slot), cache: pointCache))
            }
        }
    }

    static let closedError = KeychainError(.notAvailable, "the keychain database is closed")

    /// A reader from the pool (or a new one), in a read transaction that holds every write finished
    /// before this call: the one it holds if no write finished since it began, else a new one.
    fileprivate func takeReader() throws(KeychainError) -> PooledReader {
        let (closed, idle) = readers.withLock { pool -> (Bool, PooledReader?) in
            pool.closed ? (true, nil) : (false, pool.idle.popLast())
        }
        if closed { throw Self.closedError }
        // Read before the transaction below begins: every write counted here is in its snapshot.
        let finished = pointCache.generation
        var reader: PooledReader
        if let idle {
            reader = idle
        } else {
            reader = PooledReader(db: try SQLiteConnection(path: path, create: false, readOnly: true))
        }
        // (SQLite ends a transaction by itself after some errors: then there is none to keep.)
        if reader.snapshot != finished || !reader.db.inTransaction {
            if reader.db.inTransaction { try reader.db.run("COMMIT") }
            // Deferred: the snapshot is taken by the first statement that reads.
            try reader.db.run("BEGIN")
            reader.snapshot = finished
        }
        return reader
    }

    /// The reader connections waiting in the pool (tests: a read gives back what it took).
    var idleReaders: [SQLiteConnection] { readers.withLock { $0.idle.map(\.db) } }

    /// Whether a write transaction or a checkpoint is open (tests wait for one).
    var isWriting: Bool { readers.withLock { $0.writing } }

    /// Puts `reader` back in the pool (or closes it when the pool is full or closed). It keeps its
    /// read transaction only if no write transaction or checkpoint is open and no write finished
    /// since it began; decided and done under the pool's lock, where the writer's `endSnapshots` runs.
    private func giveBack(_ reader: PooledReader) {
        let keep = readers.withLock { pool -> Bool in
            guard !pool.closed, pool.idle.count < Self.maxIdleReaders else { return false }
            var reader = reader
            if pool.writing || reader.snapshot != pointCache.generation {
                guard reader.endSnapshot() else { return false }  // closed (closing again is harmless)
            }
            pool.idle.append(reader)
            return true
        }
        if !keep { reader.db.close() }
    }

    /// Checkpoints the whole WAL into the database and truncates it, best effort (a reader holding an
    /// old snapshot for longer than the busy timeout leaves it for the next checkpoint).
    public func truncateLog() {
        writer.truncateLog()
    }

    // MARK: Convenience

    /// The number of items in the store, of every class and access group, read on a reader connection.
    public func itemCount() throws(KeychainError) -> Int {
        try read { (r) throws(KeychainError) in try r.itemCount() }
    }

    /// The value stored under `name` in the meta table (for example the keyring), or nil when there is none.
    public func meta(_ name: String) throws(KeychainError) -> [UInt8]? {
        try read { (r) throws(KeychainError) in try r.meta(name) }
    }
}

/// A pooled reader connection and the read transaction it holds.
struct PooledReader {
    let db: SQLiteConnection
    /// The count of finished writes read before its read transaction began; nil when it holds none.
    var snapshot: UInt64? = nil

    /// Ends the read transaction it holds, if any. False when it could not be ended: the connection
    /// is closed then, and must not go back to the pool.
    mutating func endSnapshot() -> Bool {
        guard snapshot != nil else { return true }
        if db.inTransaction, (try? db.run("COMMIT")) == nil {
            db.close()
            return false
        }
        snapshot = nil
        return true
    }
}

/// One read's claim on a pooled reader connection, taken on first use (used by one thread). Valid
/// only inside the `ItemStore.read` that made it: its slot is on that call's stack, and the store is
/// not retained (it outlives the read).
struct ReaderLease {
    private unowned(unsafe) let store: ItemStore
    /// The reader taken, or nil: `read` gives it back when it returns.
    private let slot: UnsafeMutablePointer<PooledReader?>

    init(store: ItemStore, taken slot: UnsafeMutablePointer<PooledReader?>) {
        self.store = store
        self.slot = slot
    }

    /// The connection taken so far, if any.
    var taken: SQLiteConnection? { slot.pointee?.db }

    /// The count of finished writes that the taken reader's snapshot holds (nil before one is taken).
    var snapshot: UInt64? { slot.pointee?.snapshot }

    func connection() throws(KeychainError) -> SQLiteConnection {
        if let taken = slot.pointee { return taken.db }
        let reader = try store.takeReader()
        slot.pointee = reader
        return reader.db
    }
}

/// Read access to the items, on a pooled reader connection or inside a write transaction.
public struct StoreReader {
    /// A writer's own connection, or nil when the connection comes from `lease`.
    private let fixed: SQLiteConnection?
    private let lease: ReaderLease?

    init(db: SQLiteConnection, cache: PointLookupCache? = nil) {
        fixed = db
        lease = nil
        self.cache = cache
    }

    init(lease: ReaderLease, cache: PointLookupCache?) {
        fixed = nil
        self.lease = lease
        self.cache = cache
    }

    /// The connection to run statements on (a pooled reader is taken now if not yet).
    var db: SQLiteConnection {
        get throws(KeychainError) {
            if let fixed { return fixed }
            return try lease!.connection()
        }
    }
    /// Whether this read has taken a reader connection (one the cache answered did not).
    var tookConnection: Bool { lease?.taken != nil }
    /// Set on readers outside a write transaction; a writer's own reads must see its changes.
    /// Not retained: the store owns its cache, and a `StoreReader` lives only inside the `read`
    /// (or write) call that made it, as its lease does.
    unowned(unsafe) var cache: PointLookupCache? = nil

    /// Calls `visit` for each row matching `filter`, in rowid order, until it returns false.
    public func forEach(_ filter: RowFilter, _ visit: (StoredItem) throws(KeychainError) -> Bool) throws(KeychainError)
    {
        switch cachedOne(filter, nil) {
        case .row(let row): _ = try visit(row)
        case .noMatch: break
        case .miss: try lookUp(filter, visit)
        }
    }

    /// `forEach` after `cachedOne` said `.miss`: through the cache's general path or SQLite.
    private func lookUp(_ filter: RowFilter, _ visit: (StoredItem) throws(KeychainError) -> Bool) throws(KeychainError)
    {
        if let cache, cache.capacity > 0, let keys = filter.pointLookupKeys {
            try cachedPointLookup(filter, keys: keys, cache: cache, visit)
        } else {
            try query(filter, visit)
        }
    }

    /// What the point-lookup cache answers for a lookup by one digest (`digests`' one when given,
    /// else the filter's), class filter applied.
    private enum OneRow {
        /// The one matching row.
        case row(StoredItem)
        /// No row matches (none has the digest, or its class is filtered out).
        case noMatch
        /// Not answered here: read through `lookUp` (SQLite, or the cache's general path).
        case miss
    }

    /// The cache's answer for a pure point lookup by one digest of `Digests.length` bytes, with no
    /// array, filter copy or result array made: a hit is a dictionary lookup under the cache's
    /// lock, the row taken out as a reference and looked at after it. A miss (not cached, cached
    /// without the secret the filter asks for, no cache, or any other lookup) reads through
    /// `lookUp`, which stores what it read.
    @inline(__always) private func cachedOne(_ filter: RowFilter, _ digests: Digests?) -> OneRow {
        guard let cache, cache.capacity > 0, filter.isPointLookup else { return .miss }
        let key: DigestKey?
        if let digests {
            key = digests.count == 1 ? DigestKey(digests[0]) : nil
        } else if let own = filter.uniqueIndexes, own.count == 1 {
            key = DigestKey(own[0])
        } else {
            key = nil
        }
        guard let key, let found = cache.lookup(key, needSecret: filter.includeSecret) else { return .miss }
        guard case .row(let row) = found else { return .noMatch }
        if let classes = filter.classes, !classes.contains(row.protectionClass) { return .noMatch }
        return .row(row)
    }

    /// A point lookup through the cache: a hit never touches SQLite; a miss reads every key (at most
    /// one row each) and caches what it found, absent keys included when no class filter hid rows.
    private func cachedPointLookup(
        _ filter: RowFilter, keys: [DigestKey], cache: PointLookupCache,
        _ visit: (StoredItem) throws(KeychainError) -> Bool
    ) throws(KeychainError) {
        var rows: [StoredItem]
        if let hit = cache.rows(for: keys, needSecret: filter.includeSecret) {
            rows = hit
        } else {
            var unfiltered = filter
            unfiltered.classes = nil
            // Whole rows: a cached row may serve any point lookup.
            unfiltered.includeSearchIndexes = true
            unfiltered.includeAttributes = true
            rows = []
            try query(unfiltered) { (row) throws(KeychainError) -> Bool in
                rows.append(row)
                return true
            }
            var entries: [(DigestKey, PointLookupCache.Entry)] = keys.map { ($0, .init(row: nil, hasSecret: true)) }
            // Once each: a row's getters copy the column. (A row's digest is its key's, byte for byte.)
            let found = rows.map { row in row.withSealedColumns { DigestKey($0.uniqueIndex) } }
            for (i, entry) in entries.enumerated() {
                if let j = found.firstIndex(of: entry.0) {
                    entries[i].1 = .init(row: rows[j], hasSecret: filter.includeSecret)
                }
            }
            // Stored under the count of writes the read's snapshot holds (taken with the connection,
            // maybe by an earlier statement of this read): if a write finished since, it is refused.
            if let generation = lease?.snapshot { cache.store(entries, generation: generation) }
        }
        if let classes = filter.classes { rows.removeAll { !classes.contains($0.protectionClass) } }
        rows.sort { $0.rowid < $1.rowid }
        for row in rows where try !visit(row) { break }
    }

    /// `forEach` for a point lookup (`filter.uniqueIndexes` set) by `digests` instead of the
    /// filter's own, as many (when given; nil: `forEach(filter, visit)`): the filter says everything
    /// else. A `copy` compiled from its template computes its digests into a buffer and hands them
    /// over as they are. (The point-lookup cache answers a lookup by one digest from the buffer; for
    /// any other it keys its rows by arrays: the digests are copied into some for it.)
    public func forEach(
        _ filter: RowFilter, uniqueIndexes digests: Digests?, _ visit: (StoredItem) throws(KeychainError) -> Bool
    ) throws(KeychainError) {
        guard let digests else { return try forEach(filter, visit) }
        precondition(filter.uniqueIndexes?.count == digests.count, "not the filter's number of digests")
        if let cache, cache.capacity > 0 {
            switch cachedOne(filter, digests) {
            case .row(let row): _ = try visit(row)
            case .noMatch: break
            case .miss:
                var own = filter
                own.uniqueIndexes = digests.arrays
                try lookUp(own, visit)
            }
        } else {
            try query(filter, uniqueIndexes: digests, visit)
        }
    }

    /// `forEach(_:uniqueIndexes:_:)` for a reader that opens only what an item key and secret need:
    /// `visit` gets each row's class and its sealed columns (`StoredItem.SealedColumns`; the search
    /// digests and, unless the filter reads them, the attributes empty), in SQLite's memory when the
    /// digests are given and no lookup cache is on: no row is made. The columns are valid only
    /// during the call. With the cache on, a lookup by one digest that the cache holds gets the
    /// cached row's columns (nothing else made); any other reads its rows as `forEach` does.
    public func forEachSealed(
        _ filter: RowFilter, uniqueIndexes digests: Digests?,
        _ visit: (_ protectionClass: UInt8, _ columns: StoredItem.SealedColumns) throws(KeychainError) -> Bool
    ) throws(KeychainError) {
        if let digests {
            precondition(filter.uniqueIndexes?.count == digests.count, "not the filter's number of digests")
        }
        if let cache, cache.capacity > 0 {
            switch cachedOne(filter, digests) {
            case .row(let row):
                _ = try row.withSealedColumns { (c) throws(KeychainError) -> Bool in try visit(row.protectionClass, c) }
                return
            case .noMatch: return
            case .miss: break
            }
        } else if let digests {
            try querySealed(filter, uniqueIndexes: digests, visit)
            return
        }
        func sealed(_ row: StoredItem) throws(KeychainError) -> Bool {
            try row.withSealedColumns { (c) throws(KeychainError) -> Bool in try visit(row.protectionClass, c) }
        }
        if let digests {
            var own = filter
            own.uniqueIndexes = digests.arrays
            try lookUp(own, sealed)
        } else {
            try lookUp(filter, sealed)
        }
    }

    private func querySealed(
        _ filter: RowFilter, uniqueIndexes digests: Digests,
        _ visit: (UInt8, StoredItem.SealedColumns) throws(KeychainError) -> Bool
    ) throws(KeychainError) {
        let s = try db.statement(filter.sql)
        defer { s.reset() }
        try filter.bind(s, uniqueIndexes: digests)
        typealias C = RowFilter.Columns
        let columns = filter.columns
        // Not selected for a lookup by one digest: the row's is that digest.
        let given = digests.count > 0 ? digests[0] : UnsafeRawBufferPointer(start: nil, count: 0)
        while try s.step() {
            let protectionClass = UInt8(truncatingIfNeeded: s.int64(C.protectionClass))
            let proceed = try s.withBlobs(
                C.ref, columns.uniqueIndex, C.wrappedKey, columns.attributes, columns.secret
            ) { (ref, selected, wrappedKey, attributes, secret) throws(KeychainError) -> Bool in
                let c = StoredItem.SealedColumns(
                    ref: ref, uniqueIndex: columns.uniqueIndex == nil ? given : selected, wrappedKey: wrappedKey,
                    attributes: attributes, secret: secret)
                return try visit(protectionClass, c)
            }
            if !proceed { break }
        }
    }

    private func query(
        _ filter: RowFilter, uniqueIndexes digests: Digests? = nil,
        _ visit: (StoredItem) throws(KeychainError) -> Bool
    ) throws(KeychainError) {
        // The statement without `withStatement`'s closure, whose context would hold a copy of the
        // filter (every array in it retained and released again): reset here the same way.
        let s = try db.statement(filter.sql)
        defer { s.reset() }
        try filter.bind(s, uniqueIndexes: digests)
        typealias C = RowFilter.Columns
        // The blob columns in StoredItem's order; nil for one the filter leaves out.
        let columns = filter.columns
        let group = columns.searchIndexes
        let service = group.map { $0 + 1 }
        let account = group.map { $0 + 2 }
        // Not selected for a lookup by one digest: the row's is that digest.
        let digest = columns.uniqueIndex == nil && digests == nil ? filter.uniqueIndexes?.first ?? [] : []
        let empty = UnsafeRawBufferPointer(start: nil, count: 0)
        let given = columns.uniqueIndex == nil ? digests.map { $0.count > 0 ? $0[0] : empty } : nil
        let partial = group == nil || columns.attributes == nil || columns.secret == nil
        func count(_ column: Int32?) -> Int { column.map { s.byteCount($0) } ?? 0 }
        while try s.step() {
            // Each column's length once, then its bytes copied straight into the row.
            let counts = (
                count(C.ref), count(group), count(service), count(account),
                columns.uniqueIndex.map { s.byteCount($0) } ?? given?.count ?? digest.count,
                count(C.wrappedKey), count(columns.attributes), count(columns.secret)
            )
            func add(_ column: Int32?, _ count: Int, _ append: (UnsafeRawBufferPointer) -> Void) {
                if let column {
                    s.withBlob(column, count: count, append)
                } else {
                    append(UnsafeRawBufferPointer(start: nil, count: 0))
                }
            }
            let row = StoredItem(
                rowid: s.int64(C.rowid), protectionClass: UInt8(truncatingIfNeeded: s.int64(C.protectionClass)),
                partial: partial,
                byteCount: counts.0 + counts.1 + counts.2 + counts.3 + counts.4 + counts.5 + counts.6 + counts.7
            ) { append in
                add(C.ref, counts.0, append)
                add(group, counts.1, append)
                add(service, counts.2, append)
                add(account, counts.3, append)
                if columns.uniqueIndex != nil {
                    add(columns.uniqueIndex, counts.4, append)
                } else if let given {
                    append(given)
                } else {
                    digest.withUnsafeBytes(append)
                }
                add(C.wrappedKey, counts.5, append)
                add(columns.attributes, counts.6, append)
                add(columns.secret, counts.7, append)
            }
            if try !visit(row) { break }
        }
    }

    /// The number of items in the store, of every class and access group.
    public func itemCount() throws(KeychainError) -> Int {
        try db.withStatement("SELECT count(*) FROM items") { (s) throws(KeychainError) in
            _ = try s.step()
            return Int(s.int64(0))
        }
    }

    /// Items whose access-group digest is one of `groupIndexes`.
    public func itemCount(groupIndexes: [[UInt8]]) throws(KeychainError) -> Int {
        guard !groupIndexes.isEmpty else { return 0 }
        let marks = Array(repeating: "?", count: groupIndexes.count).joined(separator: ",")
        return try db.withStatement("SELECT count(*) FROM items WHERE agrp_ix IN (\(marks))") {
            (s) throws(KeychainError) in
            for (i, index) in groupIndexes.enumerated() { try s.bind(Int32(i + 1), index) }
            _ = try s.step()
            return Int(s.int64(0))
        }
    }

    /// The value stored under `name` in the meta table (for example the keyring), or nil when there is none.
    public func meta(_ name: String) throws(KeychainError) -> [UInt8]? {
        try db.withStatement("SELECT value FROM meta WHERE name = ?") { (s) throws(KeychainError) in
            try s.bind(1, text: name)
            return try s.step() ? s.blob(0) : nil
        }
    }
}

/// Write access inside one transaction (see `ItemStore.write`).
public struct StoreWriter {
    let db: SQLiteConnection
    /// Keeps the row-state record current (see RowState.swift); nil before `attachRowState`.
    var rows: RowStateTracker? = nil

    /// Item rows may only change while the row state follows them.
    func tracker() throws(KeychainError) -> RowStateTracker {
        guard let rows else {
            throw KeychainError(.internal, "item rows cannot change before the row state is checked")
        }
        return rows
    }

    /// Reads on this transaction's own connection, so they see its uncommitted writes.
    public var reader: StoreReader { StoreReader(db: db) }

    /// Inserts a row; a row with the same uniqueness digest is errSecDuplicateItem (decided by the
    /// UNIQUE constraint, atomically). Returns the new rowid.
    @discardableResult
    public func insert(_ item: StoredItem) throws(KeychainError) -> Int64 {
        try Self.refusePartial(item)
        let rows = try tracker()
        let rowid = try db.withStatement(Self.insertSQL) { (s) throws(KeychainError) in
            try s.bind(1, item.ref)
            try Self.bindWritten(s, item, from: 2)
            try s.run()
            return try db.withStatement("SELECT last_insert_rowid()") { (r) throws(KeychainError) in
                _ = try r.step()
                return r.int64(0)
            }
        }
        rows.added(RowFingerprint(item))
        try addAttributeIndexes(ref: item.ref, item.attributeIndexes ?? [])
        return rowid
    }

    /// Rewrites the row `item.rowid` whole (all but its ref): class, digests, item key, attributes and
    /// secret — an update seals everything afresh under a new item key. A collision of the new
    /// uniqueness digest is errSecDuplicateItem.
    public func update(_ item: StoredItem) throws(KeychainError) {
        try Self.refusePartial(item)
        let rows = try tracker()
        guard let before = try reader.fingerprint(rowid: item.rowid) else {
            throw KeychainError(.itemNotFound, "the item was deleted meanwhile")
        }
        try db.withStatement(Self.updateSQL) { (s) throws(KeychainError) in
            try Self.bindWritten(s, item, from: 1)
            try s.bind(Int32(Self.writtenColumns.count + 1), item.rowid)
            try s.run()
        }
        var after = RowFingerprint(item)
        after.ref = before.ref  // the UPDATE never writes ref
        rows.removed(before)
        rows.added(after)
        if let indexes = item.attributeIndexes {
            try removeAttributeIndexes(ref: before.ref)
            try addAttributeIndexes(ref: before.ref, indexes)
        }
    }

    /// The columns a write sets (all but `ref`, which only an insert writes), in the order
    /// `bindWritten` binds them: the one list both statements are made from.
    static let writtenColumns = [
        "class", "agrp_ix", "svce_ix", "acct_ix", "key_ix", "item_key", "attributes", "secret",
    ]
    static let insertSQL =
        "INSERT INTO items (ref, \(writtenColumns.joined(separator: ", "))) VALUES (?\(String(repeating: ", ?", count: writtenColumns.count)))"
    static let updateSQL =
        "UPDATE items SET \(writtenColumns.map { $0 + "=?" }.joined(separator: ", ")) WHERE rowid=?"

    /// Binds `item`'s `writtenColumns` to parameters `first`, `first + 1`, …
    @inline(__always)
    private static func bindWritten(_ s: SQLiteStatement, _ item: StoredItem, from first: Int32) throws(KeychainError) {
        try s.bind(first, Int64(item.protectionClass))
        try s.bind(first + 1, item.accessGroupIndex)
        try s.bind(first + 2, item.serviceIndex)
        try s.bind(first + 3, item.accountIndex)
        try s.bind(first + 4, item.uniqueIndex)
        try s.bind(first + 5, item.wrappedKey)
        try s.bind(first + 6, item.attributes)
        try s.bind(first + 7, item.secret)
    }

    /// A row read without some columns would write them (and record them in the row state) empty:
    /// rows are written as sealed, never as read.
    private static func refusePartial(_ item: StoredItem) throws(KeychainError) {
        guard !item.isPartial else { throw KeychainError(.internal, "a row read in part cannot be written") }
    }

    /// Deletes the row `rowid` and its attribute indexes; a row already gone is no error.
    public func delete(rowid: Int64) throws(KeychainError) {
        let rows = try tracker()
        guard let before = try reader.fingerprint(rowid: rowid) else { return }
        try db.withStatement("DELETE FROM items WHERE rowid = ?") { (s) throws(KeychainError) in
            try s.bind(1, rowid)
            try s.run()
        }
        rows.removed(before)
        try removeAttributeIndexes(ref: before.ref)
    }

    /// Stores a meta value; fails (errSecDuplicateItem) if the name exists — meta values are written once.
    public func insertMeta(_ name: String, _ value: [UInt8]) throws(KeychainError) {
        try db.withStatement("INSERT INTO meta (name, value) VALUES (?, ?)") { (s) throws(KeychainError) in
            try s.bind(1, text: name)
            try s.bind(2, value)
            try s.run()
        }
        if let rows, name != RowState.metaName { rows.added(MetaFingerprint(name: name, value: value)) }
    }
}
