package import KeychainCore
package import KeychainCrypto
package import KeychainStore

/// The parts of the item model that a transport's own item calls (the Secret Service's, in
/// KeychainSecretService) build on, inside this package: item ids and attribute bytes as the rest of
/// this module reads them.
extension ItemService {
    // Accessors rather than `package` stored properties: the stored properties stay internal, so
    // the getters the socket's hot path calls (`hasPassphrase`, `indexGeneration`) stay inlinable
    // across modules in a release build.

    /// The item store.
    package var itemStore: ItemStore { store }
    /// The key hierarchy.
    package var itemVault: Vault { vault }
    /// Seals and opens rows.
    package var itemCodec: ItemCodec { codec }
    /// Creation and modification times, strictly increasing.
    package var itemClock: Clock { clock }

    /// The length of an item's id (its persistent reference's 16 bytes).
    package static var itemIDLength: Int { PersistentRef.idLength }

    /// A new item id for an item created at `seconds` since the epoch.
    package static func newItemID(createdAt seconds: Double) -> [UInt8] { PersistentRef.newID(createdAt: seconds) }

    /// The bytes of a text or data attribute value, nil for any other value.
    package static func attributeBytes(of value: Value) -> [UInt8]? { Attribute.bytes(of: value) }
}
