import KeychainCore
import KeychainSystem
import Synchronization

/// Owns the writer connection and commits concurrent writes in groups (see `ItemStore.write`).
///
/// A mutex and condition variable guard the connection and the group state; `queued` counts writers
/// waiting for the mutex, which is how the writer that holds it knows whether someone will come after
/// it to commit.
final class WriterGate: @unchecked Sendable {
    // Safety: every `var` below is read and written only with `mutex` held (each method takes it
    // first; `finish` and `takeFailure` are called with it held); `queued` is atomic.
    private let mutex = Lock()
    private let committedCondition = Condition()
    private let queued = Atomic<Int>(0)

    // Guarded by `mutex`.
    private var connection: SQLiteConnection?
    private var inTransaction = false
    private var openGroup: UInt64 = 0
    private var groupSize = 0
    private var finishedGroup: UInt64 = 0
    /// Failures of finished groups, each with how many of the group's writers have yet to read it.
    private var failures: [UInt64: (error: KeychainError, unread: Int)] = [:]
    /// The row state kept current with every write (nil until `attach`; item writes are refused then).
    private var rows: RowStateTracker?

    /// Writers waiting for the writer right now (tests wait for one to queue).
    var waitingWriters: Int { queued.load(ordering: .sequentiallyConsistent) }

    /// A group is committed at this size even when more writers are queued, to bound latency.
    static let maxGroupSize = 128

    /// Told, with the mutex held, when a write transaction or a checkpoint of the gate's begins (true)
    /// and when it has ended (false; after the commit, whose automatic checkpoint is part of it). The
    /// store's readers hold no read transaction in the pool meanwhile (`ItemStore`).
    private let writing: @Sendable (Bool) -> Void
    /// Runs after every commit or rollback, before the group's writers are released (cache upkeep).
    private let afterTransaction: @Sendable () -> Void

    /// The write-ahead log's path, the size above which a commit truncates it, and how often a
    /// commit looks at that size (nil: never).
    private let log: (path: String, limit: Int64, every: Double)?
    /// When a commit last looked at the log's size (guarded by `mutex`).
    private var logChecked = -Double.infinity

    init(
        _ connection: SQLiteConnection, log: (path: String, limit: Int64, every: Double)? = nil,
        writing: @escaping @Sendable (Bool) -> Void = { _ in },
        afterTransaction: @escaping @Sendable () -> Void = {}
    ) {
        self.connection = connection
        self.log = log
        self.writing = writing
        self.afterTransaction = afterTransaction
    }

    func run<R: Sendable>(_ body: (StoreWriter) throws(KeychainError) -> R) throws(KeychainError) -> R {
        queued.add(1, ordering: .sequentiallyConsistent)
        mutex.lock()
        queued.subtract(1, ordering: .sequentiallyConsistent)
        defer { mutex.unlock() }

        guard let db = connection else { throw KeychainError(.notAvailable, "the keychain database is closed") }
        if !inTransaction {
            try begin(db)
            inTransaction = true
            openGroup &+= 1
            groupSize = 0
        }
        let group = openGroup
        groupSize += 1

        let outcome: Result<R, KeychainError>
        var rollbackFailed = false
        do throws(KeychainError) {
            try db.run("SAVEPOINT item_write")
            do throws(KeychainError) {
                let value = try body(StoreWriter(db: db, rows: rows))
                try db.run("RELEASE item_write")
                rows?.bodyKept()
                outcome = .success(value)
            } catch {
                rows?.bodyDropped()
                outcome = .failure(error)
                do throws(KeychainError) {
                    try db.run("ROLLBACK TO item_write")
                    try db.run("RELEASE item_write")
                } catch _ {
                    rollbackFailed = true
                }
            }
        } catch {
            // The savepoint itself failed: the transaction is unusable; end the whole group.
            finish(db, group: group, commit: false, failure: error)
            throw takeFailure(group) ?? error
        }
        // After SQLITE_FULL or an I/O error SQLite may have rolled back the whole transaction, the
        // group's earlier writes included: then none of them may be acknowledged, and the writers
        // queued behind must not go on outside a transaction. A savepoint that cannot be rolled back
        // leaves the body's changes in a transaction they must not be committed with: the same.
        if rollbackFailed || !db.inTransaction {
            var cause = KeychainError(.io, "the transaction ended unexpectedly")
            if case .failure(let e) = outcome { cause = e }
            finish(
                db, group: group, commit: false,
                failure: KeychainError(
                    cause.status, "rolled back together with the writes grouped with it: \(cause.message)"))
            throw takeFailure(group) ?? cause
        }

        if queued.load(ordering: .sequentiallyConsistent) > 0 && groupSize < Self.maxGroupSize {
            // Someone is queued for the mutex: they continue the group and one of them commits.
            while finishedGroup < group { mutex.wait(committedCondition) }
        } else {
            finish(db, group: group, commit: true, failure: nil)
        }
        if let failure = takeFailure(group) { throw failure }
        return try outcome.get()
    }

