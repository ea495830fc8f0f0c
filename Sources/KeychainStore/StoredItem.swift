/// One row of the `items` table, as bytes: digests, the sealed item key and sealed blobs.
/// Nothing here is readable without the keys; the item layer seals and opens.
public struct StoredItem: @unchecked Sendable {
    // Safety: its one stored property, `row`, is never written after it is made (a change makes a
    // new one), so rows shared between threads share constants. (ManagedBuffer cannot say so itself.)

    /// The eight blob columns, in the order they lie in a `Row`'s bytes.
    enum Column: Int, CaseIterable {
        case ref, accessGroupIndex, serviceIndex, accountIndex, uniqueIndex, wrappedKey, attributes, secret
    }

    /// What a `Row` holds besides the columns' bytes.
    @usableFromInline struct Header {
        var rowid: Int64
        var protectionClass: UInt8
        /// Where each column ends in the bytes (each starts where the one before ends).
        @usableFromInline var ends: (Int, Int, Int, Int, Int, Int, Int, Int)
        var attributeIndexes: [[UInt8]]?
        /// Read from SQLite without some columns (they are empty): such a row is for opening, never
        /// for writing or fingerprinting, which would record the missing columns as empty.
        var partial: Bool

        /// Where `column` ends in the bytes.
        func end(_ column: Column) -> Int {
            withUnsafeBytes(of: ends) {
                $0.load(fromByteOffset: column.rawValue * MemoryLayout<Int>.stride, as: Int.self)
            }
        }

        /// Where `column` starts in the bytes.
        func start(_ column: Column) -> Int {
            column == .ref ? 0 : end(Column(rawValue: column.rawValue - 1)!)
        }
    }

    /// The whole row in one allocation, immutable: its fields in the header, the eight blob columns
    /// one after another in the elements. A row read from SQLite was eight arrays and a box, nine
    /// allocations and nine frees for every row a `copy` reads. A row is copied several times on the
    /// read path (cache, visit, opened item): one reference counted, whatever its columns. A change
    /// makes a new row (rows are changed only on the write path).
    @usableFromInline final class Row: ManagedBuffer<Header, UInt8> {}

    /// The header's fields are read through its pointer: `Row.header` is a class's stored property,
    /// and each read of it costs the runtime's exclusivity check (the row is immutable anyway).
    @usableFromInline var row: Row

    private init(
        rowid: Int64, protectionClass: UInt8, attributeIndexes: [[UInt8]]?, partial: Bool, byteCount: Int,
        fill: (_ append: (UnsafeRawBufferPointer) -> Void) -> Void
    ) {
        let made = Row.create(minimumCapacity: byteCount) { _ in
            Header(
                rowid: rowid, protectionClass: protectionClass, ends: (0, 0, 0, 0, 0, 0, 0, 0),
                attributeIndexes: attributeIndexes, partial: partial)
        }
        row = unsafeDowncast(made, to: Row.self)
        row.withUnsafeMutablePointers { header, elements in
            withUnsafeMutableBytes(of: &header.pointee.ends) { ends in
                var at = 0
                var column = 0
                fill { bytes in
                    precondition(column < Column.allCases.count && at + bytes.count <= byteCount, "a row overflowed")
                    if let base = bytes.baseAddress, bytes.count > 0 {
                        (elements + at).update(from: base.assumingMemoryBound(to: UInt8.self), count: bytes.count)
                    } else if bytes.count > 0 {
                        // A column SQLite could not give (out of memory): zeros, which no box opens.
                        (elements + at).update(repeating: 0, count: bytes.count)
                    }
                    at += bytes.count
                    ends.storeBytes(of: at, toByteOffset: column * MemoryLayout<Int>.stride, as: Int.self)
                    column += 1
                }
                precondition(column == Column.allCases.count, "a row has eight blob columns")
            }
        }
    }

    private func column(_ column: Column) -> [UInt8] {
        withColumn(column) { Array($0) }
    }

