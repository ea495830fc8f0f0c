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

    /// A filter with the given conditions; with none it matches every row, without reading secrets.
    public init(
        ref: [UInt8]? = nil, uniqueIndexes: [[UInt8]]? = nil, serviceIndex: [UInt8]? = nil,
        accountIndex: [UInt8]? = nil, accessGroupIndexes: [[UInt8]]? = nil, classes: [UInt8]? = nil,
        requiredAttributeIndexes: [[UInt8]]? = nil, excludedAttributeIndex: [UInt8]? = nil,
        includeSecret: Bool = false, includeSearchIndexes: Bool = true
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
    }

    /// The SQL for this filter's shape (values are bound, never spliced in). Equal shapes give equal
    /// text, so the connection's statement cache reuses the prepared statement.
    public var sql: String {
        if let point = pointLookupSQL { return point }
        let shape = Shape(
            ref: ref != nil, unique: uniqueIndexes?.count, service: serviceIndex != nil,
            account: accountIndex != nil, groups: accessGroupIndexes?.count, classes: classes,
            required: requiredAttributeIndexes?.count, excluded: excludedAttributeIndex != nil,
            secret: includeSecret, searchIndexes: includeSearchIndexes)
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
        return Self.pointLookups[(includeSecret ? 2 : 0) + (includeSearchIndexes ? 1 : 0)][u.count - 1]
    }

    private static let pointLookupShapes = 4
    /// Without and with the search digests, then the same with the secret.
    private static let pointLookups = [(false, false), (false, true), (true, false), (true, true)].map {
        (secret, searchIndexes) in
        (1...pointLookupShapes).map {
            RowFilter(
                uniqueIndexes: Array(repeating: [], count: $0), includeSecret: secret,
                includeSearchIndexes: searchIndexes
            ).buildSQL()
        }
    }

    /// What the SQL text depends on: the filter's shape, not its values.
    private struct Shape: Hashable {
        var ref: Bool, unique: Int?, service: Bool, account: Bool, groups: Int?, classes: [UInt8]?
        var required: Int?, excluded: Bool, secret: Bool, searchIndexes: Bool
    }

    private static let sqlCache = Locked<[Shape: String]>([:])

    private func buildSQL() -> String {
        // With attribute-index entries to match, the index drives the query (its primary key is
        // (ix, ref), so rows come in ref order: creation order) and each further entry is a lookup
        // by that key; no temporary b-tree, no sort.
        let joined = requiredAttributeIndexes.map { !$0.isEmpty } ?? false
        let t = joined ? "items." : ""
        // The columns in the order `StoreReader` reads them (`Columns`).
        var s = "SELECT \(t)rowid, \(t)ref, \(t)class, \(t)key_ix, \(t)item_key, \(t)attributes"
        s += includeSearchIndexes ? ", \(t)agrp_ix, \(t)svce_ix, \(t)acct_ix" : ""
        s += includeSecret ? ", \(t)secret" : ""
        s += joined ? " FROM item_attributes AS a CROSS JOIN items ON items.ref = a.ref" : " FROM items"
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
        return joined ? s : s + " ORDER BY rowid"
    }

    /// Where `sql`'s columns are: the six every row has, then the optional ones in this order.
    enum Columns {
        static let rowid: Int32 = 0, ref: Int32 = 1, protectionClass: Int32 = 2, uniqueIndex: Int32 = 3
        static let wrappedKey: Int32 = 4, attributes: Int32 = 5
        /// The first search digest (agrp_ix, then svce_ix and acct_ix), when `includeSearchIndexes`.
        static let searchIndexes: Int32 = 6
        /// The secret's column, when `includeSecret`.
        static func secret(_ filter: RowFilter) -> Int32 { filter.includeSearchIndexes ? 9 : 6 }
    }

    private static func placeholders(_ n: Int) -> String {
        n == 0 ? "NULL" : Array(repeating: "?", count: n).joined(separator: ",")
    }

    func bind(_ s: SQLiteStatement) throws(KeychainError) {
        var i: Int32 = 1
        func next(_ b: [UInt8]) throws(KeychainError) {
            try s.bind(i, b)
            i += 1
        }
        if let ref { try next(ref) }
        if let u = uniqueIndexes { for b in u { try next(b) } }
        if let serviceIndex { try next(serviceIndex) }
        if let accountIndex { try next(accountIndex) }
        if let g = accessGroupIndexes { for b in g { try next(b) } }
        if let r = requiredAttributeIndexes { for b in r { try next(b) } }
        if let excludedAttributeIndex { try next(excludedAttributeIndex) }
    }
}
