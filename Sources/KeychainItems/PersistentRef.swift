/// Persistent references, Apple's current format: the class (`genp`, 4 ASCII bytes) followed by the
/// item's random 16-byte id. Valid for the item's whole life, across restarts.
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
