public import KeychainCore
import KeychainSystem
import Synchronization

/// The key hierarchy of one keychain.
///
/// ```
/// device.key (32 random bytes, file 0600)
///  ├─ device KEK      = BLAKE2b(device key, "device-kek")                 wraps: dk, dku, device index key
///  └─ master key      = no passphrase: BLAKE2b(device key, "master-from-device")
///                       passphrase:    BLAKE2b(Argon2id(passphrase, salt), "master-from-passphrase" ‖ device KEK)
///                                                                           wraps: ak, ck, registry key,
///                                                                                  passphrase index key
///      └─ this-device KEK = BLAKE2b(master, "this-device-only" ‖ device KEK)   wraps: aku, cku, akpu
/// class key (one per accessibility class) wraps each item's random key; the item key seals the row.
/// registry key seals the approved app registrations (`meta` row "apps").
/// ```
///
/// The wrapped keys form the *keyring*, a CBOR map the store keeps in its `meta` table:
/// `{"v": 1 or 2, "master": "device"|"passphrase", "kdf": {…} (passphrase only), "ak": sealed, …, "index": sealed,
/// "apps": sealed (absent in keyrings written before it existed), "pindex": sealed (version 2 only)}`.
///
/// **Blind indexes.** The search and uniqueness digests of the rows (KeyedHash.swift) are keyed by
/// one of two keys. Without a passphrase, by the *device index key* ("index", wrapped by the device
/// KEK): nothing is private against `device.key` then anyway. With a passphrase, by the *passphrase
/// index key* ("pindex", wrapped by the master key, so only the passphrase opens it; keyring
/// version 2): a copy of `device.key` and the database confirms no guess of an item's group,
/// service, account or Secret Service attribute. (A keyring whose passphrase was removed keeps it,
/// wrapped by the device-derived master.) It is unwrapped by the first unlock and stays in
/// guarded memory until the vault goes away, like the registry key: lookups while locked still find
/// locked items (and answer errSecInteractionNotAllowed for them). Until the first unlock no digest
/// can be computed (`indexer()` throws); the item layer then finds only the Always items by opening
/// them. A passphrase keyring of version 1 (no "pindex", its rows keyed by the device index key) is
/// migrated by the first unlock (`unlock(passphrase:)` returns a `PendingIndex`); setting the first
/// passphrase draws a fresh passphrase index key (`PendingChange.reindexes`: every row's digests are
/// computed again in the transaction); changing or removing the passphrase re-wraps it.
///
/// **Rotation.** Setting or changing the passphrase draws fresh class keys for the five
/// master-protected classes (ak, ck, aku, cku, akpu) and a fresh registry key; the caller re-wraps
/// every item key of those classes (`PendingChange.rewrapItemKey`) and re-seals the registrations in
/// the transaction that stores the new keyring. A copy of the keyring from before the change then
/// opens no item key and no registration list written since. Removing the passphrase keeps the class
/// keys (re-wrapped under the device-derived master) except akpu's, whose items are deleted.
///
/// Unwrapped class keys live in guarded memory. Without a passphrase every class key is unwrapped at
/// open (always unlocked). With one, only the "Always" keys (dk, dku, wrapped by the device KEK) are
/// available until `unlock(passphrase:)`; `lock(_:)` drops keys again, after which `classKey` throws
/// `errSecInteractionNotAllowed`. The registry key, like ck, is available from the first time the
/// passphrase is given until the vault goes away; locking never drops it.
public final class Vault: Sendable {
    /// Where the master key comes from.
    public enum MasterSource: String, Sendable {
        /// Derived from the device key file: no passphrase set (the daemon starts unlocked).
        case deviceKey = "device"
        /// Argon2id of the user's passphrase, entangled with the device key.
        case passphrase = "passphrase"
    }

    /// The keyring format version written when there is no passphrase index key (`"v"`); one with
    /// it is version 2, which an older keychaind refuses (it would search its rows with the wrong key).
    /// A keyring of another version fails to open as errSecDecode.
    public static let keyringVersion: Int64 = 1
    /// The version of a keyring holding the passphrase index key ("pindex").
    public static let keyringVersionWithPassphraseIndex: Int64 = 2
    /// The classes whose keys the master key (rather than the device KEK) protects.
    public static let masterProtected: [ProtectionClass] = ProtectionClass.allCases.filter { !$0.isAlways }
    /// The keyring entry of the registry key.
    static let registryName = "apps"
    /// The keyring entry of the passphrase index key.
    static let passphraseIndexName = "pindex"

    /// Keyed BLAKE2b for the database's search and uniqueness columns under the device index key:
    /// the rows' digests when the keyring has no passphrase index key (`indexer()`).
    public let deviceIndex: BlindIndexer
    /// Keys the row-state digest (KeychainStore/RowState.swift). Derived from the device key alone, so
    /// the rows are checked at open even while a passphrase keeps the keychain locked.
    public let rowStateKey: SecureBytes

