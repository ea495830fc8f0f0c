import KeychainCore
import Synchronization

/// The key hierarchy of one keychain.
///
/// ```
/// device.key (32 random bytes, file 0600)
///  ├─ device KEK      = BLAKE2b(device key, "device-kek")          wraps: dk, dku, blind-index key
///  └─ master key      = BLAKE2b(device key, "master-from-device")  wraps: ak, ck
///       (issue 5: Argon2id(passphrase) instead; only the wrapping of the class keys changes)
///      └─ this-device KEK = BLAKE2b(master, "this-device-only" ‖ device KEK)   wraps: aku, cku, akpu
/// class key (one per accessibility class) wraps each item's random key; the item key seals the row.
/// ```
///
/// The wrapped keys form the *keyring*, a CBOR map the store keeps in its `meta` table. Unwrapped class
/// keys live in guarded memory and can be dropped (`lock`), after which `classKey` throws
/// `errSecInteractionNotAllowed` — the seam for the passphrase and auto-lock of later issues. The
/// blind-index key and the "Always" class keys depend on the device key only, so they stay available
/// whenever the daemon runs.
public final class Vault: Sendable {
    /// Where the master key comes from.
    public enum MasterSource: String, Sendable {
        /// Derived from the device key file: no passphrase set (the daemon starts unlocked).
        case deviceKey = "device"
    }

    public static let keyringVersion: Int64 = 1

    public let masterSource: MasterSource
    /// Keyed BLAKE2b for the database's search and uniqueness columns.
    public let blindIndex: BlindIndexer

    private let deviceKey: SecureBytes
    private let wrappedClassKeys: [ProtectionClass: [UInt8]]
    private let classKeys: Mutex<[ProtectionClass: SecureBytes]>

    private init(deviceKey: SecureBytes, source: MasterSource, wrapped: [ProtectionClass: [UInt8]],
                 indexKey: SecureBytes) {
        self.deviceKey = deviceKey
        self.masterSource = source
        self.wrappedClassKeys = wrapped
        self.blindIndex = BlindIndexer(key: indexKey)
        self.classKeys = Mutex([:])
    }

    /// A new keychain: fresh random class keys and blind-index key, wrapped as described above.
    /// Returns the vault (unlocked) and the keyring to persist.
    public static func create(deviceKey: SecureBytes) -> (vault: Vault, keyring: [UInt8]) {
        let kek = Keks(deviceKey: deviceKey)
        var map: [String: Value] = ["v": .int(keyringVersion), "master": .text(MasterSource.deviceKey.rawValue)]
        var wrapped: [ProtectionClass: [UInt8]] = [:]
        var plain: [ProtectionClass: SecureBytes] = [:]
        for c in ProtectionClass.allCases {
            let key = SecureBytes(random: AEAD.keyBytes)
            let w = wrap(key, under: kek.wrappingKey(for: c), name: c.code)
            wrapped[c] = w
            plain[c] = key
            map[c.code] = .bytes(w)
        }
        let indexKey = SecureBytes(random: BlindIndexer.keyLength)
        map["index"] = .bytes(wrap(indexKey, under: kek.device, name: "index"))
        let vault = Vault(deviceKey: deviceKey, source: .deviceKey, wrapped: wrapped, indexKey: indexKey)
        vault.classKeys.withLock { $0 = plain }
        return (vault, CBOR.encode(.map(map)))
    }

    /// Opens an existing keyring with this device's key. A keyring that does not open with this key
    /// (another device's key file, or damage) is `errSecDecode`, with a message that says so.
    public static func open(deviceKey: SecureBytes, keyring: [UInt8]) throws(KeychainError) -> Vault {
        let decoded: Value
        do { decoded = try CBOR.decode(keyring) } catch {
            throw KeychainError(.decode, "the keyring in the database is damaged")
        }
        guard let map = decoded.map, map["v"]?.int == keyringVersion else {
            throw KeychainError(.decode, "the keyring in the database has an unknown format (newer keychaind?)")
        }
        guard let sourceName = map["master"]?.text, let source = MasterSource(rawValue: sourceName) else {
            throw KeychainError(.decode, "the keyring in the database names an unknown master-key source")
        }
        var wrapped: [ProtectionClass: [UInt8]] = [:]
        for c in ProtectionClass.allCases {
            guard let w = map[c.code]?.bytes else { throw KeychainError(.decode, "the keyring lacks the \(c.code) class key") }
            wrapped[c] = w
        }
        guard let wrappedIndex = map["index"]?.bytes else { throw KeychainError(.decode, "the keyring lacks the blind-index key") }
        let kek = Keks(deviceKey: deviceKey)
        let indexKey: SecureBytes
        do { indexKey = try unwrap(wrappedIndex, under: kek.device, name: "index", length: BlindIndexer.keyLength) } catch {
            throw KeychainError(.decode, "the device key file does not belong to this database (the keyring does not open with it)")
        }
        let vault = Vault(deviceKey: deviceKey, source: source, wrapped: wrapped, indexKey: indexKey)
        try vault.unlock()
        return vault
    }

