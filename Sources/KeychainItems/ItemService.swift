public import KeychainCore
public import KeychainCrypto
public import KeychainStore
import KeychainSystem
import Synchronization

/// Apple's SecItem calls for generic passwords, on an encrypted item store in `directory`.
///
/// Thread-safe: reads run on a pool of reader connections, writes are serialised one transaction each.
public final class ItemService: Sendable {
    /// The database's file name inside the data directory.
    public static let databaseName = "keychain.db"
    /// The file name, inside the data directory, of the device key (32 random bytes): the root of the key hierarchy.
    public static let deviceKeyName = "device.key"

    let store: ItemStore
    @usableFromInline let vault: Vault
    let codec: ItemCodec
    let clock = Clock()
    /// Argon2id costs of the next passphrase or backup (existing ones keep theirs).
    public let kdfProfile: KDFProfile
    /// Wall-clock seconds (the unlock delays survive restarts, so they use real time).
    let wallClock: @Sendable () -> Double
    /// Serialises unlock, passphrase change, registrations and the failure counter (see ItemService+Protection).
    let protectionLock = Locked<Int>(0)
    /// Locks so far (`lockCount`).
    let locks = Atomic<Int>(0)
    /// Fault injection for tests (never set outside them).
    let testHooks = Locked(TestHooks())

    struct TestHooks {
        /// Called during a passphrase change after each re-wrapped row with how many so far; a throw
        /// fails the change there, as a full disk or an I/O error would.
        var afterRewrappedRow: (@Sendable (Int) throws(KeychainError) -> Void)?
    }

    /// Opens (or creates) the keychain in `directory`: the directory (0700), the device key file and the
    /// database. A database whose device key file is missing is an error, never a silent reset.
    /// With a passphrase set the keychain opens locked (only the Always classes available).
    /// `lookupCacheEntries` sizes the store's cache of sealed rows for point lookups (0 = off).
    /// The rows are checked against the database's row-state record (KeychainStore/RowState.swift): a
    /// row removed, added, swapped or replayed from an older copy is `errSecDecode` here, unless
    /// `acceptCurrentRows` (the user's `keychaind --accept-database`) reseals the record for them.
    /// New rows are sealed with AES-256-GCM where the CPU runs it (`ItemSealing.preferred`); rows of
    /// either construction are read.
    public convenience init(
        directory: String, kdfProfile: KDFProfile = .moderate,
        lookupCacheEntries: Int = PointLookupCache.defaultCapacity,
        acceptCurrentRows: Bool = false,
        wallClock: @escaping @Sendable () -> Double = ItemService.systemTime
    ) throws(KeychainError) {
        try self.init(
            directory: directory, kdfProfile: kdfProfile, lookupCacheEntries: lookupCacheEntries,
            acceptCurrentRows: acceptCurrentRows, wallClock: wallClock, sealing: .preferred)
    }

    /// As above, sealing new rows with `sealing` (tests write rows as older versions or other CPUs did).
    init(
        directory: String, kdfProfile: KDFProfile = .moderate,
        lookupCacheEntries: Int = PointLookupCache.defaultCapacity,
        acceptCurrentRows: Bool = false,
        wallClock: @escaping @Sendable () -> Double = ItemService.systemTime,
        sealing: ItemSealing
    ) throws(KeychainError) {
        self.kdfProfile = kdfProfile
        self.wallClock = wallClock
        try Self.makeDirectory(directory)
        let keyPath = directory + "/" + Self.deviceKeyName
        let store = try ItemStore(path: directory + "/" + Self.databaseName, lookupCacheEntries: lookupCacheEntries)
        do throws(KeychainError) {
            if let keyring = try store.meta("keyring") {
                guard let deviceKey = try DeviceKeyFile.load(path: keyPath) else {
                    throw KeychainError(
                        .notAvailable,
                        """
                        the device key file \(keyPath) is missing but the database \(store.path) holds a keychain; \
                        refusing to create a new key, which would make every item unreadable. Restore \(Self.deviceKeyName) \
                        from a backup, or move the database away to start an empty keychain
                        """)
                }
                vault = try Vault.open(deviceKey: deviceKey, keyring: keyring)
                rowCheck = try store.attachRowState(
                    key: vault.rowStateKey, policy: acceptCurrentRows ? .accept : .verify)
            } else {
                guard try store.itemCount() == 0 else {
                    throw KeychainError(.decode, "the database \(store.path) holds items but no keyring; it is damaged")
                }
                var deviceKey = try DeviceKeyFile.load(path: keyPath)
                if deviceKey == nil { deviceKey = try DeviceKeyFile.create(path: keyPath) }
                let created = try Vault.create(deviceKey: deviceKey!)
                // The keyring and the row-state record are written together: never one without the other.
                rowCheck = try store.attachRowState(key: created.vault.rowStateKey, policy: .create) {
                    (w) throws(KeychainError) in
                    try w.insertMeta("keyring", created.keyring)
                }
                vault = created.vault
            }
        } catch {
            store.close()
            throw error
        }
        self.store = store
        codec = ItemCodec(vault: vault, sealing: sealing)
    }

    /// What the row-state check at open found (rows, and whether `acceptCurrentRows` resealed them).
    public let rowCheck: RowStateCheck

    /// Closes the database. Later calls fail with errSecNotAvailable.
    public func close() { store.close() }

    /// Number of items of every group and class (status and tests).
    public func itemCount() throws(KeychainError) -> Int { try store.itemCount() }