    private let deviceKey: SecureBytes
    private let deviceKEK: SecureBytes
    private let state: Locked<State>
    /// `state.keyring.source == .passphrase`, stored with every keyring change (under the lock) so
    /// that `hasPassphrase`, asked on every `copy`, reads one atomic instead of taking the lock.
    private let passphraseSet: Atomic<Bool>
    /// Bumped (under the lock) whenever the blind index in force changes (`indexer()`), read
    /// without it: a connection's memo keeps compiled queries only for one value.
    private let indexChanges = Atomic<Int>(0)

    /// Changes whenever the blind index in force changes: the first unlock, an index migration,
    /// setting or removing the passphrase. Digests computed under an earlier value are stale.
    public var indexGeneration: Int { indexChanges.load(ordering: .acquiring) }

    /// What the keyring in the database says, decoded.
    struct Keyring {
        var source: MasterSource
        var kdf: KDFParameters?
        var wrapped: [ProtectionClass: [UInt8]]
        var wrappedIndex: [UInt8]
        /// The registry key, wrapped by the master key (nil in keyrings from before it existed).
        var wrappedRegistry: [UInt8]?
        /// The passphrase index key, wrapped by the master key: present when the rows are keyed by it
        /// (nil in a keyring that never had a passphrase, and before the migration of a version-1
        /// keyring with one).
        var wrappedPassphraseIndex: [UInt8]? = nil

        var encoded: [UInt8] {
            var map: [String: Value] = [
                "v": .int(wrappedPassphraseIndex == nil ? keyringVersion : keyringVersionWithPassphraseIndex),
                "master": .text(source.rawValue), "index": .bytes(wrappedIndex),
            ]
            for (c, w) in wrapped { map[c.code] = .bytes(w) }
            if let kdf { map["kdf"] = kdf.value }
            if let wrappedRegistry { map[Vault.registryName] = .bytes(wrappedRegistry) }
            if let wrappedPassphraseIndex { map[Vault.passphraseIndexName] = .bytes(wrappedPassphraseIndex) }
            return CBOR.encode(.map(map))
        }

        init(
            source: MasterSource, kdf: KDFParameters?, wrapped: [ProtectionClass: [UInt8]], wrappedIndex: [UInt8],
            wrappedRegistry: [UInt8]?
        ) {
            self.source = source
            self.kdf = kdf
            self.wrapped = wrapped
            self.wrappedIndex = wrappedIndex
            self.wrappedRegistry = wrappedRegistry
        }

        init(_ bytes: [UInt8]) throws(KeychainError) {
            let decoded: Value
            do { decoded = try CBOR.decode(bytes) } catch {
                throw KeychainError(.decode, "the keyring in the database is damaged")
            }
            guard let map = decoded.map, let version = map["v"]?.int,
                version == keyringVersion || version == keyringVersionWithPassphraseIndex
            else {
                throw KeychainError(.decode, "the keyring in the database has an unknown format (newer keychaind?)")
            }
            guard let sourceName = map["master"]?.text, let source = MasterSource(rawValue: sourceName) else {
                throw KeychainError(.decode, "the keyring in the database names an unknown master-key source")
            }
            self.source = source
            if source == .passphrase {
                guard let k = map["kdf"] else {
                    throw KeychainError(.decode, "the keyring lacks its key-derivation parameters")
                }
                kdf = try KDFParameters(k)
            } else {
                kdf = nil
            }
            wrapped = [:]
            for c in ProtectionClass.allCases {
                guard let w = map[c.code]?.bytes else {
                    throw KeychainError(.decode, "the keyring lacks the \(c.code) class key")
                }
                wrapped[c] = w
            }
            guard let wi = map["index"]?.bytes else {
                throw KeychainError(.decode, "the keyring lacks the blind-index key")
            }
            wrappedIndex = wi
            switch map[Vault.registryName] {
            case nil: wrappedRegistry = nil
            case .bytes(let w)?: wrappedRegistry = w
            default: throw KeychainError(.decode, "the keyring's registry key is damaged")
            }
            if version == keyringVersionWithPassphraseIndex {
                guard let w = map[Vault.passphraseIndexName]?.bytes else {
                    throw KeychainError(.decode, "the keyring's passphrase index key is missing or damaged")
                }
                wrappedPassphraseIndex = w
            }
        }
    }

    /// Keys unwrapped from a keyring with its master key.
    private struct Unwrapped {
        var classKeys: [ProtectionClass: SecureBytes]
        var registry: SecureBytes?
        /// The passphrase index key, when the keyring has one.
        var passphraseIndex: BlindIndexer?
    }

    private struct State {
        var keyring: Keyring
        var classKeys: [ProtectionClass: SecureBytes] {
            didSet { byClass = Self.table(classKeys, reusing: byClass) }
        }
        /// `classKeys` indexed by the class's raw value, each with its AES-256-GCM schedule, kept in
        /// step with it: `openingKey` reads it on every item opened, without hashing. (The same key
        /// objects: a key dropped from `classKeys` is dropped here, schedule and all, in the same
        /// critical section.)
        private(set) var byClass: [OpeningKey?]
        /// The registry key, when the keyring has one and it has been unwrapped.
        var registryKey: SecureBytes?
        /// Whether the master key has been available since open (no passphrase, or it was given):
        /// until then the registrations cannot be read.
        var registryReadable: Bool
        /// The passphrase index key, from the first unlock on (never dropped by a lock).
        var passphraseIndex: BlindIndexer?
        /// Set while a passphrase removal is being committed: akpu writes are refused from then on.
        var removingPassphrase = false
        /// Bumped by every adopted keyring change, so an unlock computed against an older keyring is dropped.
        var generation = 0
        /// Bumped whenever adopted class keys replace those rows were sealed under (`rotationEpoch`).
        var rotation: UInt64 = 0

