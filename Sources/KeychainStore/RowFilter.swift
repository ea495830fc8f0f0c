import KeychainCore
import KeychainSystem

/// Which rows to read: every non-nil field is an SQL condition (AND), evaluated on indexed columns
/// before any decryption. The item layer re-checks the decrypted attributes afterwards.
public struct RowFilter: Sendable, Hashable {
    /// `ref = ?`: the one item with this persistent reference id.
    public var ref: [UInt8]?
    /// `key_ix IN (…)`: point lookups through the UNIQUE index.
    public var uniqueIndexes: [[UInt8]]?
    /// `svce_ix = ?`: items whose service has this blind index.
    public var serviceIndex: [UInt8]?
    /// `acct_ix = ?`: items whose account has this blind index.
    public var accountIndex: [UInt8]?
    /// `agrp_ix IN (…)`; nil means every group (administrators).
    public var accessGroupIndexes: [[UInt8]]?
    /// `class IN (…)`; nil means every class.
    public var classes: [UInt8]?
    /// Only items with every one of these attribute-index entries (`item_attributes`).
    public var requiredAttributeIndexes: [[UInt8]]?
    /// Only items without this attribute-index entry.
    public var excludedAttributeIndex: [UInt8]?
    /// Read the sealed secret too.
    public var includeSecret: Bool
    /// Read the three search digests (`agrp_ix`, `svce_ix`, `acct_ix`) into the rows; without, they
    /// are empty. Each blob column costs SQLite an allocation and the row an array, and the item
    /// calls (copy, update, delete) never look at these: they check the opened attributes, and writes
    /// compute the digests afresh. Rows kept by the point-lookup cache always have them.
    public var includeSearchIndexes: Bool
    /// Read the sealed attributes; without, the rows' are empty. A copy that opens no attributes (a
    /// point lookup asking for the secret or the reference only) needs the item key and the secret
    /// alone. Rows kept by the point-lookup cache always have them.
    public var includeAttributes: Bool

    /// A filter with the given conditions; with none it matches every row, without reading secrets.
    public init(
        ref: [UInt8]? = nil, uniqueIndexes: [[UInt8]]? = nil, serviceIndex: [UInt8]? = nil,
        accountIndex: [UInt8]? = nil, accessGroupIndexes: [[UInt8]]? = nil, classes: [UInt8]? = nil,
        requiredAttributeIndexes: [[UInt8]]? = nil, excludedAttributeIndex: [UInt8]? = nil,
        includeSecret: Bool = false, includeSearchIndexes: Bool = true, includeAttributes: Bool = true
    ) {
        self.ref = ref
        self.uniqueIndexes = uniqueIndexes
        self.serviceIndex = serviceIndex
        self.accountIndex = accountIndex
        self.accessGroupIndexes = accessGroupIndexes
        self.classes = classes
        self.requiredAttributeIndexes = requiredAttributeIndexes
        self.excludedAttributeIndex = excludedAttributeIndex
        self.includeSecret = includeSecret
        self.includeSearchIndexes = includeSearchIndexes
        self.includeAttributes = includeAttributes
    }

    /// The SQL for this filter's shape (values are bound, never spliced in). Equal shapes give equal
    /// text, so the connection's statement cache reuses the prepared statement.
    public var sql: String {
        if let point = pointLookupSQL { return point }
        let shape = Shape(
            ref: ref != nil, unique: uniqueIndexes?.count, service: serviceIndex != nil,
            account: accountIndex != nil, groups: accessGroupIndexes?.count, classes: classes,
            required: requiredAttributeIndexes?.count, excluded: excludedAttributeIndex != nil,
            secret: includeSecret, searchIndexes: includeSearchIndexes, attributes: includeAttributes)
        if let cached = Self.sqlCache.withLock({ $0[shape] }) { return cached }
        let sql = buildSQL()
        Self.sqlCache.withLock { cache in
            if cache.count > 256 { cache.removeAll() }
            cache[shape] = sql
        }
        return sql
    }