    /// Runs `body` in a transaction of its own and commits it before returning (a group still open is
    /// committed first; writers queued meanwhile start the next group). `readers` is held exclusively
    /// around the COMMIT and `committed`, which runs only when the commit succeeded and before any
    /// other write starts — where new keys are put in force together with the rows sealed under them.
    /// If `body` throws or the commit fails, everything it did is rolled back and `committed` does not
    /// run.
    func runAlone<R>(
        _ body: (StoreWriter) throws(KeychainError) -> R,
        readers: TransitionLock,
        committed: () -> Void
    ) throws(KeychainError) -> R {
        queued.add(1, ordering: .sequentiallyConsistent)
        mutex.lock()
        queued.subtract(1, ordering: .sequentiallyConsistent)
        defer { mutex.unlock() }

        guard let db = connection else { throw KeychainError(.notAvailable, "the keychain database is closed") }
        if inTransaction { finish(db, group: openGroup, commit: true, failure: nil) }
        try begin(db)
        inTransaction = true
        openGroup &+= 1
        groupSize = 1
        let group = openGroup

        let value: R
        do throws(KeychainError) {
            value = try body(StoreWriter(db: db, rows: rows))
            rows?.bodyKept()
        } catch {
            rows?.bodyDropped()
            finish(db, group: group, commit: false, failure: error)
            throw takeFailure(group) ?? error
        }
        readers.exclusive { finish(db, group: group, commit: true, failure: nil, committed: committed) }
        if let failure = takeFailure(group) { throw failure }
        return value
    }

    /// `BEGIN IMMEDIATE`, the store told first (and told again if it fails).
    private func begin(_ db: SQLiteConnection) throws(KeychainError) {
        writing(true)
        do throws(KeychainError) { try db.run("BEGIN IMMEDIATE") } catch {
            writing(false)
            throw error
        }
    }

    /// The failure of a finished group, read once by each of its writers (the entry goes with the last).
    private func takeFailure(_ group: UInt64) -> KeychainError? {
        guard var entry = failures[group] else { return nil }
        entry.unread -= 1
        failures[group] = entry.unread > 0 ? entry : nil
        return entry.error
    }

    /// Commits (or rolls back) the open group and wakes its waiting writers. Called with the mutex held.
    private func finish(
        _ db: SQLiteConnection, group: UInt64, commit: Bool, failure: KeychainError?,
        committed: () -> Void = {}
    ) {
        var error = failure
        if commit {
            do throws(KeychainError) {
                guard db.inTransaction else {
                    throw KeychainError(.io, "the transaction was rolled back by the database")
                }
                if let rows, let state = rows.pending {
                    try StoreWriter(db: db).setMeta(RowState.metaName, state.record(key: rows.key))
                }
                try db.run("COMMIT")
            } catch let e {
                error = KeychainError(e.status, "the write could not be committed: \(e.message)")
            }
        }
        if error != nil || !commit {
            try? db.run("ROLLBACK")
            rows?.groupAbandoned()
        } else {
            rows?.groupCommitted()
            committed()
        }
        afterTransaction()
        if error == nil, commit { boundLog(db) }
        writing(false)
        // Every writer that joined the group reads its failure once (takeFailure), however late it
        // gets the mutex back.
        if let error { failures[group] = (error, groupSize) }
        inTransaction = false
        finishedGroup = group
        committedCondition.broadcast()
    }

    /// After a commit, while no reader keeps a read transaction in the pool: a log that grew past its
    /// limit is checkpointed and truncated. SQLite restarts the log from its start only after a
    /// checkpoint that copied all of it, and a read in progress at every commit's automatic
    /// checkpoint (readers that never pause) keeps that from happening: without this bound the file
    /// would grow for as long as they read. Reads that begin meanwhile do not hold the checkpoint up;
    /// it waits at most `logWaitMs` for those in progress, else it is tried again later, so a slow
    /// read never stalls the writes for long. The size is looked at once per `every` seconds at
    /// most: a `stat` right after each commit's fdatasync cost durable adds a fifth of their rate.
    private func boundLog(_ db: SQLiteConnection) {
        guard let log else { return }
        let now = MonotonicClock.now()
        guard now - logChecked >= log.every else { return }
        logChecked = now
        guard let size = try? FileSystem.status(log.path).size, size > log.limit else { return }
        db.withBusyTimeout(Self.logWaitMs) { try? db.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
    }

    /// How long `boundLog` waits for reads in progress.
    static let logWaitMs: Int32 = 100

    /// Starts keeping `tracker` current; from now on every commit that changes rows rewrites its record.
    func attach(_ tracker: RowStateTracker) throws(KeychainError) {
        mutex.lock()
        defer { mutex.unlock() }
        guard rows == nil else { throw KeychainError(.internal, "the row state is already attached") }
        rows = tracker
    }

    /// A TRUNCATE checkpoint between transactions (a group still open is committed first).
    func truncateLog() {
        mutex.lock()
        defer { mutex.unlock() }
        guard let db = connection else { return }
        if inTransaction { finish(db, group: openGroup, commit: true, failure: nil) }
        writing(true)
        try? db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        writing(false)
    }

    /// Commits what is open, checkpoints the WAL and closes the connection.
    func close() {
        mutex.lock()
        defer { mutex.unlock() }
        guard let db = connection else { return }
        if inTransaction { finish(db, group: openGroup, commit: true, failure: nil) }
        writing(true)
        try? db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        writing(false)
        rows?.closing()
        db.close()
        connection = nil
    }
}