        init(
            keyring: Keyring, classKeys: [ProtectionClass: SecureBytes], registryKey: SecureBytes?,
            registryReadable: Bool
        ) {
            self.keyring = keyring
            self.classKeys = classKeys
            self.registryKey = registryKey
            self.registryReadable = registryReadable
            byClass = Self.table(classKeys, reusing: [])
        }

        private static let tableSize = Int(ProtectionClass.allCases.map(\.rawValue).max()!) + 1

        /// The table for `keys`: a key already in `old` keeps its schedule, a new one gets its own.
        private static func table(_ keys: [ProtectionClass: SecureBytes], reusing old: [OpeningKey?]) -> [OpeningKey?] {
            var table = [OpeningKey?](repeating: nil, count: tableSize)
            for (c, key) in keys {
                let i = Int(c.rawValue)
                if i < old.count, let kept = old[i], kept.key === key {
                    table[i] = kept
                } else {
                    table[i] = OpeningKey(key: key, prepared: key.withUnsafeBytes { PreparedGCMKey(key: $0) })
                }
            }
            return table
        }

        /// The key of class `c` when it is in memory (`classKeys[c]`), with its schedule.
        func openingKey(_ c: ProtectionClass) -> OpeningKey? { byClass[Int(c.rawValue)] }
    }

    private init(
        deviceKey: SecureBytes, deviceKEK: SecureBytes, keyring: Keyring, indexKey: SecureBytes,
        classKeys: [ProtectionClass: SecureBytes], registryKey: SecureBytes?, registryReadable: Bool
    ) throws(KeychainError) {
        self.deviceKey = deviceKey
        self.deviceKEK = deviceKEK
        self.deviceIndex = BlindIndexer(key: indexKey)
        self.rowStateKey = try KeyedHash.deriveKey(from: deviceKey, label: "keychaind row-state v1")
        self.state = Locked(
            State(
                keyring: keyring, classKeys: classKeys, registryKey: registryKey,
                registryReadable: registryReadable))
        self.passphraseSet = Atomic(keyring.source == .passphrase)
    }

    /// A new keychain: fresh random class keys, blind-index key and registry key, wrapped as described
    /// above. Returns the vault (unlocked) and the keyring to persist.
    public static func create(deviceKey: SecureBytes) throws(KeychainError) -> (vault: Vault, keyring: [UInt8]) {
        let deviceKEK = try Self.deviceKEK(deviceKey)
        let master = try masterFromDevice(deviceKey)
        let keks = try Keks(master: master, deviceKEK: deviceKEK)
        var wrapped: [ProtectionClass: [UInt8]] = [:]
        var plain: [ProtectionClass: SecureBytes] = [:]
        for c in ProtectionClass.allCases {
            let key = try SecureBytes(random: AEAD.keyBytes)
            wrapped[c] = wrap(key, under: keks.wrappingKey(for: c), name: c.code)
            plain[c] = key
        }
        let indexKey = try SecureBytes(random: BlindIndexer.keyLength)
        let registry = try SecureBytes(random: AEAD.keyBytes)
        let keyring = Keyring(
            source: .deviceKey, kdf: nil, wrapped: wrapped,
            wrappedIndex: wrap(indexKey, under: deviceKEK, name: "index"),
            wrappedRegistry: wrap(registry, under: master, name: registryName))
        let vault = try Vault(
            deviceKey: deviceKey, deviceKEK: deviceKEK, keyring: keyring, indexKey: indexKey, classKeys: plain,
            registryKey: registry, registryReadable: true)
        return (vault, keyring.encoded)
    }

    /// Opens an existing keyring with this device's key. A keyring that does not open with this key
    /// (another device's key file, or damage) is `errSecDecode`, with a message that says so.
    /// Without a passphrase every class is available at once; with one, only dk and dku.
    public static func open(deviceKey: SecureBytes, keyring bytes: [UInt8]) throws(KeychainError) -> Vault {
        let keyring = try Keyring(bytes)
        let deviceKEK = try Self.deviceKEK(deviceKey)
        let indexKey: SecureBytes
        do {
            indexKey = try unwrap(keyring.wrappedIndex, under: deviceKEK, name: "index", length: BlindIndexer.keyLength)
        } catch {
            throw KeychainError(
                .decode, "the device key file does not belong to this database (the keyring does not open with it)")
        }
        var keys: [ProtectionClass: SecureBytes] = [:]
        for c in ProtectionClass.allCases where c.isAlways {
            keys[c] = try unwrapClass(c, keyring, under: deviceKEK)
        }
        let vault = try Vault(
            deviceKey: deviceKey, deviceKEK: deviceKEK, keyring: keyring, indexKey: indexKey, classKeys: keys,
            registryKey: nil, registryReadable: false)
        if keyring.source == .deviceKey { try vault.unlock() }
        return vault
    }