    /// Items the caller can see: every item for an admin, else those of its access groups. Before
    /// the first unlock of a keychain with a passphrase the groups' digests cannot be computed: an
    /// app's count is then of its Always (dk, dku) items only, found by opening them.
    public func itemCount(visibleTo caller: Caller) throws(KeychainError) -> Int {
        if caller.isAdmin { return try store.itemCount() }
        guard let index = try? vault.indexer() else {
            let always = ProtectionClass.allCases.filter(\.isAlways).flatMap(\.columnValues)
            var count = 0
            try store.read { (r) throws(KeychainError) in
                try r.forEach(RowFilter(classes: always, includeSearchIndexes: false)) {
                    (row) throws(KeychainError) -> Bool in
                    let group = try? codec.open(row, withSecret: false).attributes["agrp"]?.text
                    if let group, caller.accessGroups.contains(where: { AccessPolicy.sameGroup($0, group) }) {
                        count += 1
                    }
                    return true
                }
            }
            return count
        }
        let indexes = caller.accessGroups.map { index.column(.accessGroup, Array($0.utf8)) }
        return try store.read { (r) throws(KeychainError) in try r.itemCount(groupIndexes: indexes) }
    }

    // MARK: SecItemAdd

    /// `SecItemAdd` for `caller`: stores a new item in an access group it may write; returns what the query asks for.
    public func add(_ attributes: [String: Value], caller: Caller) throws(KeychainError) -> Value? {
        let query = try ParsedQuery(attributes, for: .add)
        let group: String
        if let named = query.attributes[.accessGroup]?.text {
            try AccessPolicy.checkEntitlement(named, caller)
            try AccessPolicy.checkAdminReach([named], .write, caller)
            group = named
        } else {
            guard let first = caller.accessGroups.first else { throw AccessPolicy.noGroups }
            group = first
        }
        let protection = try protectionForWrite(query.attributes[.accessible]?.text)
        try Self.checkSynchronizable(query.sync == .yes, protection)
        let now = clock.next()
        let itemClass = query.itemClass
        var stored = itemClass.defaults
        for (attribute, value) in query.attributes { stored[attribute.rawValue] = value }
        // Generic passwords carry no class entry (as their rows always did): ItemCodec.itemClass(of:).
        if itemClass != .genericPassword { stored["class"] = .text(itemClass.code) }
        stored["agrp"] = .text(group)
        stored["pdmn"] = .text(protection.code)
        stored["sync"] = .bool(query.sync == .yes)
        stored["cdat"] = .date(now)  // caller-provided dates are overwritten, as Apple does
        stored["mdat"] = .date(now)
        if let control = query.accessControl {
            try checkAccessControl(synchronizable: query.sync == .yes)
            stored[AccessControl.key] = control.stored
        }
        let secret = query.secret ?? SecretBytes()
        let ref = PersistentRef.newID(createdAt: now)
        // Sealed outside the writer (cheap concurrency); a passphrase change that replaced the class
        // keys meanwhile (it commits with the writer held) makes the write seal it again.
        let epoch = vault.rotationEpoch
        let sealed = try codec.seal(ref: ref, protection: protection, attributes: stored, secret: secret)
        do {
            try store.write { (w) throws(KeychainError) in
                // Checked again inside the transaction: a passphrase removal deletes akpu rows in its
                // own transaction and refuses akpu writes from before it starts.
                if protection == .whenPasscodeSetThisDeviceOnly { try checkPasscodeItemsAccepted() }
                let row =
                    vault.rotationEpoch == epoch
                    ? sealed : try codec.seal(ref: ref, protection: protection, attributes: stored, secret: secret)
                _ = try w.insert(row)
            }
        } catch  where error.status == .duplicateItem {
            let what = itemClass == .genericPassword ? "an item" : "a \(itemClass.name)"
            throw KeychainError(.duplicateItem, "\(what) with this \(Self.uniquenessText(itemClass)) already exists")
        }
        guard query.returns.any else { return nil }
        return ResultShape.value(attributes: stored, secret: secret, ref: ref, returns: query.returns)
    }

    // MARK: SecItemCopyMatching

    /// `SecItemCopyMatching` for `caller`: the matching items it may see, shaped as the query's `kSecReturn…` ask.
    public func copyMatching(_ query: [String: Value], caller: Caller) throws(KeychainError) -> Value? {
        try copy(compileCopy(query, caller: caller))
    }

    /// A `copy` query parsed, scoped to its caller and turned into a row filter (with its blind-index
    /// digests), ready to run any number of times. The digests hold nothing the database does not
    /// (the blind-index key is fixed for the vault's life); a query carrying a secret (`v_Data`) says
    /// so in `carriesSecret`, and must not be kept.
    /// A class, immutable: handing it around (memo hit, copy) costs one reference count, not one per field.
    public final class CompiledCopy {
        /// How a row found by `filter` is checked against the query.
        enum RowCheck {
            /// Not at all: a point lookup that needs no attribute re-check (see `compiled`). It keeps
            /// no attribute filters, so one recompiled from its template makes none.
            case keyOnly
            /// By its opened attributes, against the whole parsed query.
            case attributes(ParsedQuery)
        }

