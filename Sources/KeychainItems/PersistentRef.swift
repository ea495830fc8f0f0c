import KeychainCore
import KeychainCrypto

/// Persistent references, Apple's current format: the item's class code (`genp`, `inet`: 4 ASCII
/// bytes, ItemClass.code) followed by the item's 16-byte id (see `newID`). Valid for the item's whole
/// life, across restarts.
enum PersistentRef {
    static let idLength = 16
    private static let prefixLength = 4

    static func make(id: [UInt8], of itemClass: ItemClass = .genericPassword) -> [UInt8] {
        Array(itemClass.code.utf8) + id
    }

    /// The class and the item id inside a persistent reference, or nil when the bytes are not one.
    static func parse(_ bytes: [UInt8]) -> (ItemClass, [UInt8])? {
        guard bytes.count == prefixLength + idLength,
            let itemClass = ItemClass.all.first(where: { bytes.starts(with: $0.code.utf8) })
        else { return nil }
        return (itemClass, Array(bytes[prefixLength...]))
    }

    /// The item id inside a persistent reference of any class, or nil when the bytes are not one.
    static func id(from bytes: [UInt8]) -> [UInt8]? { parse(bytes)?.1 }
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