    private func withColumn<R>(_ column: Column, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        row.withUnsafeMutablePointers { header, elements in
            let start = header.pointee.start(column)
            return body(UnsafeRawBufferPointer(start: elements + start, count: header.pointee.end(column) - start))
        }
    }

    /// A copy with one thing changed.
    private func changed(
        rowid: Int64? = nil, protectionClass: UInt8? = nil, column changed: Column? = nil, to bytes: [UInt8] = [],
        attributeIndexes: [[UInt8]]?? = nil
    ) -> StoredItem {
        let header = row.header
        let old = changed.map { header.end($0) - header.start($0) } ?? 0
        return StoredItem(
            rowid: rowid ?? header.rowid, protectionClass: protectionClass ?? header.protectionClass,
            attributeIndexes: attributeIndexes ?? header.attributeIndexes, partial: header.partial,
            byteCount: header.end(.secret) - old + bytes.count
        ) { append in
            for column in Column.allCases {
                if column == changed { bytes.withUnsafeBytes(append) } else { withColumn(column, append) }
            }
        }
    }

    /// The SQLite rowid: 0 for a row not yet inserted; changes on restore, unlike `ref`.
    public var rowid: Int64 {
        get { row.withUnsafeMutablePointerToHeader { $0.pointee.rowid } }
        set { self = changed(rowid: newValue) }
    }
    /// 16 bytes (creation time, then random), fixed for the item's life (the persistent reference's id).
    public var ref: [UInt8] {
        get { column(.ref) }
        set { self = changed(column: .ref, to: newValue) }
    }
    /// The accessibility class number (`ProtectionClass.rawValue`).
    public var protectionClass: UInt8 {
        get { row.withUnsafeMutablePointerToHeader { $0.pointee.protectionClass } }
        set { self = changed(protectionClass: newValue) }
    }
    /// Blind index (keyed digest) of the access group: matches a group without revealing its name.
    /// Empty, like the service's and the account's, when the row was read without them
    /// (`RowFilter.includeSearchIndexes == false`).
    public var accessGroupIndex: [UInt8] {
        get { column(.accessGroupIndex) }
        set { self = changed(column: .accessGroupIndex, to: newValue) }
    }
    /// Blind index (keyed digest) of the service: matches `kSecAttrService` without revealing it.
    public var serviceIndex: [UInt8] {
        get { column(.serviceIndex) }
        set { self = changed(column: .serviceIndex, to: newValue) }
    }
    /// Blind index (keyed digest) of the account: matches `kSecAttrAccount` without revealing it.
    public var accountIndex: [UInt8] {
        get { column(.accountIndex) }
        set { self = changed(column: .accountIndex, to: newValue) }
    }
    /// Blind index of the uniqueness key; the UNIQUE constraint on it decides duplicates.
    public var uniqueIndex: [UInt8] {
        get { column(.uniqueIndex) }
        set { self = changed(column: .uniqueIndex, to: newValue) }
    }
    /// The item's random key, sealed by its class key.
    public var wrappedKey: [UInt8] {
        get { column(.wrappedKey) }
        set { self = changed(column: .wrappedKey, to: newValue) }
    }
    /// The CBOR map of every attribute, sealed by the item key; empty when the row was read without
    /// it (`RowFilter.includeAttributes == false`).
    public var attributes: [UInt8] {
        get { column(.attributes) }
        set { self = changed(column: .attributes, to: newValue) }
    }
    /// The sealed secret; empty when the row was read without it (`RowFilter.includeSecret == false`).
    public var secret: [UInt8] {
        get { column(.secret) }
        set { self = changed(column: .secret, to: newValue) }
    }
    /// The item's Secret Service attribute-index entries (`item_attributes`), when the row was sealed
    /// here; nil for rows read from the database (an update then leaves the entries as they are).
    public var attributeIndexes: [[UInt8]]? {
        get { row.header.attributeIndexes }
        set { self = changed(attributeIndexes: .some(newValue)) }
    }