        let check: RowCheck
        let limit: MatchLimit
        let returns: ReturnFlags
        let sync: SyncFilter
        let scope: [String]?
        let filter: RowFilter
        /// The blind index its digests were computed with (the one in force when it was compiled:
        /// a compiled query outlives no change of it, see `indexGeneration`); nil when compiled before
        /// the first unlock, when no digest could be computed: its filter then finds the Always
        /// items only, by opening them.
        let indexer: BlindIndexer?
        /// Compiled before the first unlock for a query that may match items of passphrase classes,
        /// which cannot be searched then: no match, or a list, is errSecInteractionNotAllowed.
        let incomplete: Bool
        /// The caller the query was scoped to; a compiled query is run only for it.
        public let caller: Caller
        /// The query names `v_Data`: its compiled form holds those bytes and must not be remembered.
        public let carriesSecret: Bool
        /// A point lookup that needs no attribute re-check: `check` is `.keyOnly`, kept as a flag
        /// because every cached copy asks (reading the enum's tag costs an outlined call).
        let keyOnly: Bool

        init(
            check: RowCheck, limit: MatchLimit, returns: ReturnFlags, sync: SyncFilter, carriesSecret: Bool,
            scope: [String]?, filter: RowFilter, indexer: BlindIndexer?, incomplete: Bool = false, caller: Caller
        ) {
            self.incomplete = incomplete
            self.check = check
            if case .keyOnly = check { keyOnly = true } else { keyOnly = false }
            self.limit = limit
            self.returns = returns
            self.sync = sync
            self.carriesSecret = carriesSecret
            self.scope = scope
            self.filter = filter
            self.indexer = indexer
            self.caller = caller
        }

        /// `base` for another query of its template: its filter (with new digests) and check.
        convenience init(_ base: CompiledCopy, check: RowCheck, filter: RowFilter) {
            self.init(
                check: check, limit: base.limit, returns: base.returns, sync: base.sync,
                carriesSecret: base.carriesSecret, scope: base.scope, filter: filter, indexer: base.indexer,
                incomplete: base.incomplete, caller: base.caller)
        }
    }

    /// Everything of `copyMatching` that depends on the query and the caller only: done once per
    /// distinct query by a connection's memo (KeychainDaemon/CopyMemo.swift).
    public func compileCopy(_ query: [String: Value], caller: Caller) throws(KeychainError) -> CompiledCopy {
        let parsed = try ParsedQuery(query, for: .copy)
        let scope = try AccessPolicy.scope(naming: parsed.attributes[.accessGroup]?.text, caller)
        return compiled(parsed, scope: scope, caller: caller)
    }

    /// Changes whenever the blind index the rows are searched with changes (the first unlock, an
    /// index migration, setting or removing the passphrase): a compiled query from an earlier value
    /// holds digests of another key, and must be compiled again.
    @inlinable @inline(__always) public var indexGeneration: Int { vault.indexGeneration }

    /// `base` with its service and account filters replaced by these two strings: what `compileCopy`
    /// gives for `base`'s query with these values in place of its own, when both were text strings
    /// (a `QueryTemplate` match). Nothing else in a compiled query depends on the two values: the
    /// parse of every other key, the caller and the scope are the same, so only the attribute filters
    /// and the row filter's digests are made again. Throws where `compileCopy` would for such a value.
    public func recompile(_ base: CompiledCopy, service: String, account: String) throws(KeychainError)
        -> CompiledCopy
    {
        let serviceValue = try Attribute.service.normalize(.text(service))
        let accountValue = try Attribute.account.normalize(.text(account))
        // A point lookup (the common case) stays one, and of its row filter only the digests depend on
        // the two values: the rest is the base's, without looking the attributes up again. Whether it
        // needs the attribute re-check (`keyOnly`) depends on which keys the query names, the same.
        func pointLookup(_ scope: [String]) throws(KeychainError) -> RowFilter {
            // The base's filter has no other condition: without digests it would match every row
            // (normalize keeps text text, so they are always made; refused here all the same, and the
            // caller then takes the full path).
            guard let index = base.indexer,
                let digests = Self.uniqueIndexes(
                    index, scope: scope, service: serviceValue, account: accountValue, base.sync)
            else { throw KeychainError(.internal, "a point lookup without its digests") }
            var filter = base.filter
            filter.uniqueIndexes = digests
            return filter
        }
        switch base.check {
        case .keyOnly:
            // No attribute filters to make: a key-only copy reads none. (It is a point lookup, so it
            // has a scope; without, the caller takes the full path.)
            guard let scope = base.scope else { throw KeychainError(.internal, "a key-only copy without a scope") }
            return CompiledCopy(base, check: .keyOnly, filter: try pointLookup(scope))
        case .attributes(var parsed):
            parsed.attributes[.service] = serviceValue
            parsed.attributes[.account] = accountValue
            guard let scope = base.scope, base.filter.uniqueIndexes != nil else {
                return compiled(parsed, scope: base.scope, caller: base.caller)
            }
            let filter = try pointLookup(scope)
            assert(filter == compiled(parsed, scope: scope, caller: base.caller).filter)
            return CompiledCopy(base, check: .attributes(parsed), filter: filter)
        }
    }

    private func compiled(_ parsed: ParsedQuery, scope: [String]?, caller: Caller) -> CompiledCopy {
        let indexer = try? vault.indexer()
        var filter = rowFilter(parsed, scope: scope, withSecret: parsed.returns.data, indexer: indexer)
        // A point lookup by the uniqueness digest that asks for no attributes and filters on nothing
        // but the key and the class needs no attribute re-check: the item key's associated data
        // authenticates the row's digest, and the digest was computed from the query and the caller's
        // groups. That skips opening and decoding the attributes on the hot path.
        let keyOnly =
            filter.uniqueIndexes != nil && !parsed.returns.attributes && parsed.itemClass == .genericPassword
            && parsed.attributes.keys.allSatisfy { $0.isKey || $0 == .accessible }
        // Nor reading the attributes at all: SQLite copies every column it returns.
        filter.includeAttributes = !keyOnly
        return CompiledCopy(
            check: keyOnly ? .keyOnly : .attributes(parsed), limit: parsed.limit, returns: parsed.returns,
            sync: parsed.sync, carriesSecret: parsed.secret != nil, scope: scope, filter: filter, indexer: indexer,
            incomplete: indexer == nil && parsed.persistentRef == nil
                && !(parsed.attributes[.accessible]?.text.flatMap(ProtectionClass.init(code:))?.isAlways ?? false),
            caller: caller)
    }

