import KeychainItems
import KeychainSystem
import KeychainWire

/// One connection's memo of compiled `copy` queries, keyed by the bytes of the request's `query`.
///
/// A client asks for the same few items again and again, in requests of one shape (`RequestShape`):
/// only the id differs. The first such request is decoded, checked and served in full; its compiled
/// query (parsed, scoped to the caller, blind-index digests computed) is kept here with the bytes of
/// its `query`, and a later request whose `query` bytes are identical skips CBOR decoding, parsing,
/// the policy decision and the digests. The rows are still read, opened and checked on every request
/// (the store, its lookup cache and the class keys decide), so writes, locks and row damage show at once.
///
/// What makes a memo entry valid is everything the skipped work depended on besides the query bytes:
/// the caller (which app the connection's peer is, fixed for a registry generation), whether a
/// keychain passphrase is set (an administrator's presence) and the blind index in force (the
/// digests' key). An entry records all three and is used only while they are unchanged; any reload of the registrations (approve, revoke, passwd, unlock,
/// SIGHUP) makes every entry stale. Nothing secret is kept: queries carrying `v_Data` are not
/// remembered, and a compiled query holds digests and attribute filters only.
///
/// A second, smaller table keeps compiled queries by their `QueryTemplate` (the query's bytes with
/// the service and account values cut out): a query that misses the first table but has the shape of
/// one compiled before (same keys and other values, another service or account) is compiled from that
/// one by `ItemService.recompile` — only the two attribute filters and the digests are made again —
/// under the same token rules. It goes into the first table the second time its bytes are compiled
/// so (`storeRecompiled`). The template found last is tried first, by comparing the query with its
/// key piece by piece (`QueryTemplate.match`: what the scan and the key's lookup would find).
///
/// Used by its connection's thread only.
final class CopyMemo {
    /// What the skipped work depended on besides the query bytes.
    struct Token: Equatable {
        var registryGeneration: Int
        var passphraseSet: Bool
        /// `ItemService.indexGeneration`: the blind index its digests were computed with.
        var indexGeneration: Int
    }

    private final class Entry {
        let query: [UInt8]
        let token: Token
        let compiled: ItemService.CompiledCopy
        /// For a template's entry (`query` is then the key): where its markers are, for
        /// `QueryTemplate.match`; nil when not given (the entry is found by scanning only).
        let markers: QueryTemplate.Markers?

        init(query: [UInt8], token: Token, compiled: ItemService.CompiledCopy, markers: QueryTemplate.Markers? = nil) {
            self.query = query
            self.token = token
            self.compiled = compiled
            self.markers = markers
        }
    }

    /// The slot of `templates` whose entry the last template lookup found (or the last stored):
    /// the next query is matched against it first (`QueryTemplate.match`), without a scan.
    @exclusivity(unchecked) private var lastTemplate = 0

    /// Direct-mapped by a hash of the query bytes: no allocation and no hashing of Swift values on a hit.
    static let slots = 64
    /// The tables are allocated once and live as long as the memo, as `templateKey` does: constant
    /// references to memory, so reading and writing them costs no exclusivity check or uniqueness
    /// test (as stored arrays would, on every request). Used by one thread only.
    private let entries: UnsafeMutableBufferPointer<Entry?>
    /// Keyed by template (`QueryTemplate.key`): an app uses few query shapes.
    static let templateSlots = 8
    private let templates: UnsafeMutableBufferPointer<Entry?>
    /// A hash of the bytes of the last query compiled from a template in each slot of `entries`,
    /// not remembered yet (0: none); see `storeRecompiled`.
    private let recompiled: UnsafeMutableBufferPointer<UInt64>

    /// Where `lookup(templateOf:)` writes a query's template key: allocated once, as long as the
    /// longest query the memo keeps, so a lookup allocates nothing (and, a constant reference to
    /// memory, costs no exclusivity check as a stored array would).
    private let templateKey: UnsafeMutableRawBufferPointer

    init() {
        entries = .allocate(capacity: Self.slots)
        entries.initialize(repeating: nil)
        templates = .allocate(capacity: Self.templateSlots)
        templates.initialize(repeating: nil)
        recompiled = .allocate(capacity: Self.slots)
        recompiled.initialize(repeating: 0)
        templateKey = .allocate(byteCount: Self.maxQueryBytes, alignment: 8)
    }

    deinit {
        // Only queries without a secret are scanned into it (QueryTemplate); wiped all the same.
        Zeroing.zero(templateKey)
        templateKey.deallocate()
        entries.deinitialize()
        entries.deallocate()
        templates.deinitialize()
        templates.deallocate()
        recompiled.deallocate()
    }

    private static func slot(_ bytes: UnsafeRawBufferPointer) -> Int { slot(hash(bytes)) }