    // MARK: State

    /// A class key as reads use it: the key, and its AES-256-GCM schedule where libsodium runs
    /// AES-256-GCM (made when the key comes into memory, freed with it), so that opening an item key
    /// does not expand the class key each time.
    /// (One object, so that taking it out of the vault's lock is one retain.)
    public final class OpeningKey: Sendable {
        /// The class key.
        public let key: SecureBytes
        /// Its schedule; nil without AES-NI.
        public let prepared: PreparedGCMKey?

        /// `key` with its schedule (nil: opened without one).
        public init(key: SecureBytes, prepared: PreparedGCMKey?) {
            self.key = key
            self.prepared = prepared
        }
    }

    /// The unwrapped key of a class, or `errSecInteractionNotAllowed` while that class is locked.
    public func classKey(_ c: ProtectionClass) throws(KeychainError) -> SecureBytes {
        try openingKey(c).key
    }

    /// The unwrapped key of a class with its schedule, or `errSecInteractionNotAllowed` while that
    /// class is locked.
    public func openingKey(_ c: ProtectionClass) throws(KeychainError) -> OpeningKey {
        guard let key = state.withLock({ $0.openingKey(c) }) else {
            throw KeychainError(
                .interactionNotAllowed,
                "the keychain is locked: items accessible \(c.code) cannot be used until it is unlocked")
        }
        return key
    }

    /// Changes whenever an adopted passphrase change replaces class keys. A row sealed under a class
    /// key taken before the epoch changed must be sealed again before it is written.
    public var rotationEpoch: UInt64 { state.withLock { $0.rotation } }

    /// Whether items of class `c` can be read and written now. `akpu` also needs a passphrase.
    public func isAvailable(_ c: ProtectionClass) -> Bool {
        state.withLock { s in
            s.classKeys[c] != nil
                && (c != .whenPasscodeSetThisDeviceOnly || (s.keyring.source == .passphrase && !s.removingPassphrase))
        }
    }

    /// Whether a passphrase protects the master key (Apple's "device has a passcode").
    public var hasPassphrase: Bool { passphraseSet.load(ordering: .acquiring) }

    /// Where the master key comes from now: the device key or the passphrase.
    public var masterSource: MasterSource { state.withLock { $0.keyring.source } }

    /// Whether `akpu` items may be written now: a passphrase is set and not being removed.
    public var acceptsPasscodeItems: Bool {
        state.withLock { $0.keyring.source == .passphrase && !$0.removingPassphrase }
    }

    /// The blind index the rows' digests are keyed by now: the device index key when the keyring has
    /// no passphrase index key, else the passphrase index key once the first unlock has put it in
    /// memory. Before that, `errSecInteractionNotAllowed`: no digest can be computed.
    public func indexer() throws(KeychainError) -> BlindIndexer {
        let current: BlindIndexer? = state.withLock { s in
            s.keyring.wrappedPassphraseIndex == nil ? deviceIndex : s.passphraseIndex
        }
        guard let current else { throw Self.notUnlockedSinceStart }
        return current
    }

    /// What `indexer()` throws before the first unlock.
    public static let notUnlockedSinceStart = KeychainError(
        .interactionNotAllowed,
        "the keychain has not been unlocked since keychaind started: only Always (dk, dku) items can be found until then"
    )

    /// Locked in Apple's sense: a passphrase is set and the WhenUnlocked keys are not in memory.
    public var isLocked: Bool {
        state.withLock { $0.keyring.source == .passphrase && $0.classKeys[.whenUnlocked] == nil }
    }

    /// The stored Argon2id parameters (nil without a passphrase).
    public var kdfParameters: KDFParameters? { state.withLock { $0.keyring.kdf } }

    /// Drops the unwrapped keys of `classes` (zeroed when the last user lets go of them).
    public func lock(_ classes: some Sequence<ProtectionClass>) {
        state.withLock { s in
            for c in classes { s.classKeys[c] = nil }
            s.generation += 1  // an unlock still deriving its key must not undo this lock
        }
    }

    /// Apple's lock: drops the WhenUnlocked keys (ak, aku, akpu). Only with a passphrase; without one
    /// there is nothing to unlock with, so this returns false and changes nothing. The registry key stays.
    @discardableResult
    public func lockWhenUnlockedClasses() -> Bool {
        state.withLock { s in
            guard s.keyring.source == .passphrase else { return false }
            for c in ProtectionClass.allCases where c.needsUnlocked { s.classKeys[c] = nil }
            s.generation += 1  // an unlock still deriving its key must not undo this lock
            return true
        }
    }

    /// Unwraps every class key with the device key alone (no passphrase set). With a passphrase set
    /// this is errSecAuthFailed: use `unlock(passphrase:)`.
    public func unlock() throws(KeychainError) {
        let (keyring, generation) = state.withLock { ($0.keyring, $0.generation) }
        guard keyring.source == .deviceKey else {
            throw KeychainError(.authFailed, "the keychain is protected by a passphrase")
        }
        let keys = try Self.unwrapAll(keyring, master: try Self.masterFromDevice(deviceKey), deviceKEK: deviceKEK)
        install(keys, generation: generation)
    }