    /// The SQL of the commonest shape, a point lookup by one to four uniqueness digests and nothing
    /// else (a copy by service and account): made once, read without the shape cache's lock.
    private var pointLookupSQL: String? {
        guard let u = uniqueIndexes, (1...Self.pointLookupShapes).contains(u.count), ref == nil,
            serviceIndex == nil, accountIndex == nil, accessGroupIndexes == nil, classes == nil,
            requiredAttributeIndexes == nil, excludedAttributeIndex == nil
        else { return nil }
        return Self.pointLookups[Self.variant(includeSecret, includeSearchIndexes, includeAttributes)][u.count - 1]
    }

    private static let pointLookupShapes = 4
    /// Each combination of the optional columns (`variant`), then each number of digests.
    private static let pointLookups = (0..<8).map { variant in
        (1...pointLookupShapes).map {
            RowFilter(
                uniqueIndexes: Array(repeating: [], count: $0), includeSecret: variant & 4 != 0,
                includeSearchIndexes: variant & 2 != 0, includeAttributes: variant & 1 != 0
            ).buildSQL()
        }
    }

    private static func variant(_ secret: Bool, _ searchIndexes: Bool, _ attributes: Bool) -> Int {
        (secret ? 4 : 0) + (searchIndexes ? 2 : 0) + (attributes ? 1 : 0)
    }

    /// What the SQL text depends on: the filter's shape, not its values.
    private struct Shape: Hashable {
        var ref: Bool, unique: Int?, service: Bool, account: Bool, groups: Int?, classes: [UInt8]?
        var required: Int?, excluded: Bool, secret: Bool, searchIndexes: Bool, attributes: Bool
    }

    private static let sqlCache = Locked<[Shape: String]>([:])

    private func buildSQL() -> String {
        // With attribute-index entries to match, the index drives the query (its primary key is
        // (ix, ref), so rows come in ref order: creation order) and each further entry is a lookup
        // by that key; no temporary b-tree, no sort.
        let joined = requiredAttributeIndexes.map { !$0.isEmpty } ?? false
        let t = joined ? "items." : ""
        // The columns in the order `columns` says.
        let c = columns
        var s = "SELECT \(t)rowid, \(t)ref, \(t)class, \(t)item_key"
        s += c.uniqueIndex != nil ? ", \(t)key_ix" : ""
        s += c.attributes != nil ? ", \(t)attributes" : ""
        s += c.searchIndexes != nil ? ", \(t)agrp_ix, \(t)svce_ix, \(t)acct_ix" : ""
        s += c.secret != nil ? ", \(t)secret" : ""
        s += joined ? " FROM item_attributes AS a CROSS JOIN items ON items.ref = a.ref" : " FROM items"
        // Searched through the (group, service, account) index, the rows come in the index's order,
        // and ORDER BY rowid would sort whole rows — the sealed secret of every match — before the
        // first came back: an app's 300 items of 1 MB took 180 MB and most of a second even for
        // m_Limit 1, and past the answer budget, which counts rows as they come. So those shapes
        // pick the matching rowids first (from the index alone) and read the rows one by one in
        // rowid order. A lookup by reference or uniqueness digests finds a handful of rows at most.
        let rowidsFirst =
            !joined && ref == nil && uniqueIndexes == nil
            && (serviceIndex != nil || accountIndex != nil || accessGroupIndexes != nil)
        if rowidsFirst { s += " WHERE rowid IN (SELECT rowid FROM items" }
        var conditions: [String] = []
        if ref != nil { conditions.append("\(t)ref = ?") }
        if let u = uniqueIndexes { conditions.append("\(t)key_ix IN (\(Self.placeholders(u.count)))") }
        if serviceIndex != nil { conditions.append("\(t)svce_ix = ?") }
        if accountIndex != nil { conditions.append("\(t)acct_ix = ?") }
        if let g = accessGroupIndexes { conditions.append("\(t)agrp_ix IN (\(Self.placeholders(g.count)))") }
        if let r = requiredAttributeIndexes, !r.isEmpty {
            conditions.append("a.ix = ?")
            for _ in r.dropFirst() {
                conditions.append("EXISTS (SELECT 1 FROM item_attributes WHERE ix = ? AND ref = items.ref)")
            }
        }
        if excludedAttributeIndex != nil {
            conditions.append("NOT EXISTS (SELECT 1 FROM item_attributes WHERE ix = ? AND ref = items.ref)")
        }
        if let c = classes { conditions.append("\(t)class IN (\(c.map { String($0) }.joined(separator: ",")))") }
        if !conditions.isEmpty { s += " WHERE " + conditions.joined(separator: " AND ") }
        if rowidsFirst { s += ")" }
        return joined ? s : s + " ORDER BY rowid"
    }

