public import KeychainCore
public import KeychainCrypto

/// The row state: a keyed digest of which version of every row the database should hold, so rows
/// removed, added, swapped or replayed from an older copy of the database are caught when the store
/// opens, instead of reading as an item's older self.
///
/// Each row has a *fingerprint*: keyed BLAKE2b-256 of its ref, class, index digests and the nonces of
/// its three sealed blobs. Every write reseals at least one blob with a fresh random nonce, so a
/// row's fingerprint changes with each version; the AEAD tags bind each nonce to its ciphertext, so a
/// blob cannot keep a current nonce with older contents. The fingerprints are added modulo 2²⁵⁶ (an
/// incremental multiset hash), and the `meta` row `rows` holds the number of rows, a generation
/// counter and a keyed tag over (count, generation, sum). The sum itself is never stored, so copies
/// of the file taken over time show only tags, not differences an attacker could combine.
///
/// At open the store recomputes the sum from every row and checks the tag (`ItemStore.attachRowState`);
/// each write transaction then updates the sum in memory and rewrites the record in the same
/// transaction, so a crash leaves the rows and the record consistent. What this does not catch: the
/// whole database file (record included) replaced by an older copy — that needs state outside the
/// file (docs/security.md §7). Damaged ciphertext keeps its nonce, so it stays a per-item errSecDecode.
public struct RowState: Sendable, Equatable {
    public static let metaName = "rows"
    static let recordVersion: UInt8 = 1

    /// Rows in the table.
    public internal(set) var count: Int64
    /// Bumped by every transaction that changes rows (and by an accepted reseal).
    public internal(set) var generation: UInt64
    var sum: Sum256

    /// `version ‖ count (8, LE) ‖ generation (8, LE) ‖ tag (32)`.
    func record(key: SecureBytes) -> [UInt8] {
        [Self.recordVersion] + Self.littleEndian(UInt64(bitPattern: count)) + Self.littleEndian(generation) + tag(key: key)
    }

    func tag(key: SecureBytes) -> [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(key: $0, domain: 0xE1,
                           parts: [Self.littleEndian(UInt64(bitPattern: count)), Self.littleEndian(generation), sum.bytes],
                           length: 32)
        }
    }

    /// The fields of a stored record (its tag is checked against a recomputed sum by the caller).
    struct Record {
        var count: Int64
        var generation: UInt64
        var tag: [UInt8]

        init(_ bytes: [UInt8]) throws(KeychainError) {
            guard bytes.count == 49, bytes[0] == RowState.recordVersion else {
                throw KeychainError(.decode, "the database's row-state record is damaged or of an unknown version; if you trust the database, run keychaind --accept-database once")
            }
            count = Int64(bitPattern: RowState.readLittleEndian(bytes[1..<9]))
            generation = RowState.readLittleEndian(bytes[9..<17])
            tag = Array(bytes[17...])
        }
    }

    static func littleEndian(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }

    static func readLittleEndian(_ b: ArraySlice<UInt8>) -> UInt64 {
        var v: UInt64 = 0
        for (i, byte) in b.enumerated() { v |= UInt64(byte) << (8 * i) }
        return v
    }
}