    /// Derives the master key from `passphrase` with the stored parameters (Argon2id: slow on
    /// purpose) and unwraps every class key, the registry key and the passphrase index key. A wrong
    /// passphrase is errSecAuthFailed and changes nothing. Without a passphrase set, succeeds without
    /// looking at it. A keyring without a passphrase index key (written before it existed) comes
    /// back with a fresh one to migrate to: re-key every row's digests with `PendingIndex.indexer`
    /// and store `PendingIndex.keyring` in one transaction, then `adopt` it.
    @discardableResult
    public func unlock(passphrase: SecureBytes) throws(KeychainError) -> PendingIndex? {
        let (keyring, generation) = state.withLock { ($0.keyring, $0.generation) }
        guard keyring.source == .passphrase else { return nil }
        guard let kdf = keyring.kdf else {
            throw KeychainError(.decode, "the keyring lacks its key-derivation parameters")
        }
        let master = try masterFromPassphrase(try PasswordHash.derive(passphrase, kdf))
        let keys: Unwrapped
        do { keys = try Self.unwrapAll(keyring, master: master, deviceKEK: deviceKEK) } catch
            where error.status == .decode
        {
            throw KeychainError(.authFailed, "wrong passphrase")
        }
        install(keys, generation: generation)
        guard keyring.wrappedPassphraseIndex == nil else { return nil }
        let key = try SecureBytes(random: BlindIndexer.keyLength)
        var next = keyring
        next.wrappedPassphraseIndex = Self.wrap(key, under: master, name: Self.passphraseIndexName)
        return PendingIndex(keyring: next.encoded, indexer: BlindIndexer(key: key), decoded: next)
    }

    /// A passphrase index key for a keyring that had none, computed but not yet in force.
    public struct PendingIndex: Sendable {
        /// The keyring bytes to persist, in the transaction that re-keys every row's digests.
        public let keyring: [UInt8]
        /// The new blind index: every row's digests are computed with it.
        public let indexer: BlindIndexer
        fileprivate let decoded: Keyring
    }

    /// Puts a persisted index migration in force: the rows are searched with its key from now on.
    /// Dropped (false) when the keyring changed meanwhile.
    @discardableResult
    public func adopt(_ change: PendingIndex) -> Bool {
        state.withLock { s in
            guard s.keyring.source == .passphrase, s.keyring.wrappedPassphraseIndex == nil else { return false }
            s.keyring.wrappedPassphraseIndex = change.decoded.wrappedPassphraseIndex
            s.passphraseIndex = change.indexer
            s.generation += 1
            s.rotation &+= 1  // a row sealed with the old digests must be sealed again before it is written
            indexChanges.add(1, ordering: .releasing)
            return true
        }
    }

    /// Checks `passphrase` against the keyring without changing any state.
    public func verify(passphrase: SecureBytes) throws(KeychainError) {
        let keyring = state.withLock { $0.keyring }
        guard keyring.source == .passphrase else { return }
        _ = try unwrapWithPassphrase(keyring, passphrase)
    }

    // MARK: The registry key

    /// Where the registry key stands.
    public enum RegistryKey: Sendable {
        /// A passphrase is set and has not been given since the vault opened.
        case unavailable
        /// The keyring has no registry key (written before it existed): nothing was ever sealed.
        case absent
        case available(SecureBytes)
    }

    /// The registry key's state now: unavailable while a passphrase is set and not yet given, absent, or the key.
    public var registryKey: RegistryKey {
        state.withLock { s in
            guard s.registryReadable else { return .unavailable }
            return s.registryKey.map { .available($0) } ?? .absent
        }
    }

    static let registryAD = Array("keychaind approved registrations v1".utf8)

    /// Seals `plain` (the encoded registrations) under a registry key.
    public static func sealRegistry(_ plain: [UInt8], key: SecureBytes) -> [UInt8] {
        key.withUnsafeBytes { k in registryAD.withUnsafeBytes { AEAD.seal(plain, key: k, ad: $0) } }
    }

    /// Opens what `sealRegistry` sealed; anything else, or another key, is errSecDecode.
    public static func openRegistry(_ sealed: [UInt8], key: SecureBytes) throws(KeychainError) -> [UInt8] {
        try key.withUnsafeBytes { (k) throws(KeychainError) -> [UInt8] in
            try withBytes(registryAD) { (a) throws(KeychainError) -> [UInt8] in
                try AEAD.open(sealed, key: k, ad: a, what: "the approved registrations")
            }
        }
    }

    /// A keyring with a fresh registry key, computed but not yet in force (see `PendingChange`).
    public struct PendingRegistry: Sendable {
        /// The keyring bytes to persist, holding the new registry key wrapped by the master key.
        public let keyring: [UInt8]
        /// The new registry key, in guarded memory: seal the registrations under it before adopting.
        public let registryKey: SecureBytes
        fileprivate let decoded: Keyring
    }

