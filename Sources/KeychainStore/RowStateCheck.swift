public import KeychainCore
public import KeychainCrypto
import KeychainSystem

/// How `ItemStore.attachRowState` treats the stored record.
public enum RowStatePolicy: Sendable {
    /// The record must exist and match the rows; anything else refuses to open.
    case verify
    /// A new keychain: there must be no record yet; one is written for the (empty) table.
    case create
    /// Trust the rows as they are: write a record for them (the user's explicit `--accept-database`).
    case accept
}

/// What `attachRowState` found.
public struct RowStateCheck: Sendable {
    /// Item rows found in the table.
    public let rows: Int64
    /// The record was (re)written for the rows found: it was missing, did not match, or the file was
    /// an older copy.
    public let resealed: Bool
    /// The generation the record now carries (bumped by every transaction that changes rows).
    public let generation: UInt64
    /// Set when the generation mark beside the database was damaged or could not be written.
    public var markProblem: String? = nil
}

extension StoreReader {
    /// The count of item rows and the sum of every item's, meta row's and attribute-index entry's
    /// fingerprint (a full scan; at open only).
    func scanRowState(key: SecureBytes) throws(KeychainError) -> (count: Int64, sum: Sum256) {
        var count: Int64 = 0
        var sum = Sum256()
        try db.withStatement("SELECT \(RowFingerprint.columns) FROM items") { (s) throws(KeychainError) in
            try key.withUnsafeBytes { (k) throws(KeychainError) in
                while try s.step() {
                    count += 1
                    sum = sum + RowFingerprint.value(of: s, key: k)
                }
            }
        }
        try db.withStatement("SELECT name, value FROM meta WHERE name != ?") { (s) throws(KeychainError) in
            try s.bind(1, text: RowState.metaName)
            while try s.step() {
                sum = sum + MetaFingerprint(name: s.text(0) ?? "", value: s.blob(1)).value(key: key)
            }
        }
        try db.withStatement("SELECT ix, ref FROM item_attributes") { (s) throws(KeychainError) in
            while try s.step() {
                sum = sum + AttributeIndexFingerprint(index: s.blob(0), ref: s.blob(1)).value(key: key)
            }
        }
        return (count, sum)
    }

    /// The fingerprint of one row as it is now (before it is rewritten or deleted).
    func fingerprint(rowid: Int64) throws(KeychainError) -> RowFingerprint? {
        try db.withStatement("SELECT \(RowFingerprint.columns) FROM items WHERE rowid = ?") {
            (s) throws(KeychainError) in
            try s.bind(1, rowid)
            return try s.step() ? RowFingerprint(s) : nil
        }
    }

    /// How many rows of one class there are (with or without the presence bit) and the sum of their fingerprints (streamed: no row is
    /// kept in memory).
    func fingerprintSum(protectionClass: UInt8, key: SecureBytes) throws(KeychainError) -> (count: Int64, sum: Sum256) {
        try db.withStatement("SELECT \(RowFingerprint.columns) FROM items WHERE class & 127 = ?") {
            (s) throws(KeychainError) in
            try s.bind(1, Int64(protectionClass))
            var count: Int64 = 0
            var sum = Sum256()
            try key.withUnsafeBytes { (k) throws(KeychainError) in
                while try s.step() {
                    count += 1
                    sum = sum + RowFingerprint.value(of: s, key: k)
                }
            }
            return (count, sum)
        }
    }
}