    /// Runs a compiled `copy`: reads and opens the matching rows now (the store, the lookup cache and
    /// the class keys decide, as for any copy) and shapes the result. With `answers`, the items of an
    /// answer that is a list are counted against the daemon's buffer budget as they are collected
    /// (errSecAllocate past it); the caller gives them back once the answer is written.
    /// An item whose access control needs the person (`AccessControl`) has its data read only when
    /// `presence` allows it; otherwise the copy throws `presenceNeeded` (or leaves it out, when the
    /// grant says to skip the others). Attributes and references are read without asking.
    public func copy(_ compiled: CompiledCopy, answers: AnswerLedger? = nil, presence: PresenceGrant? = nil)
        throws(KeychainError) -> Value?
    {
        try run(compiled, uniqueIndexes: nil, answers: answers, presence: presence)
    }

    /// Whether `copy(_:service:account:)` runs `base` for the other queries of its template: a
    /// point lookup that needs no attribute re-check (`keyOnly`), which is what `recompile` makes of
    /// it too, its digests aside.
    public func copiesInPlace(_ base: CompiledCopy) -> Bool {
        guard base.keyOnly, !base.carriesSecret, let scope = base.scope, base.indexer != nil,
            let digests = base.filter.uniqueIndexes
        else { return false }
        return digests.count == scope.count * (base.sync == .any ? 2 : 1)
    }

    /// `copy(recompile(base, service:, account:))` for a `base` that `copiesInPlace`, with the two
    /// values given as the UTF-8 bytes of text strings (the caller has checked that they are valid
    /// UTF-8, as the decoder would): the same digests hashed straight from those bytes into a buffer
    /// on the stack and the same rows read, opened and checked, without a compiled query, a filter
    /// or a string made for them. (A key-only copy reads no attribute filters: `recompile` makes
    /// none either.)
    public func copy(_ base: CompiledCopy, service: UnsafeRawBufferPointer, account: UnsafeRawBufferPointer)
        throws(KeychainError) -> Value?
    {
        try withDigests(base, service: service, account: account) { (digests) throws(KeychainError) in
            try run(base, uniqueIndexes: digests)
        }
    }

    /// The digests of `base`'s point lookup for other `service` and `account` values (see
    /// `copy(_:service:account:)`), hashed into a buffer on the stack and lent to `body`.
    private func withDigests<R>(
        _ base: CompiledCopy, service: UnsafeRawBufferPointer, account: UnsafeRawBufferPointer,
        _ body: (Digests) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        guard copiesInPlace(base), let scope = base.scope, let index = base.indexer else {
            throw KeychainError(.internal, "a compiled copy that cannot be run for other values in place")
        }
        precondition(BlindIndexer.uniqueKeyLength == Digests.length, "digest lengths differ")
        let sync = base.sync
        let count = scope.count * (sync == .any ? 2 : 1)
        return try withUnsafeTemporaryAllocation(byteCount: count * Digests.length, alignment: 8) {
            (buffer) throws(KeychainError) -> R in
            // In the order `uniqueIndexes` gives: per group, not synchronizable first.
            var at = 0
            func digest(_ group: UnsafeRawBufferPointer, _ synchronizable: Bool) {
                index.uniqueKey(
                    accessGroup: group, service: service, account: account, synchronizable: synchronizable,
                    into: UnsafeMutableRawBufferPointer(rebasing: buffer[at..<at + Digests.length]))
                at += Digests.length
            }
            for var group in scope {
                group.withUTF8 { utf8 in
                    let g = UnsafeRawBufferPointer(utf8)
                    if sync == .any {
                        digest(g, false)
                        digest(g, true)
                    } else {
                        digest(g, sync == .yes)
                    }
                }
            }
            return try body(Digests(UnsafeRawBufferPointer(buffer)))
        }
    }

    /// A compiled key-only copy's own digests laid end to end in a stack buffer and lent to `body`
    /// (so that its columns are read in place too), or nil when the lookup cache is on (it is asked
    /// with the filter's own digests) or a digest is not of the usual length.
    private func withOwnDigests<R>(_ compiled: CompiledCopy, _ body: (Digests?) throws(KeychainError) -> R)
        throws(KeychainError) -> R
    {
        guard !store.hasLookupCache, let own = compiled.filter.uniqueIndexes, !own.isEmpty,
            own.allSatisfy({ $0.count == Digests.length })
        else { return try body(nil) }
        return try withUnsafeTemporaryAllocation(byteCount: own.count * Digests.length, alignment: 8) {
            (buffer) throws(KeychainError) -> R in
            for (i, digest) in own.enumerated() {
                UnsafeMutableRawBufferPointer(rebasing: buffer[i * Digests.length..<(i + 1) * Digests.length])
                    .copyBytes(from: digest)
            }
            return try body(Digests(UnsafeRawBufferPointer(buffer)))
        }
    }

    // MARK: Data lent in place