    /// Draws a fresh registry key wrapped by the master key — derived from `passphrase` when one is
    /// set (errSecAuthFailed when it is missing or wrong), else from the device key. Persist
    /// `keyring` with whatever is sealed under the new key, then `adopt` it.
    public func prepareRegistryChange(passphrase: SecureBytes?) throws(KeychainError) -> PendingRegistry {
        let current = state.withLock { $0.keyring }
        let master: SecureBytes
        switch current.source {
        case .deviceKey:
            master = try Self.masterFromDevice(deviceKey)
        case .passphrase:
            guard let passphrase else { throw KeychainError(.authFailed, "a passphrase is set: it is needed for this") }
            guard let kdf = current.kdf else {
                throw KeychainError(.decode, "the keyring lacks its key-derivation parameters")
            }
            master = try masterFromPassphrase(try PasswordHash.derive(passphrase, kdf))
            // Proves the passphrase: the class keys wrapped under this master must open.
            do { _ = try Self.unwrapAll(current, master: master, deviceKEK: deviceKEK) } catch
                where error.status == .decode
            {
                throw KeychainError(.authFailed, "wrong passphrase")
            }
        }
        let registry = try SecureBytes(random: AEAD.keyBytes)
        var next = current
        next.wrappedRegistry = Self.wrap(registry, under: master, name: Self.registryName)
        return PendingRegistry(keyring: next.encoded, registryKey: registry, decoded: next)
    }

    /// Puts a persisted registry change in force (the registry key is readable from now on).
    public func adopt(_ change: PendingRegistry) {
        state.withLock { s in
            s.keyring = change.decoded
            passphraseSet.store(change.decoded.source == .passphrase, ordering: .releasing)
            s.generation += 1
            s.registryKey = change.registryKey
            s.registryReadable = true
        }
    }

    // MARK: Changing the passphrase

    /// A keyring for a new passphrase (or none), computed but not yet in force. Persist `keyring`
    /// — together with every row re-wrapped by `rewrapItemKey` and the registrations re-sealed under
    /// `registryKey` — in one transaction, then `adopt` it; drop it to abandon the change.
    public struct PendingChange: Sendable {
        /// The keyring bytes to persist, in the same transaction as the re-wrapped rows.
        public let keyring: [UInt8]
        /// Whether this change removes the passphrase (the master key then comes from the device key).
        public let removesPassphrase: Bool
        /// Classes whose class key is new: every item key of these classes must be re-wrapped.
        public let rotatedClasses: [ProtectionClass]
        /// The new registry key (always fresh).
        public let registryKey: SecureBytes
        /// The registry key before the change (nil when the keyring had none).
        public let previousRegistryKey: SecureBytes?
        /// Whether the blind-index key changes (setting a passphrase where none was draws a fresh
        /// passphrase index key): every row's digests must be computed again with
        /// `indexer`, so every row is sealed again (`previousClassKey` opens it, `classKey` seals it).
        /// Otherwise the digests stay and only the item keys of `rotatedClasses` are re-wrapped.
        public let reindexes: Bool
        /// The blind index after the change.
        public let indexer: BlindIndexer
        fileprivate let passphraseIndex: BlindIndexer?
        fileprivate let decoded: Keyring
        fileprivate let classKeys: [ProtectionClass: SecureBytes]
        fileprivate let previousClassKeys: [ProtectionClass: SecureBytes]

        /// The key of class `c` before the change (opens the rows as they are).
        public func previousClassKey(_ c: ProtectionClass) -> SecureBytes? { previousClassKeys[c] }
        /// The key of class `c` after the change (seals the rows re-keyed for it).
        public func classKey(_ c: ProtectionClass) -> SecureBytes? { classKeys[c] }

        /// An item key sealed under the class key before the change, sealed again under the new one
        /// with the same associated data and the same construction (`ItemSealing`: the row's secret and
        /// attributes are sealed with it too). errSecDecode when it does not open (a damaged row); a
        /// class that was not rotated is errSecParam.
        public func rewrapItemKey(
            _ sealed: [UInt8], protection: ProtectionClass,
            associatedData: [UInt8]
        ) throws(KeychainError) -> [UInt8] {
            guard rotatedClasses.contains(protection), let old = previousClassKeys[protection],
                let new = classKeys[protection]
            else {
                throw KeychainError(.param, "the \(protection.code) class key is not being rotated")
            }
            guard let sealing = ItemSealing(sealedItemKey: sealed) else {
                throw KeychainError(.decode, "item key is damaged (no known layout)")
            }
            return try old.withUnsafeBytes { (ok) throws(KeychainError) -> [UInt8] in
                try new.withUnsafeBytes { (nk) throws(KeychainError) -> [UInt8] in
                    try withBytes(associatedData) { (ad) throws(KeychainError) -> [UInt8] in
                        try AEAD.withOpenedKey(sealed, key: ok, ad: ad, what: "item key", sealing: sealing) {
                            (ik) throws(KeychainError) -> [UInt8] in
                            try AEAD.sealKey(ik, key: nk, ad: ad, sealing: sealing)
                        }
                    }
                }
            }
        }
    }