/// A 256-bit unsigned integer, added and subtracted modulo 2²⁵⁶ (little-endian limbs).
struct Sum256: Sendable, Equatable {
    var limbs: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)

    init() {}

    init(_ bytes: [UInt8]) {
        precondition(bytes.count == 32)
        limbs = (RowState.readLittleEndian(bytes[0..<8]), RowState.readLittleEndian(bytes[8..<16]),
                 RowState.readLittleEndian(bytes[16..<24]), RowState.readLittleEndian(bytes[24..<32]))
    }

    init(_ raw: UnsafeRawBufferPointer) {
        precondition(raw.count == 32)
        limbs = (UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                 UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self)),
                 UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: UInt64.self)),
                 UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self)))
    }

    var bytes: [UInt8] {
        RowState.littleEndian(limbs.0) + RowState.littleEndian(limbs.1) + RowState.littleEndian(limbs.2) + RowState.littleEndian(limbs.3)
    }

    static func + (a: Sum256, b: Sum256) -> Sum256 {
        var r = Sum256()
        var carry: UInt64 = 0
        func add(_ x: UInt64, _ y: UInt64) -> UInt64 {
            let (s1, o1) = x.addingReportingOverflow(y)
            let (s2, o2) = s1.addingReportingOverflow(carry)
            carry = (o1 ? 1 : 0) + (o2 ? 1 : 0)
            return s2
        }
        r.limbs.0 = add(a.limbs.0, b.limbs.0)
        r.limbs.1 = add(a.limbs.1, b.limbs.1)
        r.limbs.2 = add(a.limbs.2, b.limbs.2)
        r.limbs.3 = add(a.limbs.3, b.limbs.3)
        return r
    }

    /// The additive inverse modulo 2²⁵⁶ (two's complement).
    var negated: Sum256 {
        var inverted = Sum256()
        inverted.limbs = (~limbs.0, ~limbs.1, ~limbs.2, ~limbs.3)
        var one = Sum256()
        one.limbs.0 = 1
        return inverted + one
    }

    static func - (a: Sum256, b: Sum256) -> Sum256 { a + b.negated }

    static func == (a: Sum256, b: Sum256) -> Bool {
        a.limbs.0 == b.limbs.0 && a.limbs.1 == b.limbs.1 && a.limbs.2 == b.limbs.2 && a.limbs.3 == b.limbs.3
    }
}

/// What of a row its fingerprint covers: everything but the ciphertext bodies.
struct RowFingerprint {
    var ref: [UInt8]
    /// The whole column value: a class changed to 268 must not pass for 12.
    var protectionClass: Int64
    var accessGroupIndex: [UInt8]
    var serviceIndex: [UInt8]
    var accountIndex: [UInt8]
    var uniqueIndex: [UInt8]
    var itemKeyNonce: [UInt8]
    var attributesNonce: [UInt8]
    var secretNonce: [UInt8]

    /// The columns a fingerprint is read from, in this order (blobs cut to their nonce).
    static let columns = "ref, class, agrp_ix, svce_ix, acct_ix, key_ix, substr(item_key, 1, 24), substr(attributes, 1, 24), substr(secret, 1, 24)"

    /// Read from `columns`, selected starting at result column `first`.
    init(_ s: SQLiteStatement, first: Int32 = 0) {
        ref = s.blob(first)
        protectionClass = s.int64(first + 1)
        accessGroupIndex = s.blob(first + 2)
        serviceIndex = s.blob(first + 3)
        accountIndex = s.blob(first + 4)
        uniqueIndex = s.blob(first + 5)
        itemKeyNonce = s.blob(first + 6)
        attributesNonce = s.blob(first + 7)
        secretNonce = s.blob(first + 8)
    }

    init(_ item: StoredItem, secretNonce: [UInt8]? = nil) {
        ref = item.ref
        protectionClass = Int64(item.protectionClass)
        accessGroupIndex = item.accessGroupIndex
        serviceIndex = item.serviceIndex
        accountIndex = item.accountIndex
        uniqueIndex = item.uniqueIndex
        itemKeyNonce = Array(item.wrappedKey.prefix(AEAD.nonceBytes))
        attributesNonce = Array(item.attributes.prefix(AEAD.nonceBytes))
        self.secretNonce = secretNonce ?? Array(item.secret.prefix(AEAD.nonceBytes))
    }

    /// The fingerprint of the row `s` is on, hashed from SQLite's buffers without copying them (the
    /// scan at open); the same bytes, in the same order, as `value(key:)`.
    static func value(of s: SQLiteStatement, key: UnsafeRawBufferPointer) -> Sum256 {
        withUnsafeTemporaryAllocation(byteCount: 32, alignment: 8) { out in
            KeyedHash.hash(key: key, domain: 0xE0, into: out) { add in
                s.withBlob(0, add)
                var protectionClass = UInt64(bitPattern: s.int64(1)).littleEndian
                withUnsafeBytes(of: &protectionClass, add)
                for column in Int32(2)...8 { s.withBlob(column, add) }
            }
            return Sum256(UnsafeRawBufferPointer(out))
        }
    }

    func value(key: SecureBytes) -> Sum256 {
        Sum256(key.withUnsafeBytes {
            KeyedHash.hash(key: $0, domain: 0xE0,
                           parts: [ref, RowState.littleEndian(UInt64(bitPattern: protectionClass)), accessGroupIndex, serviceIndex, accountIndex, uniqueIndex,
                                   itemKeyNonce, attributesNonce, secretNonce],
                           length: 32)
        })
    }
}