    private static func slot(_ hash: UInt64) -> Int { Int(truncatingIfNeeded: hash) & (slots - 1) }

    /// The hash the memo files `bytes` by: computed once per request and handed to `lookup(_:hash:token:)`
    /// and `noteRecompiled(_:hash:)`.
    @inline(__always)
    static func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        // FNV-1a over 8-byte words: cheap, and a collision only costs a miss (the bytes are compared
        // in full). Not a defence against chosen collisions, and needs none: the memo is per connection.
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        var i = 0
        while i + 8 <= bytes.count {
            h = (h ^ bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self)) &* 0x100_0000_01b3
            i += 8
        }
        if i < bytes.count && bytes.count >= 8 {
            // The rest as one word that overlaps the last one hashed.
            h = (h ^ bytes.loadUnaligned(fromByteOffset: bytes.count - 8, as: UInt64.self)) &* 0x100_0000_01b3
        } else {
            while i < bytes.count {
                h = (h ^ UInt64(bytes[i])) &* 0x100_0000_01b3
                i += 1
            }
        }
        h ^= h >> 29
        return h ^ (h >> 32)
    }

    /// The compiled query remembered for exactly these `query` bytes under `token`, else nil.
    func lookup(_ query: UnsafeRawBufferPointer, token: Token) -> ItemService.CompiledCopy? {
        lookup(query, hash: Self.hash(query), token: token)
    }

    /// `lookup(_:token:)` with the query's `hash` (`CopyMemo.hash`) computed already.
    @inline(__always)
    func lookup(_ query: UnsafeRawBufferPointer, hash: UInt64, token: Token) -> ItemService.CompiledCopy? {
        guard !query.isEmpty else { return nil }
        return Self.found(entries[Self.slot(hash)], query, token)
    }

    /// A compiled query of this template (`QueryTemplate.key`) under `token`, else nil.
    func lookup(template key: [UInt8], token: Token) -> ItemService.CompiledCopy? {
        key.withUnsafeBytes { key in lookup(templateKey: key, token: token) }
    }

    private func lookup(templateKey key: UnsafeRawBufferPointer, token: Token) -> ItemService.CompiledCopy? {
        Self.found(templates[Self.templateSlot(key)], key, token)
    }

    /// The compiled query of `query`'s template (`QueryTemplate`) under `token`, with where the
    /// query's service and account texts are; nil when the query has no template or the memo holds
    /// none for it.
    func lookup(templateOf query: UnsafeRawBufferPointer, token: Token) -> (
        compiled: ItemService.CompiledCopy, service: Range<Int>, account: Range<Int>
    )? {
        var service = 0..<0
        var account = 0..<0
        guard let compiled = lookup(templateOf: query, token: token, service: &service, account: &account) else {
            return nil
        }
        return (compiled, service, account)
    }

    /// The same, with the two ranges written into `service` and `account` (left as they are when
    /// nil). What a request uses: an optional tuple or struct holding the class reference beside the
    /// ranges was destroyed through the runtime's generic value witnesses, some 200 instructions.
    func lookup(
        templateOf query: UnsafeRawBufferPointer, token: Token, service: inout Range<Int>, account: inout Range<Int>
    ) -> ItemService.CompiledCopy? {
        // The template of the last one first: matched piece by piece against its key, which finds
        // exactly what scanning the query and looking its key up would find there.
        if let last = templates[lastTemplate], last.token == token, let markers = last.markers,
            let found = last.query.withUnsafeBytes({ QueryTemplate.match(query, key: $0, markers: markers) })
        {
            (service, account) = (found.service, found.account)
            return last.compiled
        }
        guard query.count <= templateKey.count else {
            // Longer than any query whose template is kept, but its key may be shorter than one's.
            guard let template = QueryTemplate.scan(query),
                let compiled = lookup(template: template.key, token: token)
            else { return nil }
            lastTemplate = template.key.withUnsafeBytes { Self.templateSlot($0) }
            (service, account) = (template.service, template.account)
            return compiled
        }
        guard let found = QueryTemplate.scan(query, into: templateKey) else { return nil }
        let key = UnsafeRawBufferPointer(rebasing: templateKey[0..<found.count])
        guard let compiled = lookup(templateKey: key, token: token) else { return nil }
        lastTemplate = Self.templateSlot(key)
        (service, account) = (found.service, found.account)
        return compiled
    }

    private static func templateSlot(_ key: UnsafeRawBufferPointer) -> Int { slot(key) & (templateSlots - 1) }

    @inline(__always)
    private static func found(_ entry: Entry?, _ bytes: UnsafeRawBufferPointer, _ token: Token)
        -> ItemService.CompiledCopy?
    {
        guard let entry, entry.token == token, entry.query.count == bytes.count,
            entry.query.withUnsafeBytes({ same($0, bytes) })
        else { return nil }
        return entry.compiled
    }

    /// Byte equality of two buffers of the same length, eight bytes at a time; the last word, when
    /// the length is not a multiple of eight, overlaps the one before it.
    static func same(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        let n = a.count
        var i = 0
        while i + 8 <= n {
            if a.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                != b.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            {
                return false
            }
            i += 8
        }
        if i < n && n >= 8 {
            return a.loadUnaligned(fromByteOffset: n - 8, as: UInt64.self)
                == b.loadUnaligned(fromByteOffset: n - 8, as: UInt64.self)
        }
        while i < n {
            if a[i] != b[i] { return false }
            i += 1
        }
        return true
    }

    /// The longest `query` remembered: the memo must not let a client park 64 large frames in the
    /// daemon outside the buffer budget. Real queries are tens to a few hundred bytes. Each entry also
    /// holds its compiled query (at most two 32-byte digests per access group of the caller), so a
    /// connection's memo (64 entries and 8 templates, with the template key buffer and the 64
    /// hashes of `storeRecompiled`) is bounded by about 74 KiB plus the digests, about the size of
    /// its own read buffer; only copies that an identified app was allowed to compile fill it.
    static let maxQueryBytes = 1024

    /// Remembers `compiled` for these `query` bytes (never a query that carries a secret, nor a long one).
    func store(_ query: UnsafeRawBufferPointer, token: Token, compiled: ItemService.CompiledCopy) {
        guard !compiled.carriesSecret, query.count <= Self.maxQueryBytes else { return }
        entries[Self.slot(query)] = Entry(query: Array(query), token: token, compiled: compiled)
    }

    /// Remembers `compiled`, made by `ItemService.recompile` for these `query` bytes, when these bytes
    /// are compiled so a second time in a row for their slot (no other query's hash noted there in
    /// between): the first time only notes a hash of them; the entry then replaces the slot's. A client that reads each of many items once (or seldom) would otherwise replace
    /// an entry on every request, and making an entry and freeing the one it replaces cost a third
    /// of the recompilation it saves; a client that asks the same items again pays one more
    /// recompilation per query. (Same conditions as `store`: the hash of a query carrying a secret
    /// is never kept either.)
    func storeRecompiled(_ query: UnsafeRawBufferPointer, token: Token, compiled: ItemService.CompiledCopy) {
        guard !compiled.carriesSecret else { return }
        let hash = Self.hash(query)
        if noteRecompiled(query, hash: hash) { store(query, hash: hash, token: token, compiled: compiled) }
    }

    /// The bookkeeping of `storeRecompiled` alone, for a query (with its `hash`) compiled from a
    /// template: true when these bytes come so the second time in a row for their slot (the mark is
    /// cleared then, and the caller stores the compiled query with `store(_:hash:token:compiled:)`);
    /// otherwise notes them and is false. A request served from its template without a compiled
    /// query (`ItemService.copy(_:service:account:)`) makes one only when this says it will be kept.
    /// The caller has made sure that the query carries no secret (a template never does).
    func noteRecompiled(_ query: UnsafeRawBufferPointer, hash: UInt64) -> Bool {
        guard query.count <= Self.maxQueryBytes else { return false }
        let slot = Self.slot(hash)
        let mark = max(hash, 1)  // never 0, which marks a slot with none
        if recompiled[slot] == mark {
            recompiled[slot] = 0
            return true
        }
        recompiled[slot] = mark
        return false
    }

    /// `store(_:token:compiled:)` with the query's `hash` computed already.
    func store(_ query: UnsafeRawBufferPointer, hash: UInt64, token: Token, compiled: ItemService.CompiledCopy) {
        guard !compiled.carriesSecret, query.count <= Self.maxQueryBytes else { return }
        entries[Self.slot(hash)] = Entry(query: Array(query), token: token, compiled: compiled)
    }

    /// Remembers `compiled`, the compiled form of a query of `queryCount` bytes, as the compiled query
    /// of its template (same conditions as `store`). The whole query's length counts, not the key's:
    /// the compiled query holds the service and account the key leaves out.
    /// With the key's `markers` (`QueryTemplate.markers`), the next queries of the template are
    /// matched against it without a scan.
    func store(
        template key: [UInt8], queryCount: Int, token: Token, compiled: ItemService.CompiledCopy,
        markers: QueryTemplate.Markers? = nil
    ) {
        guard !compiled.carriesSecret, queryCount <= Self.maxQueryBytes else { return }
        let slot = key.withUnsafeBytes { Self.templateSlot($0) }
        templates[slot] = Entry(query: key, token: token, compiled: compiled, markers: markers)
        lastTemplate = slot
    }
}
