package import KeychainCore

/// The parts of the item model that a transport's own item calls (the Secret Service's, in
/// KeychainSecretService) build on, inside this package: item ids and attribute bytes as the rest of
/// this module reads them.
extension ItemService {
    /// The length of an item's id (its persistent reference's 16 bytes).
    package static var itemIDLength: Int { PersistentRef.idLength }

    /// A new item id for an item created at `seconds` since the epoch.
    package static func newItemID(createdAt seconds: Double) -> [UInt8] { PersistentRef.newID(createdAt: seconds) }

    /// The bytes of a text or data attribute value, nil for any other value.
    package static func attributeBytes(of value: Value) -> [UInt8]? { Attribute.bytes(of: value) }
}
