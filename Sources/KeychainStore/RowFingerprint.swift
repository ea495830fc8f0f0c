import KeychainCore
import KeychainCrypto

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

    /// How much of each sealed blob a fingerprint covers: its first 24 bytes, which hold the whole
    /// random nonce of every construction (XChaCha20's 24 bytes; AES-256-GCM's 12, after the item
    /// key's tag byte, followed by ciphertext). `columns` cuts the blobs to the same length.
    static let sealedPrefixBytes = 24

    /// The columns a fingerprint is read from, in this order (blobs cut to `sealedPrefixBytes`).
    static let columns =
        "ref, class, agrp_ix, svce_ix, acct_ix, key_ix, substr(item_key, 1, 24), substr(attributes, 1, 24), substr(secret, 1, 24)"

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
        itemKeyNonce = Array(item.wrappedKey.prefix(Self.sealedPrefixBytes))
        attributesNonce = Array(item.attributes.prefix(Self.sealedPrefixBytes))
        self.secretNonce = secretNonce ?? Array(item.secret.prefix(Self.sealedPrefixBytes))
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
        Sum256(
            key.withUnsafeBytes {
                KeyedHash.hash(
                    key: $0, domain: 0xE0,
                    parts: [
                        ref, RowState.littleEndian(UInt64(bitPattern: protectionClass)), accessGroupIndex, serviceIndex,
                        accountIndex, uniqueIndex,
                        itemKeyNonce, attributesNonce, secretNonce,
                    ],
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
        Sum256(
            key.withUnsafeBytes {
                KeyedHash.hash(key: $0, domain: 0xE3, parts: [Array(name.utf8), value], length: 32)
            })
    }
}

/// A Secret Service attribute-index entry (`item_attributes`, AttributeIndex.swift) counts in the sum
/// too, so entries removed, added or moved to another item are caught like item rows. Entries are not
/// counted in the record's item count; an empty index adds nothing, so keychains without Secret
/// Service items keep the sums they had before the table existed.
struct AttributeIndexFingerprint {
    var index: [UInt8]
    var ref: [UInt8]

    func value(key: SecureBytes) -> Sum256 {
        Sum256(
            key.withUnsafeBytes {
                KeyedHash.hash(key: $0, domain: 0xE4, parts: [index, ref], length: 32)
            })
    }
}
