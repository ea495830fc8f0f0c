import CSQLite
package import KeychainCore
import KeychainSystem

/// One SQLite connection. Not thread-safe by itself (opened NOMUTEX): the store hands each connection
/// to one thread at a time (the writer behind `WriterGate`, readers through a pool). Visible to this
/// package only (the store and its tests), never to apps.
///
/// Every SQLite return code becomes a `KeychainError` in exactly one place (`check`). Prepared
/// statements are cached per SQL text and finalized when the connection closes.
package final class SQLiteConnection: @unchecked Sendable {
    // Safety: a connection moves between threads but is never used by two at once — the writer's only
    // with WriterGate's mutex held, a reader's only by the thread that took it out of the pool (under
    // the pool's lock) until it gives it back. That hand-over through a lock is what Sendable claims.
    private var db: OpaquePointer?
    // (Never used by two threads at once, as above: the runtime's exclusivity checks on these two,
    // which every statement reads, are left out.)
    @exclusivity(unchecked) private var cache: [String: SQLiteStatement] = [:]
    /// The statement used last, with its text: a connection mostly repeats one statement (a reader's
    /// point lookup), and a string compared with the very same string is one word compared, where the
    /// dictionary would hash all of it.
    @exclusivity(unchecked) private var last: (sql: String, statement: SQLiteStatement)?
    private static let cacheLimit = 128
    /// How long a statement waits for a lock before it fails with SQLITE_BUSY.
    private let busyTimeoutMs: Int32

    /// Opens (creating if `create`) the database at `path` with WAL, synchronous=FULL, a busy timeout
    /// and secure_delete. `readOnly` connections also set `query_only`.
    package init(path: String, create: Bool = true, readOnly: Bool = false, busyTimeoutMs: Int32 = 5000)
        throws(KeychainError)
    {
        _ = Self.configured
        var flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_PRIVATECACHE
        if create { flags |= SQLITE_OPEN_CREATE }
        var handle: OpaquePointer?
        let rc = sqlite3_open_v2(path, &handle, flags, "unix-excl")
        guard rc == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(handle)
            throw Self.error(rc, "cannot open database \(path): \(message)")
        }
        db = handle
        self.busyTimeoutMs = busyTimeoutMs
        sqlite3_extended_result_codes(handle, 1)
        sqlite3_busy_timeout(handle, busyTimeoutMs)
        do throws(KeychainError) {
            try execute("PRAGMA journal_mode=WAL")
            try execute("PRAGMA synchronous=FULL")
            try execute("PRAGMA secure_delete=ON")
            try execute("PRAGMA trusted_schema=OFF")
            if readOnly { try execute("PRAGMA query_only=ON") }
        } catch {
            close()
            throw error
        }
    }

    deinit { close() }

    /// The library set up once per process, before the first connection: without its memory
    /// statistics (Debian's SQLite has no lookaside, so a query's every allocation — about ten per
    /// point lookup — took a process-wide mutex to count itself). An error here means the library was
    /// initialised before (only the statistics stay on), or cannot be, which the first open reports.
    private static let configured: Int32 = keychaind_sqlite_configure()

    /// Finalizes every statement and closes the connection; later use is errSecNotAvailable.
    package func close() {
        cache.removeAll()  // SQLiteStatement.deinit finalizes
        last = nil
        if let db { sqlite3_close_v2(db) }
        db = nil
    }

    var handle: OpaquePointer {
        get throws(KeychainError) {
            guard let db else { throw KeychainError(.notAvailable, "the keychain database is closed") }
            return db
        }
    }

    /// Runs `body` with the busy timeout set to `milliseconds` instead of the connection's own.
    package func withBusyTimeout<R>(_ milliseconds: Int32, _ body: () -> R) -> R {
        if let db { sqlite3_busy_timeout(db, milliseconds) }
        defer { if let db { sqlite3_busy_timeout(db, busyTimeoutMs) } }
        return body()
    }

    /// Runs SQL without results (pragmas, schema, BEGIN/COMMIT/ROLLBACK).
    package func execute(_ sql: String) throws(KeychainError) {
        let h = try handle
        var errmsg: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(h, sql, nil, nil, &errmsg)
        let message = errmsg.map { String(cString: $0) } ?? ""
        sqlite3_free(errmsg)
        if rc != SQLITE_OK {
            throw Self.error(rc, "\(Self.verb(sql)): \(message)", systemErrno: sqlite3_system_errno(h))
        }
    }

    /// Runs one statement without results through the statement cache: for the transaction control
    /// every write repeats (BEGIN IMMEDIATE, SAVEPOINT, RELEASE, COMMIT), parsed once per connection
    /// instead of once per use as `execute` does. It leaves the statement used last as it was (a
    /// reader's point lookup stays the one found without hashing).
    package func run(_ sql: String) throws(KeychainError) {
        let h = try handle
        let statement = try self.statement(sql, remember: false)
        defer { statement.reset() }
        do throws(KeychainError) { try statement.run() } catch {
            let rc = sqlite3_extended_errcode(h)
            throw Self.error(
                rc, "\(Self.verb(sql)): \(String(cString: sqlite3_errmsg(h)))", systemErrno: sqlite3_system_errno(h)
            )
        }
    }

    /// A cached prepared statement for `sql`; `body` runs with it and it is reset (bindings cleared)
    /// afterwards, whatever happens.
    package func withStatement<R>(_ sql: String, _ body: (SQLiteStatement) throws(KeychainError) -> R)
        throws(KeychainError) -> R
    {
        let statement = try self.statement(sql)
        defer { statement.reset() }
        return try body(statement)
    }

    /// The cached prepared statement for `sql`, for a caller that resets it itself before it lets go
    /// of it (`defer { statement.reset() }`), as `withStatement` does: the row reader of every `copy`
    /// uses it without a closure, which would copy its row filter into the closure's context.
    package func statement(_ sql: String) throws(KeychainError) -> SQLiteStatement {
        try statement(sql, remember: true)
    }

    /// `statement(_:)`, remembering the statement as the one used last only when `remember` is set.
    private func statement(_ sql: String, remember: Bool) throws(KeychainError) -> SQLiteStatement {
        if let last, last.sql == sql { return last.statement }
        if let cached = cache[sql] {
            if remember { last = (sql, cached) }
            return cached
        }
        let statement = try SQLiteStatement(connection: self, sql: sql)
        if cache.count >= Self.cacheLimit {
            cache.removeAll()
            last = nil
        }
        cache[sql] = statement
        if remember { last = (sql, statement) }
        return statement
    }

    /// Whether a transaction is open. SQLite can roll a whole transaction back by itself (after
    /// SQLITE_FULL, SQLITE_IOERR or SQLITE_NOMEM), so a writer checks this after any failure.
    package var inTransaction: Bool { (try? handle).map { sqlite3_get_autocommit($0) == 0 } ?? false }

    /// Number of rows the last INSERT/UPDATE/DELETE changed.
    package var changes: Int { (try? handle).map { Int(sqlite3_changes($0)) } ?? 0 }

    /// The one place an SQLite code becomes a KeychainError. SQLite's messages name tables and columns,
    /// never bound values, so they are safe to pass on.
    func check(_ rc: Int32, _ what: String) throws(KeychainError) {
        guard rc != SQLITE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE else { return }
        let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? ""
        throw Self.error(rc, "\(what): \(message)", systemErrno: db.map { sqlite3_system_errno($0) } ?? 0)
    }

    // Extended result codes are macros Swift does not import.
    private static let constraintUnique: Int32 = SQLITE_CONSTRAINT | (8 << 8)
    private static let constraintPrimaryKey: Int32 = SQLITE_CONSTRAINT | (6 << 8)

    /// A full disk is errSecIO saying so, whether SQLite reports SQLITE_FULL or an I/O error whose
    /// errno is ENOSPC/EDQUOT (a WAL append that fails): the caller can free space and retry.
    static func error(_ rc: Int32, _ message: String, systemErrno: Int32 = 0) -> KeychainError {
        let primary = rc & 0xFF
        if primary == SQLITE_FULL
            || (primary == SQLITE_IOERR
                && (Errno.Code(rawValue: systemErrno) == .noSpace
                    || Errno.Code(rawValue: systemErrno) == .quotaExceeded))
        {
            return KeychainError(.io, "the disk is full; free space and retry (\(message))")
        }
        switch primary {
        case SQLITE_CONSTRAINT:
            if rc == constraintUnique || rc == constraintPrimaryKey {
                return KeychainError(.duplicateItem, "The specified item already exists in the keychain.")
            }
            return KeychainError(.internal, "database constraint failed (\(message))")
        case SQLITE_READONLY: return KeychainError(.readOnly, "database is read-only (\(message))")
        case SQLITE_MISMATCH: return KeychainError(.noSuchAttr, "database type mismatch (\(message))")
        case SQLITE_NOMEM: return KeychainError(.allocate, "SQLite is out of memory")
        case SQLITE_IOERR: return KeychainError(.io, "database I/O error (\(message))")
        case SQLITE_BUSY, SQLITE_LOCKED: return KeychainError(.notAvailable, "database is busy (\(message))")
        case SQLITE_CORRUPT, SQLITE_NOTADB: return KeychainError(.notAvailable, "database file is damaged (\(message))")
        default: return KeychainError(.notAvailable, "database error \(rc) (\(message))")
        }
    }

    private static func verb(_ sql: String) -> String {
        String(sql.prefix { $0 != "(" }.prefix(48))
    }
}