    /// Whether `withData(of:into:)` can run `compiled`: a key-only copy (`r_Data` alone, one match)
    /// whose answer is the data of one item and nothing else, for a caller no administrator check
    /// limits (an admin app without presence is checked after the open, so it takes `copy`).
    public func lendsData(_ compiled: CompiledCopy) -> Bool {
        let returns = compiled.returns
        guard compiled.keyOnly, returns.data, returns.count == 1, !compiled.limit.returnsArray else { return false }
        return !(compiled.caller.isAdmin && !compiled.caller.hasPresence)
    }

    /// Where a copy's data is opened (`withData`): called with the data's length and a function
    /// that opens the data into the bytes given to it, it calls that function once with room of
    /// exactly that length (in the answer being framed) and lets its error go on.
    public typealias DataPlacement = (
        _ count: Int, _ open: (UnsafeMutableRawBufferPointer) throws(KeychainError) -> Void
    ) throws(KeychainError) -> Void

    /// `copy(compiled)` for a query that `lendsData`: the one item's data opened straight into the
    /// room `place` gives it, instead of into a `Value` in wiping storage, so the caller frames its
    /// answer around it. The same rows, checks and errors as `copy`: `place` is called exactly once
    /// when `copy` would return the data; when `copy` would throw, it is not called, or the
    /// function it is handed throws (the data did not open).
    public func withData(of compiled: CompiledCopy, into place: DataPlacement) throws(KeychainError) {
        precondition(lendsData(compiled), "a copy that does not return only one item's data")
        // With the lookup cache on, the filter's own digests are what the cache is asked for.
        if store.hasLookupCache { return try openData(compiled, uniqueIndexes: nil, place) }
        try withOwnDigests(compiled) { (digests) throws(KeychainError) in
            try openData(compiled, uniqueIndexes: digests, place)
        }
    }

    /// `withData(of:into:)` for `base` run for other values in place, as `copy(_:service:account:)`.
    public func withData(
        of base: CompiledCopy, service: UnsafeRawBufferPointer, account: UnsafeRawBufferPointer,
        into place: DataPlacement
    ) throws(KeychainError) {
        precondition(lendsData(base), "a copy that does not return only one item's data")
        try withDigests(base, service: service, account: account) { (digests) throws(KeychainError) in
            try openData(base, uniqueIndexes: digests, place)
        }
    }

    /// About what one item of an answer holds while it is collected: the sealed row it was read
    /// from, its opened secret, its attributes' keys and values, and something for each value's head
    /// and the map around them.
    static func approximateBytes(of item: OpenedItem) -> Int {
        let sealed = item.row.withSealedColumns { $0.secret.count + $0.attributes.count + $0.ref.count }
        var bytes = 64 + sealed + (item.secret?.count ?? 0)
        for (key, value) in item.attributes {
            bytes += key.utf8.count + 9
            switch value {
            case .bytes(let b): bytes += b.count
            case .text(let t): bytes += t.utf8.count
            default: break
            }
        }
        return bytes
    }

    /// `runKeyOnly` for one item's data alone: the first match's secret opened where `place` says.
    private func openData(
        _ compiled: CompiledCopy, uniqueIndexes digests: Digests?, _ place: DataPlacement
    ) throws(KeychainError) {
        var found = false
        try store.read { (reader) throws(KeychainError) in
            try reader.forEachSealed(compiled.filter, uniqueIndexes: digests) {
                (protectionClass, c) throws(KeychainError) -> Bool in
                // An item that needs the person is never lent from here (no grant on this path):
                // `openSecret` refuses it in the class check every row passes anyway.
                try codec.openSecret(c, protectionClass: protectionClass, into: place)
                found = true
                return false
            }
        }
        guard found else { throw Self.notFound }
    }

    /// `copy`, with `digests` (when given) in place of the filter's uniqueness digests.
    private func run(
        _ compiled: CompiledCopy, uniqueIndexes digests: Digests?, answers: AnswerLedger? = nil,
        presence: PresenceGrant? = nil
    )
        throws(KeychainError) -> Value?
    {
        if compiled.keyOnly {
            // Its own digests laid end to end too (a compiled query the memo kept), unless the
            // lookup cache is on (it is asked with the filter's own).
            if digests == nil, !store.hasLookupCache {
                return try withOwnDigests(compiled) { (own) throws(KeychainError) in
                    try runKeyOnly(compiled, uniqueIndexes: own, presence: presence)
                }
            }
            return try runKeyOnly(compiled, uniqueIndexes: digests, presence: presence)
        }
        let returns = compiled.returns
        let scope = compiled.scope
        let keyOnly = compiled.keyOnly
        let maximum = compiled.limit.maximum
        // One item is bounded by the frame it was added in; a list is not (an app with 300 items of
        // 1 MB asking for them all on six connections it never read grew the daemon past 8 GB).
        let ledger = compiled.limit.returnsArray && returns.any ? answers : nil
        // The first match apart from the others: most copies find one item, and an array for it
        // would be an allocation and a free on every request.
        var first: OpenedItem?
        var others: [OpenedItem] = []
        try store.read { (reader) throws(KeychainError) in
            try reader.forEach(compiled.filter, uniqueIndexes: digests) { (row) throws(KeychainError) -> Bool in
                // An item that needs the person: its data opened only once it matches and is allowed.
                let asks = returns.data && row.protectionClass >= ProtectionClass.presenceBit
                var item = try codec.open(row, withSecret: returns.data && !asks, withAttributes: !keyOnly)
                let matched: Bool
                switch compiled.check {
                case .keyOnly: matched = true
                case .attributes(let parsed): matched = Self.matches(item, parsed, scope)
                }
                if matched && asks {
                    let allowed = try Self.presenceAllows(row.ref, presence)
                    if !allowed { return true }
                    item.secret = try codec.open(row, withSecret: true, withAttributes: false).secret
                }
                if matched {
                    try ledger?.take(Self.approximateBytes(of: item))
                    if first == nil { first = item } else { others.append(item) }
                }
                return (first == nil ? 0 : 1) + others.count < maximum
            }
        }
        guard let first else { throw compiled.incomplete ? Vault.notUnlockedSinceStart : Self.notFound }
        // Before the first unlock a list would leave out the items of passphrase classes.
        if compiled.incomplete && compiled.limit.returnsArray { throw Vault.notUnlockedSinceStart }
        let caller = compiled.caller
        if returns.data && caller.isAdmin && !caller.hasPresence {
            // The group of a key-only match is the one the query's digest was computed for.
            try AccessPolicy.checkAdminReach(
                ([first] + others).map { $0.attributes["agrp"]?.text ?? scope?.first ?? "" }, .readSecrets, caller)
        }
        guard returns.any else { return nil }
        func shaped(_ item: OpenedItem) -> Value {
            ResultShape.value(
                attributes: item.attributes, secret: item.secret ?? SecretBytes(), ref: item.row.ref,
                returns: returns)
        }
        return compiled.limit.returnsArray ? .array(([first] + others).map(shaped)) : shaped(first)
    }

