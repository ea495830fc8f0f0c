/// One row of the `items` table, as bytes: digests, the sealed item key and sealed blobs.
/// Nothing here is readable without the keys; the item layer seals and opens.
public struct StoredItem: Sendable {
    /// The columns, in one immutable object: a row is copied several times on the read path (cache,
    /// visit, opened item), and copying a reference is one retain where copying eleven fields was one
    /// per array. A change makes a new object (rows are changed only on the write path).
    private struct Columns: Sendable {
        var rowid: Int64
        var ref: [UInt8]
        var protectionClass: UInt8
        var accessGroupIndex: [UInt8]
        var serviceIndex: [UInt8]
        var accountIndex: [UInt8]
        var uniqueIndex: [UInt8]
        var wrappedKey: [UInt8]
        var attributes: [UInt8]
        var secret: [UInt8]
        var attributeIndexes: [[UInt8]]?
    }

    private final class Box: Sendable {
        let columns: Columns
        init(_ columns: Columns) { self.columns = columns }
    }

    private var box: Box

    private mutating func change(_ body: (inout Columns) -> Void) {
        var c = box.columns
        body(&c)
        box = Box(c)
    }

    /// The SQLite rowid: 0 for a row not yet inserted; changes on restore, unlike `ref`.
    public var rowid: Int64 {
        get { box.columns.rowid }
        set { change { $0.rowid = newValue } }
    }
    /// 16 bytes (creation time, then random), fixed for the item's life (the persistent reference's id).
    public var ref: [UInt8] {
        get { box.columns.ref }
        set { change { $0.ref = newValue } }
    }
    /// The accessibility class number (`ProtectionClass.rawValue`).
    public var protectionClass: UInt8 {
        get { box.columns.protectionClass }
        set { change { $0.protectionClass = newValue } }
    }
    /// Blind index (keyed digest) of the access group: matches a group without revealing its name.
    /// Empty, like the service's and the account's, when the row was read without them
    /// (`RowFilter.includeSearchIndexes == false`).
    public var accessGroupIndex: [UInt8] {
        get { box.columns.accessGroupIndex }
        set { change { $0.accessGroupIndex = newValue } }
    }
    /// Blind index (keyed digest) of the service: matches `kSecAttrService` without revealing it.
    public var serviceIndex: [UInt8] {
        get { box.columns.serviceIndex }
        set { change { $0.serviceIndex = newValue } }
    }
    /// Blind index (keyed digest) of the account: matches `kSecAttrAccount` without revealing it.
    public var accountIndex: [UInt8] {
        get { box.columns.accountIndex }
        set { change { $0.accountIndex = newValue } }
    }
    /// Blind index of the uniqueness key; the UNIQUE constraint on it decides duplicates.
    public var uniqueIndex: [UInt8] {
        get { box.columns.uniqueIndex }
        set { change { $0.uniqueIndex = newValue } }
    }
    /// The item's random key, sealed by its class key.
    public var wrappedKey: [UInt8] {
        get { box.columns.wrappedKey }
        set { change { $0.wrappedKey = newValue } }
    }
    /// The CBOR map of every attribute, sealed by the item key.
    public var attributes: [UInt8] {
        get { box.columns.attributes }
        set { change { $0.attributes = newValue } }
    }
    /// The sealed secret; empty when the row was read without it (`RowFilter.includeSecret == false`).
    public var secret: [UInt8] {
        get { box.columns.secret }
        set { change { $0.secret = newValue } }
    }
    /// The item's Secret Service attribute-index entries (`item_attributes`), when the row was sealed
    /// here; nil for rows read from the database (an update then leaves the entries as they are).
    public var attributeIndexes: [[UInt8]]? {
        get { box.columns.attributeIndexes }
        set { change { $0.attributeIndexes = newValue } }
    }

    /// A row from its columns, all already digested or sealed; `rowid` 0 for a row not yet inserted.
    public init(
        rowid: Int64 = 0, ref: [UInt8], protectionClass: UInt8, accessGroupIndex: [UInt8],
        serviceIndex: [UInt8], accountIndex: [UInt8], uniqueIndex: [UInt8], wrappedKey: [UInt8],
        attributes: [UInt8], secret: [UInt8], attributeIndexes: [[UInt8]]? = nil
    ) {
        box = Box(
            Columns(
                rowid: rowid, ref: ref, protectionClass: protectionClass, accessGroupIndex: accessGroupIndex,
                serviceIndex: serviceIndex, accountIndex: accountIndex, uniqueIndex: uniqueIndex,
                wrappedKey: wrappedKey, attributes: attributes, secret: secret, attributeIndexes: attributeIndexes))
    }
}