/// A `meta` row (keyring, unlock-failure counter, …) counts in the sum too, so an older keyring — say
/// one from before a passphrase was set — or a reset failure counter cannot be put back unnoticed.
/// The record's own row (`rows`) is the one left out.
struct MetaFingerprint {
    var name: String
    var value: [UInt8]

    func value(key: SecureBytes) -> Sum256 {
        Sum256(key.withUnsafeBytes {
            KeyedHash.hash(key: $0, domain: 0xE3, parts: [Array(name.utf8), value], length: 32)
        })
    }
}

/// The row state as the writer sees it: what is committed, plus the changes of the open group
/// transaction and of the write running in it. Only touched with the `WriterGate` mutex held.
final class RowStateTracker {
    let key: SecureBytes
    private(set) var committed: RowState
    /// The generation kept outside the database (nil in stores opened without one).
    let mark: GenerationMark?

    private struct Delta {
        var count: Int64 = 0
        var sum = Sum256()
        var touched = false
    }
    private var group = Delta()
    private var body = Delta()

    init(key: SecureBytes, committed: RowState, mark: GenerationMark?) {
        self.key = key
        self.committed = committed
        self.mark = mark
    }


    func added(_ row: RowFingerprint) {
        body.count += 1
        body.sum = body.sum + row.value(key: key)
        body.touched = true
    }

    func removed(_ row: RowFingerprint) {
        body.count -= 1
        body.sum = body.sum - row.value(key: key)
        body.touched = true
    }

    /// `count` rows whose fingerprints add up to `sum` went (a bulk delete, summed while scanning).
    func removed(count: Int64, sum: Sum256) {
        body.count -= count
        body.sum = body.sum - sum
        body.touched = true
    }

    func added(_ meta: MetaFingerprint) {
        body.sum = body.sum + meta.value(key: key)
        body.touched = true
    }

    func removed(_ meta: MetaFingerprint) {
        body.sum = body.sum - meta.value(key: key)
        body.touched = true
    }

    /// The running write was released into the group (its savepoint kept).
    func bodyKept() {
        if body.touched {
            group.count += body.count
            group.sum = group.sum + body.sum
            group.touched = true
        }
        body = Delta()
    }

    /// The running write was rolled back to its savepoint.
    func bodyDropped() { body = Delta() }

    /// The state the group's commit must record, or nil when the group changed no rows.
    var pending: RowState? {
        guard group.touched else { return nil }
        return RowState(count: committed.count + group.count, generation: committed.generation &+ 1,
                        sum: committed.sum + group.sum)
    }

    /// The group committed: `pending` is now the committed state.
    func groupCommitted() {
        if let pending {
            committed = pending
            mark?.committed(pending.generation)
        }
        group = Delta()
        body = Delta()
    }

    /// The store is closing: the mark catches up with the last commit.
    func closing() { mark?.flush(committed.generation) }

    /// The group rolled back.
    func groupAbandoned() {
        group = Delta()
        body = Delta()
    }
}

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
    public let rows: Int64
    /// The record was (re)written for the rows found: it was missing, did not match, or the file was
    /// an older copy.
    public let resealed: Bool
    public let generation: UInt64
    /// Set when the generation mark beside the database was damaged or could not be written.
    public var markProblem: String? = nil
}