    /// `run` for a key-only copy: the same rows opened with the same checks, in the same order of
    /// errors (opening, then not found, then an administrator's reach), but each opened from its
    /// sealed columns in place (`StoreReader.forEachSealed`: no row made when the digests are given
    /// and no lookup cache is on) and shaped as it is opened, since a key-only match has no
    /// attributes to keep: no row, opened item or array of them per request.
    private func runKeyOnly(
        _ compiled: CompiledCopy, uniqueIndexes digests: Digests?, presence: PresenceGrant? = nil
    ) throws(KeychainError)
        -> Value?
    {
        let returns = compiled.returns
        let maximum = compiled.limit.maximum
        var matches = 0
        var first: Value?
        var others: [Value] = []
        try store.read { (reader) throws(KeychainError) in
            try reader.forEachSealed(compiled.filter, uniqueIndexes: digests) {
                (protectionClass, c) throws(KeychainError) -> Bool in
                if returns.data && protectionClass >= ProtectionClass.presenceBit {
                    guard try Self.presenceAllows(c.ref, presence) else { return true }
                }
                let opened = try codec.open(
                    c, protectionClass: protectionClass, withSecret: returns.data, withAttributes: false)
                matches += 1
                if returns.any {
                    let value = ResultShape.value(
                        attributes: [:], secret: opened.secret ?? SecretBytes(), ref: Array(c.ref), returns: returns)
                    if first == nil { first = value } else { others.append(value) }
                }
                return matches < maximum
            }
        }
        guard matches > 0 else { throw Self.notFound }
        let caller = compiled.caller
        if returns.data && caller.isAdmin && !caller.hasPresence {
            // The group of a key-only match is the one the query's digest was computed for.
            try AccessPolicy.checkAdminReach(
                Array(repeating: compiled.scope?.first ?? "", count: matches), .readSecrets, caller)
        }
        guard returns.any, let first else { return nil }
        return compiled.limit.returnsArray ? .array([first] + others) : first
    }

    // MARK: SecItemUpdate

