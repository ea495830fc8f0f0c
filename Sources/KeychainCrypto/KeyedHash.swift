import CSodium
public import KeychainCore
import KeychainSystem

/// Keyed BLAKE2b (`crypto_generichash` with a key): blind indexes and key derivation.
///
/// Inputs are framed unambiguously: a domain byte, then each part as an 8-byte little-endian length
/// followed by its bytes, so ("ab","c") and ("a","bc") never collide.
public enum KeyedHash {
    /// Keyed BLAKE2b of the framed `domain` and `parts`, `length` bytes long.
    public static func hash(key: UnsafeRawBufferPointer, domain: UInt8, parts: [[UInt8]], length: Int) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: length) { out, initialized in
            hash(key: key, domain: domain, into: UnsafeMutableRawBufferPointer(out)) { add in
                for part in parts { part.withUnsafeBytes(add) }
            }
            initialized = length
        }
    }

    /// The same hash with the parts handed over one at a time as raw bytes (no arrays: the row-state
    /// scan at open hashes columns straight from SQLite). Writes `out.count` bytes of digest.
    public static func hash(
        key: UnsafeRawBufferPointer, domain: UInt8, into out: UnsafeMutableRawBufferPointer,
        parts: (_ add: (UnsafeRawBufferPointer) -> Void) -> Void
    ) {
        hash(key: key, into: out) { state in
            var d = domain
            withUnsafeBytes(of: &d) { update(state, $0) }
            parts { part in
                var n = UInt64(part.count).littleEndian
                withUnsafeBytes(of: &n) { update(state, $0) }
                update(state, part)
            }
        }
    }

    /// The same hash of parts already framed: `framed` holds the domain byte, then each part's
    /// 8-byte little-endian length and bytes. One update instead of two per part: the
    /// uniqueness digest of every `copy` compiled from a template is hashed so.
    public static func hash(
        key: UnsafeRawBufferPointer, framed: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) {
        hash(key: key, into: out) { state in update(state, framed) }
    }

    private static func update(_ state: OpaquePointer, _ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        let rc = crypto_generichash_update(state, base.assumingMemoryBound(to: UInt8.self), UInt64(bytes.count))
        precondition(rc == 0, "crypto_generichash_update failed")
    }

    /// Keyed BLAKE2b, `out.count` bytes long, of whatever `input` feeds the state (`update`).
    private static func hash(
        key: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, input: (_ state: OpaquePointer) -> Void
    ) {
        precondition(out.count >= Int(crypto_generichash_BYTES_MIN) && out.count <= Int(crypto_generichash_BYTES_MAX))
        precondition(
            key.count >= Int(crypto_generichash_KEYBYTES_MIN) && key.count <= Int(crypto_generichash_KEYBYTES_MAX))
        Sodium.ensureInitialized()
        // The BLAKE2b state is 64-byte aligned, so Swift sees it as opaque: keep it on the stack. Swift
        // puts temporary allocations aligned beyond 16 bytes on the heap (posix_memalign, about 1 000
        // instructions a call), so the buffer is 16-aligned with room to align the state inside it.
        let stateBytes = crypto_generichash_statebytes()
        withUnsafeTemporaryAllocation(byteCount: stateBytes + 48, alignment: 16) { raw in
            defer { Sodium.zero(raw) }
            let base = UInt(bitPattern: raw.baseAddress!)
            let aligned = raw.baseAddress! + Int((base + 63) & ~UInt(63) - base)
            let state = OpaquePointer(aligned)
            // libsodium fails these only for lengths outside its bounds (checked above) or a state used
            // after `final`; either is a bug here, never bad input, so it stops the process.
            var rc = crypto_generichash_init(
                state, key.baseAddress!.assumingMemoryBound(to: UInt8.self), key.count, out.count)
            precondition(rc == 0, "crypto_generichash_init failed")
            input(state)
            rc = crypto_generichash_final(state, out.baseAddress!.assumingMemoryBound(to: UInt8.self), out.count)
            precondition(rc == 0, "crypto_generichash_final failed")
        }
    }

    /// Derives a 32-byte subkey into guarded memory: BLAKE2b keyed with `key` over a label (and extra
    /// key material, such as a second key a derived key must depend on).
    public static func deriveKey(from key: SecureBytes, label: String, mixing other: SecureBytes? = nil)
        throws(KeychainError) -> SecureBytes
    {
        try key.withUnsafeBytes { (k) throws(KeychainError) in
            var parts: [[UInt8]] = [Array(label.utf8)]
            if let other { parts.append(other.withUnsafeBytes { Array($0) }) }
            var out = hash(key: k, domain: 0xD0, parts: parts, length: AEAD.keyBytes)
            defer {
                Sodium.zero(&out)
                for i in parts.indices { Sodium.zero(&parts[i]) }
            }
            return try withBytes(out) { (b) throws(KeychainError) in try SecureBytes(copying: b) }
        }
    }
}

/// The blind index: keyed BLAKE2b of attribute values, so the database can find and de-duplicate items
/// by service/account/group without holding them. The key lives in guarded memory.
public struct BlindIndexer: Sendable {
    /// Length of a search column's digest; the uniqueness digest is longer (collisions there would be
    /// false duplicates).
    public static let columnLength = 16
    /// Length of the blind-index key in bytes (32).
    public static let keyLength = 32

    /// Which column a digest is for; its raw value is the hash's domain byte, so columns never share digests.
    public enum Column: UInt8, Sendable {
        case accessGroup = 1
        case service = 2
        case account = 3
        case uniqueKey = 4
        /// One Secret Service attribute (name, value), and the mark of an item that has its own
        /// Secret Service attributes (docs/secret-service.md).
        case secretServiceAttribute = 5
        case secretServiceItem = 6
        /// An internet password's server (its search column, `svce_ix`): never equal to a service's digest.
        case server = 7
        /// An internet password's uniqueness key (`key_ix`): never equal to a generic password's.
        case internetUniqueKey = 8
    }

