import KeychainCore
import KeychainSystem
import Synchronization

/// Sealed rows of recent point lookups (by the uniqueness digest), so a warm `copy` of the same item
/// skips SQLite and the reader pool altogether.
///
/// Only what the database already holds is kept: digests and sealed blobs, never plaintext. Absent
/// keys are remembered too (a caller with several access groups looks each one up). Every commit or
/// rollback of the writer clears the cache before the writer's caller is answered, and a lookup
/// stores its rows only if no write finished since it began, so a stale row is never served after
/// the write that replaced it was acknowledged.
public final class PointLookupCache: Sendable {
    struct Entry: Sendable {
        var row: StoredItem?
        var hasSecret: Bool
    }

    private let entries = Locked<[DigestKey: Entry]>([:])
    /// How many write transactions have finished (committed or rolled back): bumped, with the entries
    /// cleared, under their lock; read without it.
    private let finishedWrites = Atomic<UInt64>(0)
    /// Rows a store's point-lookup cache holds by default (4096).
    public static let defaultCapacity = 4096
    let capacity: Int

    init(capacity: Int) {
        self.capacity = max(0, capacity)
    }

    /// How many write transactions have finished so far (kept whether or not the cache is on). A
    /// lookup hands `store` the value from before its read transaction began: the store labels each
    /// reader's held read transaction with it (`ItemStore.read`).
    var generation: UInt64 { finishedWrites.load(ordering: .acquiring) }

    /// The cached rows for `keys` (absent keys contribute nothing), or nil if any key is not cached
    /// well enough (missing, or cached without the secret when the secret is needed).
    func rows(for keys: [DigestKey], needSecret: Bool) -> [StoredItem]? {
        entries.withLock { s -> [StoredItem]? in
            var found: [StoredItem] = []
            for key in keys {
                guard let entry = s[key] else { return nil }
                if let row = entry.row {
                    if needSecret && !entry.hasSecret { return nil }
                    found.append(row)
                }
            }
            return found
        }
    }

    /// What the cache says of one digest: its row, or that no row has it.
    enum Lookup {
        case row(StoredItem)
        case absent
    }

    /// `rows(for: [key], …)` without the arrays: the row cached for `key` (a reference, taken out
    /// under the lock and read by the caller after it), `.absent` when the cache knows no row has
    /// it, or nil when it is not cached well enough.
    func lookup(_ key: DigestKey, needSecret: Bool) -> Lookup? {
        let entry = entries.withLock { s in s[key] }
        guard let entry else { return nil }
        guard let row = entry.row else { return .absent }
        return needSecret && !entry.hasSecret ? nil : .row(row)
    }

    /// Remembers what one lookup read, unless a write finished since `generation` was taken (before
    /// the lookup's read transaction began).
    /// Rows whose sealed secret is larger are not kept, so the cache stays small in bytes too.
    static let maxSecretBytes = 16 * 1024

    func store(_ read: [(DigestKey, Entry)], generation: UInt64) {
        if read.contains(where: { ($0.1.row?.secret.count ?? 0) > Self.maxSecretBytes }) { return }
        entries.withLock { s in
            guard finishedWrites.load(ordering: .relaxed) == generation else { return }
            if s.count + read.count > capacity { s.removeAll(keepingCapacity: true) }
            for (key, entry) in read { s[key] = entry }
        }
    }

    /// After every write transaction, before its writers are answered: forgets every entry and
    /// counts the write.
    func invalidate() {
        entries.withLock { s in
            s.removeAll(keepingCapacity: true)
            finishedWrites.add(1, ordering: .releasing)
        }
    }
}

/// A uniqueness digest (`Digests.length` bytes) as a dictionary key, in four words: made from the
/// bytes without an allocation, compared in four steps. The digest is a keyed BLAKE2b output,
/// uniform and not choosable without the blind-index key, so its first word is as good a hash as
/// all of it: hashing that alone saves hashing the rest on every lookup (equality still compares
/// every byte). Only digests of that length are cached: a lookup by a key of any other length reads
/// the database (no row the item layer writes has one).
struct DigestKey: Hashable, Sendable {
    let words: (UInt64, UInt64, UInt64, UInt64)

    /// The key for `bytes`, or nil when they are not `Digests.length` long.
    init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count == Digests.length else { return nil }
        words = (
            bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self),
            bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self),
            bytes.loadUnaligned(fromByteOffset: 16, as: UInt64.self),
            bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self)
        )
    }

    /// The key for `bytes`, or nil when they are not `Digests.length` long.
    init?(_ bytes: [UInt8]) {
        guard let key = bytes.withUnsafeBytes({ DigestKey($0) }) else { return nil }
        self = key
    }

    static func == (a: DigestKey, b: DigestKey) -> Bool {
        a.words.0 == b.words.0 && a.words.1 == b.words.1 && a.words.2 == b.words.2 && a.words.3 == b.words.3
    }

    func hash(into hasher: inout Hasher) {
        hasher.combine(words.0)
    }

    /// What a `Dictionary` files the key by: its first word, mixed with the table's seed, without
    /// running `Hasher` (SipHash) on every lookup. Safe because that word is already a keyed hash
    /// that a caller cannot choose (see above), so no one can aim many keys at one bucket.
    func _rawHashValue(seed: Int) -> Int {
        Int(truncatingIfNeeded: words.0) ^ seed
    }
}

extension RowFilter {
    /// Whether this is a pure point lookup: nothing but `key_ix IN …`, optionally a class.
    var isPointLookup: Bool {
        uniqueIndexes != nil && ref == nil && serviceIndex == nil && accountIndex == nil
            && accessGroupIndexes == nil && requiredAttributeIndexes == nil && excludedAttributeIndex == nil
    }

    /// The cache keys of a pure point lookup whose digests are all `Digests.length` long, else nil
    /// (such a lookup reads the database).
    var pointLookupKeys: [DigestKey]? {
        guard isPointLookup, let digests = uniqueIndexes else { return nil }
        var keys: [DigestKey] = []
        keys.reserveCapacity(digests.count)
        for digest in digests {
            guard let key = DigestKey(digest) else { return nil }
            keys.append(key)
        }
        return keys
    }
}