    /// Where `sql`'s columns are: rowid, ref, class and item_key, then those of the others it selects,
    /// in this order; nil for one it does not.
    struct Columns {
        static let rowid: Int32 = 0, ref: Int32 = 1, protectionClass: Int32 = 2, wrappedKey: Int32 = 3
        /// `key_ix`: not selected by a lookup by one uniqueness digest, whose rows' key_ix is that
        /// digest (the WHERE clause says so, byte for byte), so the row takes it from the filter.
        var uniqueIndex: Int32?
        var attributes: Int32?
        /// The first search digest (agrp_ix, then svce_ix and acct_ix).
        var searchIndexes: Int32?
        var secret: Int32?
    }

    /// Where this filter's `sql` puts each column.
    var columns: Columns {
        var c = Columns()
        var next: Int32 = 4
        func take(_ count: Int32 = 1) -> Int32 {
            defer { next += count }
            return next
        }
        if uniqueIndexes?.count != 1 { c.uniqueIndex = take() }
        if includeAttributes { c.attributes = take() }
        if includeSearchIndexes { c.searchIndexes = take(3) }
        if includeSecret { c.secret = take() }
        return c
    }

    private static func placeholders(_ n: Int) -> String {
        n == 0 ? "NULL" : Array(repeating: "?", count: n).joined(separator: ",")
    }

    func bind(_ s: SQLiteStatement) throws(KeychainError) {
        try bind(s, uniqueIndexes: nil)
    }

    /// Binds the filter's values, with `digests` (when given: as many digests as `uniqueIndexes`
    /// holds, each `Digests.length` bytes) in place of `uniqueIndexes`. Those are bound without a
    /// copy: they must stay valid until the statement is reset (`withStatement` resets it before it
    /// returns).
    func bind(_ s: SQLiteStatement, uniqueIndexes digests: Digests?) throws(KeychainError) {
        var i: Int32 = 1
        func next(_ b: [UInt8]) throws(KeychainError) {
            try s.bind(i, b)
            i += 1
        }
        if let ref { try next(ref) }
        if let digests {
            for k in 0..<digests.count {
                try s.bind(i, borrowing: digests[k])
                i += 1
            }
        } else if let u = uniqueIndexes {
            for b in u { try next(b) }
        }
        if let serviceIndex { try next(serviceIndex) }
        if let accountIndex { try next(accountIndex) }
        if let g = accessGroupIndexes { for b in g { try next(b) } }
        if let r = requiredAttributeIndexes { for b in r { try next(b) } }
        if let excludedAttributeIndex { try next(excludedAttributeIndex) }
    }
}

/// Uniqueness digests laid end to end in one buffer, `length` bytes each: a point lookup's
/// `uniqueIndexes` without an array per digest (StoreReader.forEach(_:uniqueIndexes:_:)).
public struct Digests {
    /// The length of each digest: a uniqueness digest's.
    public static let length = 32
    /// The digests, end to end.
    public let bytes: UnsafeRawBufferPointer

    /// `bytes` as digests of `length` bytes each (its count a multiple of that).
    public init(_ bytes: UnsafeRawBufferPointer) {
        precondition(bytes.count % Self.length == 0, "not a whole number of digests")
        self.bytes = bytes
    }

    /// How many digests there are.
    public var count: Int { bytes.count / Self.length }

    /// Digest `i`.
    public subscript(i: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(rebasing: bytes[i * Self.length..<(i + 1) * Self.length])
    }

    /// Each digest as an array (the point-lookup cache keys rows by them).
    var arrays: [[UInt8]] { (0..<count).map { Array(self[$0]) } }
}
