import KeychainCore
import KeychainSystem

/// Sealed rows of recent point lookups (by the uniqueness digest), so a warm `copy` of the same item
/// skips SQLite — its statement and the two `fcntl` calls of a WAL read transaction.
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

    private struct State: Sendable {
        var generation: UInt64 = 0
        var entries: [DigestKey: Entry] = [:]
    }

    private let state = Locked(State())
    /// Rows a store's point-lookup cache holds by default (4096).
    public static let defaultCapacity = 4096
    let capacity: Int

    init(capacity: Int) {
        self.capacity = max(0, capacity)
    }

    /// Taken before a lookup reads the database; handed back to `store`.
    var generation: UInt64 { state.withLock { $0.generation } }

    /// The cached rows for `keys` (absent keys contribute nothing), or nil if any key is not cached
    /// well enough (missing, or cached without the secret when the secret is needed).
    func rows(for keys: [[UInt8]], needSecret: Bool) -> [StoredItem]? {
        state.withLock { s -> [StoredItem]? in
            var found: [StoredItem] = []
            for key in keys {
                guard let entry = s.entries[DigestKey(key)] else { return nil }
                if let row = entry.row {
                    if needSecret && !entry.hasSecret { return nil }
                    found.append(row)
                }
            }
            return found
        }
    }

    /// Remembers what one lookup read, unless a write finished since `generation` was taken.
    /// Rows whose sealed secret is larger are not kept, so the cache stays small in bytes too.
    static let maxSecretBytes = 16 * 1024

    func store(_ entries: [([UInt8], Entry)], generation: UInt64) {
        if entries.contains(where: { ($0.1.row?.secret.count ?? 0) > Self.maxSecretBytes }) { return }
        state.withLock { s in
            guard s.generation == generation else { return }
            if s.entries.count + entries.count > capacity { s.entries.removeAll(keepingCapacity: true) }
            for (key, entry) in entries { s.entries[DigestKey(key)] = entry }
        }
    }

    func invalidate() {
        state.withLock { s in
            s.generation &+= 1
            s.entries.removeAll(keepingCapacity: true)
        }
    }
}

/// A uniqueness digest as a dictionary key. The digest is a keyed BLAKE2b output, uniform and not
/// choosable without the blind-index key, so its first eight bytes are as good a hash as all of it:
/// hashing those alone saves hashing the rest on every lookup (equality still compares every byte).
struct DigestKey: Hashable, Sendable {
    let bytes: [UInt8]

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    func hash(into hasher: inout Hasher) {
        bytes.withUnsafeBytes { b in
            if b.count >= 8 {
                hasher.combine(b.loadUnaligned(as: UInt64.self))
            } else {
                hasher.combine(bytes: b)
            }
        }
    }
}

extension RowFilter {
    /// The digests of a pure point lookup (nothing but `key_ix IN …`, optionally a class), else nil.
    var pointLookupKeys: [[UInt8]]? {
        guard let keys = uniqueIndexes, ref == nil, serviceIndex == nil, accountIndex == nil,
            accessGroupIndexes == nil, requiredAttributeIndexes == nil, excludedAttributeIndex == nil
        else { return nil }
        return keys
    }
}
