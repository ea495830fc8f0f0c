import KeychainCrypto

/// Persistent references, Apple's current format: the class (`genp`, 4 ASCII bytes) followed by the
/// item's 16-byte id (see `newID`). Valid for the item's whole life, across restarts.
enum PersistentRef {
    static let idLength = 16
    private static let prefix: [UInt8] = Array("genp".utf8)

    static func make(id: [UInt8]) -> [UInt8] { prefix + id }

    /// The item id inside a persistent reference, or nil when the bytes are not one.
    static func id(from bytes: [UInt8]) -> [UInt8]? {
        guard bytes.count == prefix.count + idLength, bytes.starts(with: prefix) else { return nil }
        return Array(bytes[prefix.count...])
    }
}

extension PersistentRef {
    /// A new item id: the creation time in microseconds (8 bytes, big-endian) then 8 random bytes.
    /// Ids of new items sort after older ones, so the UNIQUE index on `ref` grows at its end instead
    /// of touching a random page per add; the random half keeps ids unique within a microsecond.
    /// Nothing relies on ids being unguessable: a reference only finds items of the caller's groups.
    static func newID(createdAt seconds: Double) -> [UInt8] {
        let micros = UInt64(max(0, seconds) * 1_000_000)
        var id = (0..<8).map { UInt8(truncatingIfNeeded: micros >> (56 - 8 * UInt64($0))) }
        id += Sodium.randomBytes(idLength - 8)
        return id
    }
}