    /// Prepares setting, changing (`new`) or removing (`new == nil`) the passphrase. `old` must be the
    /// current passphrase when one is set (errSecAuthFailed otherwise); it is ignored when none is set.
    ///
    /// Setting or changing draws fresh class keys for ak, ck, aku, cku and akpu (`rotatedClasses`) and
    /// wraps them under the new master key; removing keeps those keys (re-wrapped under the
    /// device-derived master) but gives `akpu` a fresh one, so items of that class can never be opened
    /// again (the caller deletes them). Every change draws a fresh registry key.
    public func preparePassphraseChange(old: SecureBytes?, new: SecureBytes?, profile: KDFProfile) throws(KeychainError)
        -> PendingChange
    {
        let current = state.withLock { $0.keyring }
        let unwrapped: Unwrapped
        switch current.source {
        case .deviceKey:
            unwrapped = try Self.unwrapAll(current, master: try Self.masterFromDevice(deviceKey), deviceKEK: deviceKEK)
        case .passphrase:
            guard let old else {
                throw KeychainError(
                    .authFailed, "a passphrase is set: the current one is needed to change it (\"old\")")
            }
            unwrapped = try unwrapWithPassphrase(current, old)
        }
        var keys = unwrapped.classKeys
        var rotated: [ProtectionClass] = []
        var next = current
        let master: SecureBytes
        if let new {
            let kdf = KDFParameters.fresh(profile)
            next.source = .passphrase
            next.kdf = kdf
            master = try masterFromPassphrase(try PasswordHash.derive(new, kdf))
            for c in Self.masterProtected {
                keys[c] = try SecureBytes(random: AEAD.keyBytes)
                rotated.append(c)
            }
        } else {
            next.source = .deviceKey
            next.kdf = nil
            master = try Self.masterFromDevice(deviceKey)
            if current.source == .passphrase {
                keys[.whenPasscodeSetThisDeviceOnly] = try SecureBytes(random: AEAD.keyBytes)
            }
        }
        let keks = try Keks(master: master, deviceKEK: deviceKEK)
        for c in Self.masterProtected {
            next.wrapped[c] = Self.wrap(keys[c]!, under: keks.wrappingKey(for: c), name: c.code)
        }
        let registry = try SecureBytes(random: AEAD.keyBytes)
        next.wrappedRegistry = Self.wrap(registry, under: master, name: Self.registryName)
        // The passphrase index key: re-wrapped by a change of the passphrase; drawn afresh when a
        // passphrase is set where none was (a key wrapped under the device-derived master is known to
        // anyone holding device.key) or the keyring has none yet; kept, wrapped under the
        // device-derived master, when the passphrase is removed (nothing is private against
        // device.key then, and no row changes).
        let previousIndexer = unwrapped.passphraseIndex ?? deviceIndex
        var passphraseIndex: BlindIndexer? = nil
        if let kept = unwrapped.passphraseIndex, new == nil || current.source == .passphrase {
            passphraseIndex = kept
            next.wrappedPassphraseIndex = kept.wrapped(under: master, name: Self.passphraseIndexName)
        } else if new != nil {
            let key = try SecureBytes(random: BlindIndexer.keyLength)
            passphraseIndex = BlindIndexer(key: key)
            next.wrappedPassphraseIndex = Self.wrap(key, under: master, name: Self.passphraseIndexName)
        }
        let indexer = passphraseIndex ?? deviceIndex
        return PendingChange(
            keyring: next.encoded, removesPassphrase: new == nil && current.source == .passphrase,
            rotatedClasses: rotated, registryKey: registry, previousRegistryKey: unwrapped.registry,
            reindexes: !indexer.sameKey(as: previousIndexer), indexer: indexer, passphraseIndex: passphraseIndex,
            decoded: next, classKeys: keys, previousClassKeys: unwrapped.classKeys)
    }

    /// Marks a passphrase removal as under way (akpu writes refused) or no longer (it failed).
    public func setRemovingPassphrase(_ on: Bool) {
        state.withLock { $0.removingPassphrase = on }
    }

    /// Puts a persisted change in force. The lock state is kept: a locked class stays locked (only
    /// keys already in memory are replaced), except that removing the passphrase unlocks every class,
    /// as nothing could unlock them later. The new registry key is readable from now on (the change
    /// was made with the passphrase, or without one set).
    public func adopt(_ change: PendingChange) {
        state.withLock { s in
            s.keyring = change.decoded
            passphraseSet.store(change.decoded.source == .passphrase, ordering: .releasing)
            s.generation += 1
            s.rotation &+= 1
            s.removingPassphrase = false
            if change.decoded.source == .deviceKey {
                s.classKeys = s.classKeys.merging(change.classKeys) { $1 }
            } else {
                for (c, k) in change.classKeys where s.classKeys[c] != nil { s.classKeys[c] = k }
            }
            s.registryKey = change.registryKey
            s.registryReadable = true
            s.passphraseIndex = change.passphraseIndex
            if change.reindexes { indexChanges.add(1, ordering: .releasing) }
        }
    }

    // MARK: Derivation and wrapping

    private static func deviceKEK(_ deviceKey: SecureBytes) throws(KeychainError) -> SecureBytes {
        try KeyedHash.deriveKey(from: deviceKey, label: "keychaind device-kek v1")
    }

    private static func masterFromDevice(_ deviceKey: SecureBytes) throws(KeychainError) -> SecureBytes {
        try KeyedHash.deriveKey(from: deviceKey, label: "keychaind master-from-device v1")
    }