    let key: SecureBytes

    /// An indexer keyed by `key` (guarded memory, kept for the indexer's life).
    public init(key: SecureBytes) { self.key = key }

    /// Whether `other` is keyed by the same key (the same guarded memory).
    public func sameKey(as other: BlindIndexer) -> Bool { key === other.key }

    /// The key wrapped under `kek` as the keyring holds it.
    func wrapped(under kek: SecureBytes, name: String) -> [UInt8] { Vault.wrap(key, under: kek, name: name) }

    /// Digest of one attribute value for its search column.
    public func column(_ column: Column, _ value: [UInt8]) -> [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(key: $0, domain: column.rawValue, parts: [value], length: Self.columnLength)
        }
    }

    /// Digest of one Secret Service attribute for the attribute index (name and value framed apart).
    public func secretServiceAttribute(name: [UInt8], value: [UInt8]) -> [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(
                key: $0, domain: Column.secretServiceAttribute.rawValue, parts: [name, value], length: Self.columnLength
            )
        }
    }

    /// The attribute-index entry every item with its own Secret Service attributes carries (so the
    /// items without them can be told apart without decrypting anything).
    public var secretServiceItemMark: [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(key: $0, domain: Column.secretServiceItem.rawValue, parts: [], length: Self.columnLength)
        }
    }

    /// Digest of a uniqueness key given as its parts (each framed apart) under `domain`, for the
    /// UNIQUE column: the classes other than generic passwords (ItemClass.uniqueness).
    public func uniqueKey(domain: Column, parts: [[UInt8]]) -> [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(key: $0, domain: domain.rawValue, parts: parts, length: Self.uniqueKeyLength)
        }
    }

    /// Digest of Apple's uniqueness key (agrp, svce, acct, sync) for the UNIQUE column.
    public func uniqueKey(accessGroup: [UInt8], service: [UInt8], account: [UInt8], synchronizable: Bool) -> [UInt8] {
        accessGroup.withUnsafeBytes { g in
            service.withUnsafeBytes { s in
                account.withUnsafeBytes { a in
                    uniqueKey(accessGroup: g, service: s, account: a, synchronizable: synchronizable)
                }
            }
        }
    }

    /// The same digest of bytes in place: a `copy` computes one per request from the query's own
    /// strings, and the array of parts (and each part's array) cost more than the hash around them.
    public func uniqueKey(
        accessGroup: UnsafeRawBufferPointer, service: UnsafeRawBufferPointer, account: UnsafeRawBufferPointer,
        synchronizable: Bool
    ) -> [UInt8] {
        // Hashed on the stack, then copied into the array: the array initializers that allocate
        // uninitialized storage are not specialised in this module, and looking the storage type up
        // at run time cost more than the copy.
        withUnsafeTemporaryAllocation(byteCount: Self.uniqueKeyLength, alignment: 1) { out in
            uniqueKey(
                accessGroup: accessGroup, service: service, account: account, synchronizable: synchronizable,
                into: out)
            return Array(UnsafeRawBufferPointer(out))
        }
    }

    /// Writes `part` framed (its 8-byte little-endian length, then its bytes) into `buffer` at `at`;
    /// returns where the next part goes.
    private static func put(_ part: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer, at: Int) -> Int
    {
        buffer.storeBytes(of: UInt64(part.count).littleEndian, toByteOffset: at, as: UInt64.self)
        if part.count > 0 {
            UnsafeMutableRawBufferPointer(rebasing: buffer[at + 8..<at + 8 + part.count]).copyMemory(from: part)
        }
        return at + 8 + part.count
    }

    /// Length of the uniqueness digest (`uniqueKey`).
    public static let uniqueKeyLength = 32

    /// The same digest written into `out` (`uniqueKeyLength` bytes): a `copy` compiled from its
    /// template hashes the request's own bytes into a buffer on the stack, with no array at all.
    public func uniqueKey(
        accessGroup: UnsafeRawBufferPointer, service: UnsafeRawBufferPointer, account: UnsafeRawBufferPointer,
        synchronizable: Bool, into out: UnsafeMutableRawBufferPointer
    ) {
        precondition(out.count == Self.uniqueKeyLength, "a uniqueness digest is \(Self.uniqueKeyLength) bytes")
        // The four parts framed into one buffer and hashed in one update (the same bytes in the
        // same order as `KeyedHash.hash(key:domain:into:parts:)` hashes them, so the same digest).
        // The buffer holds the request's service and account: wiped before it goes.
        let count = 1 + 8 + accessGroup.count + 8 + service.count + 8 + account.count + 8 + 1
        withUnsafeTemporaryAllocation(byteCount: count, alignment: 8) { framed in
            defer { Sodium.zero(framed) }
            framed[0] = Column.uniqueKey.rawValue
            var at = Self.put(accessGroup, into: framed, at: 1)
            at = Self.put(service, into: framed, at: at)
            at = Self.put(account, into: framed, at: at)
            framed.storeBytes(of: UInt64(1).littleEndian, toByteOffset: at, as: UInt64.self)
            framed[at + 8] = synchronizable ? 1 : 0
            precondition(at + 9 == count, "the framed parts do not fill their buffer")
            key.withUnsafeBytes { k in KeyedHash.hash(key: k, framed: UnsafeRawBufferPointer(framed), into: out) }
        }
    }
}