    /// `SecItemUpdate` for `caller`: applies `attributes` to every matching item it may write.
    /// An item whose access control needs the person is changed only when `presence` allows it
    /// (Apple asks before an update of such an item, not before a delete); otherwise `presenceNeeded`.
    public func update(
        _ query: [String: Value], attributes: [String: Value], caller: Caller, presence: PresenceGrant? = nil
    ) throws(KeychainError) {
        let parsed = try ParsedQuery(query, for: .update)
        let changes = try ParsedChanges(attributes, of: parsed.itemClass)
        let scope = try AccessPolicy.scope(naming: parsed.attributes[.accessGroup]?.text, caller)
        if let newGroup = changes.attributes[.accessGroup]?.text {
            try AccessPolicy.checkEntitlement(newGroup, caller)
            try AccessPolicy.checkAdminReach([newGroup], .write, caller)
        }
        let newProtection = try changes.attributes[.accessible].map { (v) throws(KeychainError) in
            try protectionForWrite(v.text)
        }
        // The matches are read without their secrets: an update over many large items kept every
        // sealed secret in memory at once (300 items of 1 MB: 300 MB per update), outside any budget.
        // Each secret is read by its item's reference when it is sealed again, one at a time.
        do {
            try store.write { (w) throws(KeychainError) in
                // The rows are sealed again with their digests: none can be computed before the first
                // unlock. (Taken with the writer held: an index migration commits with it held too.)
                let index = try vault.indexer()
                let filter = rowFilter(parsed, scope: scope, withSecret: false, indexer: index)
                if newProtection == .whenPasscodeSetThisDeviceOnly { try checkPasscodeItemsAccepted() }
                var matches: [OpenedItem] = []
                try w.reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                    let item = try codec.open(row, withSecret: false)
                    if Self.matches(item, parsed, scope) { matches.append(item) }
                    return true
                }
                guard !matches.isEmpty else { throw Self.notFound }
                for item in matches where item.row.protectionClass >= ProtectionClass.presenceBit {
                    let allowed = try Self.presenceAllows(item.row.ref, presence)
                    if !allowed { throw Self.presenceNeeded }
                }
                try AccessPolicy.checkAdminReach(matches.map { $0.attributes["agrp"]?.text ?? "" }, .write, caller)
                for item in matches {
                    var merged = item.attributes
                    for (attribute, value) in changes.attributes { merged[attribute.rawValue] = value }
                    if let sync = changes.sync { merged["sync"] = .bool(sync) }
                    merged["mdat"] = .date(clock.next(after: item.attributes["mdat"]?.date))
                    let protection = newProtection ?? item.protection
                    try Self.checkSynchronizable(merged["sync"]?.bool == true, protection)
                    merged["pdmn"] = .text(protection.code)
                    if let control = changes.accessControl {
                        merged[AccessControl.key] = control.stored
                    }
                    if merged[AccessControl.key] != nil {
                        try checkAccessControl(synchronizable: merged["sync"]?.bool == true)
                    }
                    // Every update seals the whole row afresh under a new item key (the old secret is
                    // opened to be sealed again when it does not change), so nothing written now can
                    // be opened with an item key from an older copy of the database.
                    var opened = SecretBytes()
                    if changes.secret == nil {
                        var sealed: StoredItem?
                        try w.reader.forEach(
                            RowFilter(
                                ref: item.row.ref, includeSecret: true, includeSearchIndexes: false,
                                includeAttributes: false)
                        ) { (row) throws(KeychainError) -> Bool in
                            sealed = row
                            return false
                        }
                        guard let sealed else { throw Self.notFound }
                        opened = try codec.open(sealed, withSecret: true, withAttributes: false).secret ?? SecretBytes()
                    }
                    let row = try codec.seal(
                        ref: item.row.ref, protection: protection, attributes: merged,
                        secret: changes.secret ?? opened, rowid: item.row.rowid, indexer: index)
                    try w.update(row)
                }
            }
        } catch  where error.status == .duplicateItem {
            throw KeychainError(
                .duplicateItem,
                "the update would make an item collide with another of the same \(Self.uniquenessText(parsed.itemClass)); nothing was changed"
            )
        }
    }

    // MARK: SecItemDelete

    /// `SecItemDelete` for `caller`: removes every matching item it may write; none matching throws.
    public func delete(_ query: [String: Value], caller: Caller) throws(KeychainError) {
        let parsed = try ParsedQuery(query, for: .delete)
        let scope = try AccessPolicy.scope(naming: parsed.attributes[.accessGroup]?.text, caller)
        // Before the first unlock, only by persistent reference (a search would miss the items of
        // passphrase classes, and a delete must remove every match).
        try store.write { (w) throws(KeychainError) in
            let index = parsed.persistentRef == nil ? try vault.indexer() : try? vault.indexer()
            let filter = rowFilter(parsed, scope: scope, withSecret: false, indexer: index)
            var rowids: [Int64] = []
            var groups: [String] = []
            try w.reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                let item = try codec.open(row, withSecret: false)
                if Self.matches(item, parsed, scope) {
                    rowids.append(row.rowid)
                    groups.append(item.attributes["agrp"]?.text ?? "")
                }
                return true
            }
            guard !rowids.isEmpty else { throw Self.notFound }
            try AccessPolicy.checkAdminReach(groups, .write, caller)
            for rowid in rowids { try w.delete(rowid: rowid) }
        }
    }

    // MARK: Rules shared by the calls

    static let notFound = KeychainError(.itemNotFound, "no item matches the query")

    /// What a duplicate shares with the item it collides with (the class's uniqueness key), in words.
    static func uniquenessText(_ itemClass: ItemClass) -> String {
        if itemClass == .genericPassword { return "service, account, access group and synchronizable value" }
        return
            "account, server, protocol, authentication type, port, path, security domain, access group and synchronizable value"
    }
    /// The class an add or update writes, defaulting to `ak`; `akpu` needs a passphrase (Apple: a
    /// passcode), errSecAuthFailed otherwise.
    func protectionForWrite(_ code: String?) throws(KeychainError) -> ProtectionClass {
        let protection = code.flatMap(ProtectionClass.init(code:)) ?? .default
        if protection == .whenPasscodeSetThisDeviceOnly { try checkPasscodeItemsAccepted() }
        return protection
    }

    /// An item with access control (`AccessControl`) needs a keychain passphrase to check (Apple: a
    /// passcode) and stays on this device (its confirmation is this device's).
    func checkAccessControl(synchronizable: Bool) throws(KeychainError) {
        if synchronizable {
            throw .param("an item with kSecAttrAccessControl cannot be synchronizable: it is confirmed on this device")
        }
        guard vault.acceptsPasscodeItems else {
            throw KeychainError(
                .authFailed,
                "kSecAttrAccessControl with .userPresence or .devicePasscode needs a keychain passphrase; none is set")
        }
    }

    func checkPasscodeItemsAccepted() throws(KeychainError) {
        guard vault.acceptsPasscodeItems else {
            throw KeychainError(
                .authFailed,
                "akpu (WhenPasscodeSetThisDeviceOnly) items need a keychain passphrase; none is set")
        }
    }

    /// The SQL side of a query: indexed columns only. The hot path — service and account known, one
    /// synchronizable value — becomes a point lookup on the UNIQUE index, one digest per group.
    /// The rows come without their search digests: the calls match the opened attributes instead.
    /// Without `indexer` (before the first unlock) no digest can be computed: the filter reads every
    /// Always item (their keys are in memory), each then checked by its opened attributes.
    func rowFilter(_ query: ParsedQuery, scope: [String]?, withSecret: Bool, indexer: BlindIndexer?) -> RowFilter {
        var filter = RowFilter(includeSecret: withSecret, includeSearchIndexes: false)
        if let ref = query.persistentRef {
            filter.ref = ref
        } else if indexer == nil {
            let always = ProtectionClass.allCases.filter(\.isAlways).flatMap(\.columnValues)
            filter.classes = always
            if let code = query.attributes[.accessible]?.text, let protection = ProtectionClass(code: code) {
                filter.classes = always.filter { ProtectionClass(column: $0) == protection }
            }
        } else if let index = indexer, query.itemClass != .genericPassword {
            // Another class: by its indexed attributes (ItemClass.indexed) and the groups; the rows
            // are matched by their opened attributes (ItemCodec.indexes: the digests of its domains).
            filter.serviceIndex = query.attributes[.server].flatMap(Attribute.bytes(of:)).map {
                index.column(.server, $0)
            }
            filter.accountIndex = query.attributes[.account].flatMap(Attribute.bytes(of:)).map {
                index.column(.account, $0)
            }
            filter.accessGroupIndexes = scope.map { $0.map { index.column(.accessGroup, Array($0.utf8)) } }
            if let code = query.attributes[.accessible]?.text, let protection = ProtectionClass(code: code) {
                filter.classes = protection.columnValues
            }
        } else if let index = indexer {
            let service = query.attributes[.service]
            let account = query.attributes[.account]
            if let service, let account, let scope,
                let digests = Self.uniqueIndexes(index, scope: scope, service: service, account: account, query.sync)
            {
                filter.uniqueIndexes = digests
            } else {
                filter.serviceIndex = service.flatMap(Attribute.bytes(of:)).map { index.column(.service, $0) }
                filter.accountIndex = account.flatMap(Attribute.bytes(of:)).map { index.column(.account, $0) }
                filter.accessGroupIndexes = scope.map { $0.map { index.column(.accessGroup, Array($0.utf8)) } }
            }
            if let code = query.attributes[.accessible]?.text, let protection = ProtectionClass(code: code) {
                filter.classes = protection.columnValues
            }
        }
        return filter
    }

    /// The uniqueness digests a point lookup reads: one per group of `scope` and synchronizable value
    /// `sync` accepts, in that order; nil when the service or the account is neither text nor data.
    /// Hashed from the strings in place: a `copy` its connection's memo has not seen computes them on
    /// every request, and copying each part into an array cost about as much as the hash.
    static func uniqueIndexes(
        _ index: BlindIndexer, scope: [String], service: Value, account: Value, _ sync: SyncFilter
    ) -> [[UInt8]]? {
        let digests = Attribute.withBytes(of: service) { s in
            Attribute.withBytes(of: account) { a in
                var digests: [[UInt8]] = []
                digests.reserveCapacity(scope.count * (sync == .any ? 2 : 1))
                for var group in scope {
                    group.withUTF8 { utf8 in
                        let g = UnsafeRawBufferPointer(utf8)
                        if sync == .any {
                            digests.append(
                                index.uniqueKey(accessGroup: g, service: s, account: a, synchronizable: false))
                            digests.append(
                                index.uniqueKey(accessGroup: g, service: s, account: a, synchronizable: true))
                        } else {
                            digests.append(
                                index.uniqueKey(accessGroup: g, service: s, account: a, synchronizable: sync == .yes))
                        }
                    }
                }
                return digests
            }
        }
        return digests ?? nil
    }

    /// The decrypted attributes checked against the whole query, whatever the index columns said.
    static func matches(_ item: OpenedItem, _ query: ParsedQuery, _ scope: [String]?) -> Bool {
        guard let group = item.attributes["agrp"]?.text else { return false }
        // A query of one class never matches an item of another (whatever found the row).
        guard ItemCodec.itemClass(of: item.attributes) == query.itemClass else { return false }
        if let scope, !scope.contains(where: { AccessPolicy.sameGroup($0, group) }) { return false }
        if let ref = query.persistentRef, ref != item.row.ref { return false }
        guard query.sync.accepts(item.attributes["sync"]?.bool ?? false) else { return false }
        for (attribute, value) in query.attributes
        where !attribute.matches(stored: item.attributes[attribute.rawValue], query: value) {
            return false
        }
        return true
    }

    private static func makeDirectory(_ path: String) throws(KeychainError) {
        if let st = try? FileSystem.status(path) {
            guard st.kind == .directory else { throw KeychainError(.notAvailable, "\(path) is not a directory") }
            // Someone else's directory, or one others may write to, lets them rename device.key and
            // the database away: the keychain would start empty, or with files of their choosing.
            guard st.uid == CurrentProcess.uid else {
                throw KeychainError(
                    .notAvailable,
                    "data directory \(path) belongs to uid \(st.uid), not to this user (uid \(CurrentProcess.uid))")
            }
            guard st.permissions & 0o022 == 0 else {
                throw KeychainError(
                    .notAvailable,
                    "data directory \(path) is writable by other users (mode \(String(st.permissions, radix: 8))); make it private: chmod 700 \(path)"
                )
            }
            return
        }
        // Parents as needed (0700 for the ones created here).
        var current = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") {
            current += "/" + component
            do { try FileSystem.makeDirectory(current, permissions: 0o700) } catch {
                if error.code != .exists {
                    throw KeychainError(.notAvailable, "cannot create directory \(current)", error)
                }
            }
        }
    }
}
