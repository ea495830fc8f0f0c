import KeychainCore
import KeychainSystem

/// Which rows to read: every non-nil field is an SQL condition (AND), evaluated on indexed columns
/// before any decryption. The item layer re-checks the decrypted attributes afterwards.
public struct RowFilter: Sendable, Hashable {
    public var ref: [UInt8]?
    /// `key_ix IN (…)`: point lookups through the UNIQUE index.
    public var uniqueIndexes: [[UInt8]]?
    public var serviceIndex: [UInt8]?
    public var accountIndex: [UInt8]?
    /// `agrp_ix IN (…)`; nil means every group (administrators).
    public var accessGroupIndexes: [[UInt8]]?
    /// `class IN (…)`; nil means every class.
    public var classes: [UInt8]?
    /// Read the sealed secret too.
    public var includeSecret: Bool

    public init(ref: [UInt8]? = nil, uniqueIndexes: [[UInt8]]? = nil, serviceIndex: [UInt8]? = nil,
                accountIndex: [UInt8]? = nil, accessGroupIndexes: [[UInt8]]? = nil, classes: [UInt8]? = nil,
                includeSecret: Bool = false) {
        self.ref = ref
        self.uniqueIndexes = uniqueIndexes
        self.serviceIndex = serviceIndex
        self.accountIndex = accountIndex
        self.accessGroupIndexes = accessGroupIndexes
        self.classes = classes
        self.includeSecret = includeSecret
    }

    /// The SQL for this filter's shape (values are bound, never spliced in). Equal shapes give equal
    /// text, so the connection's statement cache reuses the prepared statement.
    public var sql: String {
        let shape = Shape(ref: ref != nil, unique: uniqueIndexes?.count, service: serviceIndex != nil,
                          account: accountIndex != nil, groups: accessGroupIndexes?.count, classes: classes,
                          secret: includeSecret)
        if let cached = Self.sqlCache.withLock({ $0[shape] }) { return cached }
        let sql = buildSQL()
        Self.sqlCache.withLock { cache in
            if cache.count > 256 { cache.removeAll() }
            cache[shape] = sql
        }
        return sql
    }

    /// What the SQL text depends on: the filter's shape, not its values.
    private struct Shape: Hashable {
        var ref: Bool, unique: Int?, service: Bool, account: Bool, groups: Int?, classes: [UInt8]?, secret: Bool
    }

    private static let sqlCache = Locked<[Shape: String]>([:])

    private func buildSQL() -> String {
        var s = "SELECT rowid, ref, class, agrp_ix, svce_ix, acct_ix, key_ix, item_key, attributes"
        s += includeSecret ? ", secret" : ""
        s += " FROM items"
        var conditions: [String] = []
        if ref != nil { conditions.append("ref = ?") }
        if let u = uniqueIndexes { conditions.append("key_ix IN (\(Self.placeholders(u.count)))") }
        if serviceIndex != nil { conditions.append("svce_ix = ?") }
        if accountIndex != nil { conditions.append("acct_ix = ?") }
        if let g = accessGroupIndexes { conditions.append("agrp_ix IN (\(Self.placeholders(g.count)))") }
        if let c = classes { conditions.append("class IN (\(c.map { String($0) }.joined(separator: ",")))") }
        if !conditions.isEmpty { s += " WHERE " + conditions.joined(separator: " AND ") }
        return s + " ORDER BY rowid"
    }

    private static func placeholders(_ n: Int) -> String {
        n == 0 ? "NULL" : Array(repeating: "?", count: n).joined(separator: ",")
    }

    func bind(_ s: SQLiteStatement) throws(KeychainError) {
        var i: Int32 = 1
        func next(_ b: [UInt8]) throws(KeychainError) { try s.bind(i, b); i += 1 }
        if let ref { try next(ref) }
        if let u = uniqueIndexes { for b in u { try next(b) } }
        if let serviceIndex { try next(serviceIndex) }
        if let accountIndex { try next(accountIndex) }
        if let g = accessGroupIndexes { for b in g { try next(b) } }
    }
}
