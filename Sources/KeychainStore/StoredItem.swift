/// One row of the `items` table, as bytes: digests, the sealed item key and sealed blobs.
/// Nothing here is readable without the keys; the item layer seals and opens.
public struct StoredItem: Sendable {
    public var rowid: Int64
    /// 16 bytes (creation time, then random), fixed for the item's life (the persistent reference's id).
    public var ref: [UInt8]
    /// The accessibility class number (`ProtectionClass.rawValue`).
    public var protectionClass: UInt8
    public var accessGroupIndex: [UInt8]
    public var serviceIndex: [UInt8]
    public var accountIndex: [UInt8]
    /// Blind index of the uniqueness key; the UNIQUE constraint on it decides duplicates.
    public var uniqueIndex: [UInt8]
    public var wrappedKey: [UInt8]
    public var attributes: [UInt8]
    /// The sealed secret; empty when the row was read without it (`RowFilter.includeSecret == false`).
    public var secret: [UInt8]
    /// The item's Secret Service attribute-index entries (`item_attributes`), when the row was sealed
    /// here; nil for rows read from the database (an update then leaves the entries as they are).
    public var attributeIndexes: [[UInt8]]?

    public init(rowid: Int64 = 0, ref: [UInt8], protectionClass: UInt8, accessGroupIndex: [UInt8],
                serviceIndex: [UInt8], accountIndex: [UInt8], uniqueIndex: [UInt8], wrappedKey: [UInt8],
                attributes: [UInt8], secret: [UInt8], attributeIndexes: [[UInt8]]? = nil) {
        self.rowid = rowid
        self.ref = ref
        self.protectionClass = protectionClass
        self.accessGroupIndex = accessGroupIndex
        self.serviceIndex = serviceIndex
        self.accountIndex = accountIndex
        self.uniqueIndex = uniqueIndex
        self.wrappedKey = wrappedKey
        self.attributes = attributes
        self.secret = secret
        self.attributeIndexes = attributeIndexes
    }
}