    /// The passphrase master is entangled with the device key (Apple: UID + passcode), so a copy of
    /// the database without `device.key` cannot even be attacked by guessing passphrases.
    private func masterFromPassphrase(_ stretched: SecureBytes) throws(KeychainError) -> SecureBytes {
        try KeyedHash.deriveKey(from: stretched, label: "keychaind master-from-passphrase v1", mixing: deviceKEK)
    }

    private func unwrapWithPassphrase(_ keyring: Keyring, _ passphrase: SecureBytes) throws(KeychainError) -> Unwrapped
    {
        guard let kdf = keyring.kdf else {
            throw KeychainError(.decode, "the keyring lacks its key-derivation parameters")
        }
        let master = try masterFromPassphrase(try PasswordHash.derive(passphrase, kdf))
        do {
            return try Self.unwrapAll(keyring, master: master, deviceKEK: deviceKEK)
        } catch  where error.status == .decode {
            throw KeychainError(.authFailed, "wrong passphrase")
        }
    }

    private static func unwrapAll(_ keyring: Keyring, master: SecureBytes, deviceKEK: SecureBytes) throws(KeychainError)
        -> Unwrapped
    {
        let keks = try Keks(master: master, deviceKEK: deviceKEK)
        var keys: [ProtectionClass: SecureBytes] = [:]
        for c in ProtectionClass.allCases {
            keys[c] = try unwrapClass(c, keyring, under: keks.wrappingKey(for: c))
        }
        // The class keys opened under this master, so the passphrase is right: a registry key that does
        // not open is damage, and is treated as none (registrations sealed under it read as damaged).
        let registry = keyring.wrappedRegistry.flatMap {
            try? unwrap($0, under: master, name: registryName, length: AEAD.keyBytes)
        }
        // The passphrase index key, unlike the registry key, must open: without it no row is found.
        var passphraseIndex: BlindIndexer? = nil
        if let w = keyring.wrappedPassphraseIndex {
            do {
                passphraseIndex = BlindIndexer(
                    key: try unwrap(w, under: master, name: passphraseIndexName, length: BlindIndexer.keyLength))
            } catch {
                throw KeychainError(.decode, "the keyring's passphrase index key does not open (a damaged keyring)")
            }
        }
        return Unwrapped(classKeys: keys, registry: registry, passphraseIndex: passphraseIndex)
    }

    private static func unwrapClass(_ c: ProtectionClass, _ keyring: Keyring, under kek: SecureBytes)
        throws(KeychainError) -> SecureBytes
    {
        do { return try unwrap(keyring.wrapped[c]!, under: kek, name: c.code, length: AEAD.keyBytes) } catch {
            throw KeychainError(
                .decode,
                "the \(c.code) class key does not open (wrong device.key, wrong passphrase or a damaged keyring)")
        }
    }

    /// Installs unwrapped keys unless the keyring changed meanwhile (a concurrent passphrase change).
    private func install(_ keys: Unwrapped, generation: Int) {
        state.withLock { s in
            guard s.generation == generation else { return }
            s.classKeys = keys.classKeys
            s.registryKey = keys.registry
            s.registryReadable = true
            if let p = keys.passphraseIndex, s.passphraseIndex == nil {
                s.passphraseIndex = p
                indexChanges.add(1, ordering: .releasing)
            }
        }
    }

    private static func ad(_ name: String) -> [UInt8] { Array("keychaind keyring v1 \(name)".utf8) }

    static func wrap(_ key: SecureBytes, under kek: SecureBytes, name: String) -> [UInt8] {
        key.withUnsafeBytes { k in
            kek.withUnsafeBytes { w in ad(name).withUnsafeBytes { AEAD.seal(k, key: w, ad: $0) } }
        }
    }

    static func unwrap(_ sealed: [UInt8], under kek: SecureBytes, name: String, length: Int) throws(KeychainError)
        -> SecureBytes
    {
        guard sealed.count == length + AEAD.overhead else {
            throw KeychainError(.decode, "wrapped \(name) key has the wrong length")
        }
        var failure: KeychainError?
        let key = try SecureBytes(count: length) { out in
            kek.withUnsafeBytes { w in
                sealed.withUnsafeBytes { s in
                    ad(name).withUnsafeBytes { a in
                        do throws(KeychainError) {
                            try AEAD.open(s, key: w, ad: a, into: out, what: "wrapped key")
                        } catch { failure = error }
                    }
                }
            }
        }
        if let failure { throw failure }
        return key
    }

    /// The key-encryption keys under a given master key.
    private struct Keks {
        let device: SecureBytes
        let master: SecureBytes
        let thisDevice: SecureBytes

        init(master: SecureBytes, deviceKEK: SecureBytes) throws(KeychainError) {
            device = deviceKEK
            self.master = master
            thisDevice = try KeyedHash.deriveKey(
                from: master, label: "keychaind this-device-only v1", mixing: deviceKEK)
        }

        func wrappingKey(for c: ProtectionClass) -> SecureBytes {
            if c.isAlways { return device }
            return c.isThisDeviceOnly ? thisDevice : master
        }
    }
}