    /// The unwrapped key of a class, or `errSecInteractionNotAllowed` while that class is locked.
    public func classKey(_ c: ProtectionClass) throws(KeychainError) -> SecureBytes {
        guard let key = classKeys.withLock({ $0[c] }) else {
            throw KeychainError(.interactionNotAllowed,
                                "the keychain is locked: items accessible \(c.code) cannot be used until it is unlocked")
        }
        return key
    }

    public func isAvailable(_ c: ProtectionClass) -> Bool { classKeys.withLock { $0[c] != nil } }

    /// Whether a passphrase protects the master key (Apple's "device has a passcode").
    public var hasPassphrase: Bool { masterSource != .deviceKey }

    /// Drops the unwrapped keys of `classes` (zeroed when the last user lets go of them).
    public func lock(_ classes: some Sequence<ProtectionClass>) {
        classKeys.withLock { keys in for c in classes { keys[c] = nil } }
    }

    /// Unwraps every class key again. With `MasterSource.deviceKey` this needs nothing but the device
    /// key; issue 5 adds the passphrase variant.
    public func unlock() throws(KeychainError) {
        let kek = Keks(deviceKey: deviceKey)
        var keys: [ProtectionClass: SecureBytes] = [:]
        for c in ProtectionClass.allCases {
            do { keys[c] = try Self.unwrap(wrappedClassKeys[c]!, under: kek.wrappingKey(for: c), name: c.code, length: AEAD.keyBytes) } catch {
                throw KeychainError(.decode, "the \(c.code) class key does not open with this device key (wrong device.key or a damaged keyring)")
            }
        }
        classKeys.withLock { $0 = keys }
    }

    // MARK: Wrapping

    private static func ad(_ name: String) -> [UInt8] { Array("keychaind keyring v1 \(name)".utf8) }

    static func wrap(_ key: SecureBytes, under kek: SecureBytes, name: String) -> [UInt8] {
        key.withUnsafeBytes { k in kek.withUnsafeBytes { w in ad(name).withUnsafeBytes { AEAD.seal(k, key: w, ad: $0) } } }
    }

    static func unwrap(_ sealed: [UInt8], under kek: SecureBytes, name: String, length: Int) throws(KeychainError) -> SecureBytes {
        guard sealed.count == length + AEAD.overhead else { throw KeychainError(.decode, "wrapped \(name) key has the wrong length") }
        var failure: KeychainError?
        let key = SecureBytes(count: length) { out in
            kek.withUnsafeBytes { w in
                sealed.withUnsafeBytes { s in
                    ad(name).withUnsafeBytes { a in
                        do throws(KeychainError) { try AEAD.open(s, key: w, ad: a, into: out, what: "wrapped key") } catch { failure = error }
                    }
                }
            }
        }
        if let failure { throw failure }
        return key
    }

    /// The key-encryption keys derived from the device key (and, later, the passphrase).
    private struct Keks {
        let device: SecureBytes
        let master: SecureBytes
        let thisDevice: SecureBytes

        init(deviceKey: SecureBytes) {
            device = KeyedHash.deriveKey(from: deviceKey, label: "keychaind device-kek v1")
            master = KeyedHash.deriveKey(from: deviceKey, label: "keychaind master-from-device v1")
            thisDevice = KeyedHash.deriveKey(from: master, label: "keychaind this-device-only v1", mixing: device)
        }

        func wrappingKey(for c: ProtectionClass) -> SecureBytes {
            if c.isAlways { return device }
            return c.isThisDeviceOnly ? thisDevice : master
        }
    }
}