/// A prepared statement. Finalized in deinit; the owning connection keeps it alive while cached.
package final class SQLiteStatement {
    private let statement: OpaquePointer
    private unowned let connection: SQLiteConnection

    init(connection: SQLiteConnection, sql: String) throws(KeychainError) {
        var s: OpaquePointer?
        let rc = sqlite3_prepare_v3(try connection.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &s, nil)
        try connection.check(rc, "prepare")
        guard let s else { throw KeychainError(.internal, "empty SQL statement") }
        statement = s
        self.connection = connection
    }

    deinit { sqlite3_finalize(statement) }

    func reset() {
        sqlite3_reset(statement)
        sqlite3_clear_bindings(statement)
    }

    package func bind(_ index: Int32, _ bytes: [UInt8]) throws(KeychainError) {
        let rc = bytes.withUnsafeBytes { b in
            // A non-nil pointer even for empty blobs, so SQLite stores a zero-length blob, not NULL.
            sqlite3_bind_blob(
                statement, index, b.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(b.count),
                keychaind_sqlite_transient())
        }
        try connection.check(rc, "bind")
    }

    /// Binds `bytes` without copying them: they must stay valid until the statement is reset or the
    /// parameter bound again (`SQLiteConnection.withStatement` resets it, clearing the bindings,
    /// before it returns, so bytes that outlive that call are safe).
    package func bind(_ index: Int32, borrowing bytes: UnsafeRawBufferPointer) throws(KeychainError) {
        // SQLITE_STATIC (a nil destructor): SQLite reads the bytes where they are.
        let rc = sqlite3_bind_blob(
            statement, index, bytes.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(bytes.count), nil)
        try connection.check(rc, "bind")
    }

    package func bind(_ index: Int32, _ value: Int64) throws(KeychainError) {
        try connection.check(sqlite3_bind_int64(statement, index, value), "bind")
    }

    package func bind(_ index: Int32, text: String) throws(KeychainError) {
        try connection.check(sqlite3_bind_text(statement, index, text, -1, keychaind_sqlite_transient()), "bind")
    }

    /// Advances; true while a row is available.
    package func step() throws(KeychainError) -> Bool {
        let rc = sqlite3_step(statement)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        try connection.check(rc, "step")
        return false
    }

    /// Runs to completion (statements without results).
    package func run() throws(KeychainError) {
        while try step() {}
    }

    package func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(statement, column) }

    package func blob(_ column: Int32) -> [UInt8] {
        let n = Int(sqlite3_column_bytes(statement, column))
        guard n > 0, let p = sqlite3_column_blob(statement, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }

    /// The length of the column's value in bytes.
    package func byteCount(_ column: Int32) -> Int { Int(sqlite3_column_bytes(statement, column)) }

    /// The column's bytes in place, `count` of them as `byteCount` gave (one call to SQLite fewer).
    package func withBlob<R>(_ column: Int32, count: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        body(UnsafeRawBufferPointer(start: count > 0 ? sqlite3_column_blob(statement, column) : nil, count: count))
    }

    /// The column's bytes in place, without a copy; valid only inside `body` (until the next step).
    package func withBlob<R>(_ column: Int32, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        let p = sqlite3_column_blob(statement, column)
        let n = Int(sqlite3_column_bytes(statement, column))
        return body(UnsafeRawBufferPointer(start: n > 0 ? p : nil, count: n > 0 ? n : 0))
    }

    /// Five columns' bytes in place at once (nil: an empty buffer for a column not selected), without
    /// a copy; valid only inside `body` (until the next step).
    package func withBlobs<R, E: Error>(
        _ a: Int32?, _ b: Int32?, _ c: Int32?, _ d: Int32?, _ e: Int32?,
        _ body: (
            UnsafeRawBufferPointer, UnsafeRawBufferPointer, UnsafeRawBufferPointer, UnsafeRawBufferPointer,
            UnsafeRawBufferPointer
        ) throws(E) -> R
    ) throws(E) -> R {
        func bytes(_ column: Int32?) -> UnsafeRawBufferPointer {
            guard let column else { return UnsafeRawBufferPointer(start: nil, count: 0) }
            // The pointer first, then the length (SQLite's advice: the length call never converts).
            let p = sqlite3_column_blob(statement, column)
            let n = Int(sqlite3_column_bytes(statement, column))
            return UnsafeRawBufferPointer(start: n > 0 ? p : nil, count: n > 0 ? n : 0)
        }
        return try body(bytes(a), bytes(b), bytes(c), bytes(d), bytes(e))
    }

    package func text(_ column: Int32) -> String? {
        guard let p = sqlite3_column_text(statement, column) else { return nil }
        return String(cString: p)
    }

}