extension StoreReader {
    /// The count of item rows and the sum of every item's and meta row's fingerprint (a full scan;
    /// at open only).
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
        return (count, sum)
    }

    /// The fingerprint of one row as it is now (before it is rewritten or deleted).
    func fingerprint(rowid: Int64) throws(KeychainError) -> RowFingerprint? {
        try db.withStatement("SELECT \(RowFingerprint.columns) FROM items WHERE rowid = ?") { (s) throws(KeychainError) in
            try s.bind(1, rowid)
            return try s.step() ? RowFingerprint(s) : nil
        }
    }

    /// How many rows of one class there are and the sum of their fingerprints (streamed: no row is
    /// kept in memory).
    func fingerprintSum(protectionClass: UInt8, key: SecureBytes) throws(KeychainError) -> (count: Int64, sum: Sum256) {
        try db.withStatement("SELECT \(RowFingerprint.columns) FROM items WHERE class = ?") { (s) throws(KeychainError) in
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
    public func attachRowState(key: SecureBytes, policy: RowStatePolicy,
                               first: (StoreWriter) throws(KeychainError) -> Void = { _ in }) throws(KeychainError) -> RowStateCheck {
        let path = self.path
        let mark = GenerationMark(databasePath: path, key: key)
        let seen = mark.read()
        let (state, check) = try write { (w) throws(KeychainError) -> (RowState, RowStateCheck) in
            try first(w)
            let scanned = try w.reader.scanRowState(key: key)
            let lostKeyring = KeychainError(.decode, """
                the database \(path) has a row-state record but no keyring: it is damaged. Restore it from a \
                backup, or move it away to start an empty keychain
                """)
            if policy == .create, case .generation(let last) = seen {
                // This device key's mark says a keychain was committed here: the database lost it.
                throw KeychainError(.decode, """
                    the database \(path) holds no keychain, but this keychain already committed generation \(last) \
                    (\(mark.path)): the database was emptied or replaced. Nothing was changed. Restore \
                    keychain.db from a backup; to start an empty keychain instead, move keychain.db, \
                    keychain.db-generation and device.key away
                    """)
            }
            var stored: RowState.Record?
            do throws(KeychainError) {
                stored = try w.reader.meta(RowState.metaName).map { (b) throws(KeychainError) in try RowState.Record(b) }
            } catch {
                switch policy {
                case .accept: stored = nil          // a damaged record is rewritten like a missing one
                case .create: throw lostKeyring
                case .verify: throw error
                }
            }
            if let stored {
                guard policy != .create else { throw lostKeyring }
                let candidate = RowState(count: scanned.count, generation: stored.generation, sum: scanned.sum)
                let matches = Sodium.equal(candidate.tag(key: key), stored.tag)
                if matches, case .generation(let last) = seen, last > stored.generation, policy != .accept {
                    throw KeychainError(.decode, """
                        the database \(path) is an older copy: its rows are consistent, but this keychain already \
                        committed generation \(last) and the file is at generation \(stored.generation) (changes made \
                        since were lost or rolled back). Nothing was changed. Put the current file back, or if you \
                        restored this copy on purpose, run keychaind --accept-database once
                        """)
                }
                if matches, policy != .accept || !Self.behind(stored.generation, seen) {
                    return (candidate, RowStateCheck(rows: scanned.count, resealed: false, generation: stored.generation))
                }
                guard policy == .accept else { throw Self.mismatch(path: path, rows: scanned.count, recorded: stored.count) }
            } else if policy == .verify {
                throw KeychainError(.decode, """
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
        if seen == .damaged { markProblem = "the generation mark \(mark.path) was unreadable or damaged; it was rewritten from the database" }
        if seen == .missing && policy != .create { markProblem = "the generation mark \(mark.path) was missing; it was recreated from the database" }
        if seen == .generation(state.generation) {
            mark.holds(state.generation)
        } else if !mark.write(state.generation) {
            markProblem = "cannot write the generation mark \(mark.path): an older copy of the whole database would go unnoticed"
        }
        try writer.attach(RowStateTracker(key: key, committed: state, mark: mark))
        return RowStateCheck(rows: check.rows, resealed: check.resealed, generation: check.generation, markProblem: markProblem)
    }

    /// Whether the mark says the database's generation is behind what was committed.
    private static func behind(_ generation: UInt64, _ seen: GenerationMark.Reading) -> Bool {
        if case .generation(let last) = seen { return last > generation }
        return false
    }

    private static func items(_ n: Int64) -> String { n == 1 ? "1 item" : "\(n) items" }

    private static func mismatch(path: String, rows: Int64, recorded: Int64) -> KeychainError {
        let what = rows == recorded
            ? "holds \(items(rows)), as recorded, but not the versions of its items or settings keychaind last wrote"
            : "holds \(items(rows)) where keychaind last recorded \(recorded)"
        return KeychainError(.decode, """
            the database \(path) \(what): rows were removed, added, swapped or restored from an older copy, or \
            the file is damaged (items and settings such as the keyring are both covered). Nothing was changed. If you restored or edited the file yourself and trust it, \
            run keychaind --accept-database once
            """)
    }
}