    /// Read without some of its columns (`RowFilter.includeSearchIndexes`, `includeAttributes`,
    /// `includeSecret`): for opening only; the store refuses to write it.
    public var isPartial: Bool { row.withUnsafeMutablePointerToHeader { $0.pointee.partial } }

    /// The columns an open reads, in place: valid only inside `withSealedColumns`.
    public struct SealedColumns {
        /// The `ref` column.
        public let ref: UnsafeRawBufferPointer
        /// The `uniqueIndex` column.
        public let uniqueIndex: UnsafeRawBufferPointer
        /// The `wrappedKey` column.
        public let wrappedKey: UnsafeRawBufferPointer
        /// The `attributes` column.
        public let attributes: UnsafeRawBufferPointer
        /// The `secret` column.
        public let secret: UnsafeRawBufferPointer

        @usableFromInline init(
            ref: UnsafeRawBufferPointer, uniqueIndex: UnsafeRawBufferPointer, wrappedKey: UnsafeRawBufferPointer,
            attributes: UnsafeRawBufferPointer, secret: UnsafeRawBufferPointer
        ) {
            self.ref = ref
            self.uniqueIndex = uniqueIndex
            self.wrappedKey = wrappedKey
            self.attributes = attributes
            self.secret = secret
        }
    }

    /// Runs `body` with the columns an open reads, without copying them (the getters copy: every
    /// row a read finds is opened, and five arrays per row cost more than the opening around them).
    /// Inlinable, so the opening code that calls it is specialised with it.
    @inlinable
    public func withSealedColumns<R, E: Error>(_ body: (SealedColumns) throws(E) -> R) throws(E) -> R {
        try row.withUnsafeMutablePointers { (header, elements) throws(E) -> R in
            // The ends one by one, in `Column`'s order (ref, three search digests, unique, key, attributes, secret).
            let e = header.pointee.ends
            func bytes(_ start: Int, _ end: Int) -> UnsafeRawBufferPointer {
                UnsafeRawBufferPointer(start: elements + start, count: end - start)
            }
            return try body(
                SealedColumns(
                    ref: bytes(0, e.0), uniqueIndex: bytes(e.3, e.4), wrappedKey: bytes(e.4, e.5),
                    attributes: bytes(e.5, e.6), secret: bytes(e.6, e.7)))
        }
    }

    /// A row from its columns, all already digested or sealed; `rowid` 0 for a row not yet inserted.
    public init(
        rowid: Int64 = 0, ref: [UInt8], protectionClass: UInt8, accessGroupIndex: [UInt8],
        serviceIndex: [UInt8], accountIndex: [UInt8], uniqueIndex: [UInt8], wrappedKey: [UInt8],
        attributes: [UInt8], secret: [UInt8], attributeIndexes: [[UInt8]]? = nil
    ) {
        let columns = [ref, accessGroupIndex, serviceIndex, accountIndex, uniqueIndex, wrappedKey, attributes, secret]
        self.init(
            rowid: rowid, protectionClass: protectionClass, attributeIndexes: attributeIndexes, partial: false,
            byteCount: columns.reduce(0) { $0 + $1.count }
        ) { append in
            for column in columns { column.withUnsafeBytes(append) }
        }
    }

    /// A row read from SQLite: `columns` hands `append` the eight blob columns' bytes in place, in
    /// the order of the public initializer's (one not read as empty), `byteCount` in all: each is
    /// copied once, into the row. `partial` when some were not read.
    init(
        rowid: Int64, protectionClass: UInt8, partial: Bool, byteCount: Int,
        columns: (_ append: (UnsafeRawBufferPointer) -> Void) -> Void
    ) {
        self.init(
            rowid: rowid, protectionClass: protectionClass, attributeIndexes: nil, partial: partial,
            byteCount: byteCount, fill: columns)
    }
}