extension ItemStore {
    /// Checks the rows against the row-state record (see `RowState`) and from now on keeps the record
    /// current with every write. Must be called once, right after opening and before any item write;
    /// until then item writes are refused. `first` runs in the same transaction, before the check
    /// (a new keychain stores its keyring there, so the keyring never exists without a record).
    ///
    /// A mismatch is `errSecDecode` with a message that says what differs and how to accept the rows.
    public func attachRowState(
        key: SecureBytes, policy: RowStatePolicy,
        first: (StoreWriter) throws(KeychainError) -> Void = { _ in }
    ) throws(KeychainError) -> RowStateCheck {
        let path = self.path
        let mark = GenerationMark(databasePath: path, key: key)
        let seen = mark.read()
        let (state, check) = try write { (w) throws(KeychainError) -> (RowState, RowStateCheck) in
            try first(w)
            let scanned = try w.reader.scanRowState(key: key)
            let lostKeyring = KeychainError(
                .decode,
                """
                the database \(path) has a row-state record but no keyring: it is damaged. Restore it from a \
                backup, or move it away to start an empty keychain
                """)
            if policy == .create, case .generation(let last) = seen {
                // This device key's mark says a keychain was committed here: the database lost it.
                throw KeychainError(
                    .decode,
                    """
                    the database \(path) holds no keychain, but this keychain already committed generation \(last) \
                    (\(mark.path)): the database was emptied or replaced. Nothing was changed. Restore \
                    keychain.db from a backup; to start an empty keychain instead, move keychain.db, \
                    keychain.db-generation and device.key away
                    """)
            }
            var stored: RowState.Record?
            do throws(KeychainError) {
                stored = try w.reader.meta(RowState.metaName).map { (b) throws(KeychainError) in try RowState.Record(b)
                }
            } catch {
                switch policy {
                case .accept: stored = nil  // a damaged record is rewritten like a missing one
                case .create: throw lostKeyring
                case .verify: throw error
                }
            }
            if let stored {
                guard policy != .create else { throw lostKeyring }
                let candidate = RowState(count: scanned.count, generation: stored.generation, sum: scanned.sum)
                let matches = Sodium.equal(candidate.tag(key: key), stored.tag)
                if matches, case .generation(let last) = seen, last > stored.generation, policy != .accept {
                    throw KeychainError(
                        .decode,
                        """
                        the database \(path) is an older copy: its rows are consistent, but this keychain already \
                        committed generation \(last) and the file is at generation \(stored.generation) (changes made \
                        since were lost or rolled back). Nothing was changed. Put the current file back, or if you \
                        restored this copy on purpose, run keychaind --accept-database once
                        """)
                }
                if matches, policy != .accept || !Self.behind(stored.generation, seen) {
                    return (
                        candidate, RowStateCheck(rows: scanned.count, resealed: false, generation: stored.generation)
                    )
                }
                guard policy == .accept else {
                    throw Self.mismatch(path: path, rows: scanned.count, recorded: stored.count)
                }
            } else if policy == .verify {
                throw KeychainError(
                    .decode,
                    """
                    the database \(path) has no row-state record, so rows removed, changed or replayed from an older \
                    copy cannot be detected (the record was deleted, or the file was written by a keychaind without \
                    row-state records). If you trust its contents, run keychaind --accept-database once
                    """)
            }
            // Resealed past both the database's and the mark's generation, so the mark accepts it.
            var base = stored?.generation ?? 0
            if case .generation(let last) = seen { base = max(base, last) }
            let resealed = RowState(count: scanned.count, generation: base &+ 1, sum: scanned.sum)
            try w.setMeta(RowState.metaName, resealed.record(key: key))
            return (resealed, RowStateCheck(rows: scanned.count, resealed: true, generation: resealed.generation))
        }
        var markProblem: String?
        if seen == .damaged {
            markProblem =
                "the generation mark \(mark.path) was unreadable or damaged; it was rewritten from the database"
        }
        if seen == .missing && policy != .create {
            markProblem = "the generation mark \(mark.path) was missing; it was recreated from the database"
        }
        if seen == .generation(state.generation) {
            mark.holds(state.generation)
        } else if !mark.write(state.generation) {
            markProblem =
                "cannot write the generation mark \(mark.path): an older copy of the whole database would go unnoticed"
        }
        try writer.attach(RowStateTracker(key: key, committed: state, mark: mark))
        return RowStateCheck(
            rows: check.rows, resealed: check.resealed, generation: check.generation, markProblem: markProblem)
    }

    /// Whether the mark says the database's generation is behind what was committed.
    private static func behind(_ generation: UInt64, _ seen: GenerationMark.Reading) -> Bool {
        if case .generation(let last) = seen { return last > generation }
        return false
    }

    private static func items(_ n: Int64) -> String { n == 1 ? "1 item" : "\(n) items" }

    private static func mismatch(path: String, rows: Int64, recorded: Int64) -> KeychainError {
        let what =
            rows == recorded
            ? "holds \(items(rows)), as recorded, but not the versions of its items or settings keychaind last wrote"
            : "holds \(items(rows)) where keychaind last recorded \(recorded)"
        return KeychainError(
            .decode,
            """
            the database \(path) \(what): rows were removed, added, swapped or restored from an older copy, or \
            the file is damaged (items and settings such as the keyring are both covered). Nothing was changed. If you restored or edited the file yourself and trust it, \
            run keychaind --accept-database once
            """)
    }
}
