import KeychainCore
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainItems

/// A key-only point lookup compiled once and run for other services and accounts of its template
/// (`ItemService.copy(_:service:account:)`, what a connection's memo does with a template) answers
/// every query exactly as the full path answers it: found or not, in the caller's groups or not,
/// synchronizable or not, of the named class or not, with the point-lookup cache on or off.
@Suite("Copy in place")
struct CopyInPlaceTests {
    /// Outcome of a call, comparable: the value, or the error's status and message.
    enum Answer: Equatable {
        case value(Value?)
        case error(Status, String)

        init(_ body: () throws(KeychainError) -> Value?) {
            do { self = .value(try body()) } catch { self = .error(error.status, error.message) }
        }

        /// The answer of a call that opens the data where it is told (`ItemService.withData`) as
        /// the value `copy` would return for it. A call that places nothing, or places twice, is
        /// recorded as an issue; room not filled exactly shows as another value (it starts as 0xA5
        /// bytes).
        init(lent body: (ItemService.DataPlacement) throws(KeychainError) -> Void) {
            var lent: [SecretBytes] = []
            var placed = 0
            do {
                try body { (count, open) throws(KeychainError) in
                    placed += 1
                    var room = SecretBytes([UInt8](repeating: 0xA5, count: count))
                    try room.withUnsafeMutableBytes(open)
                    lent.append(room)
                }
            } catch {
                #expect(lent.isEmpty, "data opened before an error")
                #expect(placed <= 1, "data placed \(placed) times")
                self = .error(error.status, error.message)
                return
            }
            #expect(lent.count == 1, "data placed \(lent.count) times")
            self = .value(lent.first.map { .secret($0) })
        }
    }

    static let pairs: [(String, String)] = [
        ("s0", "a0"), ("com.example.a-service-name-longer-than-a-small-string", "a1"), ("s2", "ünïcödé"),
        ("s3", String(repeating: "x", count: 300)), ("", "a4"), ("s5", "a5"), ("s6", "a6"), ("s7", "a7"),
        // Mixed pairs (not stored) and one that names nothing.
        ("s0", "a1"), ("s2", "a0"), ("nothing", "here"),
    ]

    @Test("answers as the full path", arguments: [0, PointLookupCache.defaultCapacity])
    func answersAsTheFullPath(lookupCacheEntries: Int) throws {
        let temporary = try TemporaryDirectory(prefix: "kc-in-place")
        defer { temporary.remove() }
        let service = try ItemService(directory: temporary.appending("data"), lookupCacheEntries: lookupCacheEntries)
        defer { service.close() }
        // One item per pair, in the caller's two groups, another app's group, synchronizable or not,
        // of two classes.
        for (i, (svce, acct)) in Self.pairs.prefix(8).enumerated() {
            var extra: [String: Value] = [:]
            if i == 1 || i == 4 { extra["agrp"] = .text("TEAM.shared") }
            if i == 2 { extra["pdmn"] = .text("ck") }
            if i == 5 { extra["sync"] = .bool(true) }
            let caller = i == 6 ? Fixture.other : Fixture.app
            _ = try service.add(item(svce, acct, secret: "d\(i)", extra), caller: caller)
        }
        // s7/a7 also in TEAM.shared (a second item of the same service and account).
        _ = try service.add(item("s7", "a7", secret: "shared", ["agrp": .text("TEAM.shared")]), caller: Fixture.app)
        let shapes: [(Caller, [String: Value])] = [
            (Fixture.app, ["r_Data": .bool(true)]),
            (Fixture.app, ["r_PersistentRef": .bool(true)]),
            (Fixture.app, ["r_Data": .bool(true), "r_PersistentRef": .bool(true)]),
            (Fixture.app, ["r_Data": .bool(true), "sync": .text("syna")]),
            (Fixture.app, ["r_Data": .bool(true), "sync": .bool(true)]),
            (Fixture.app, ["r_Data": .bool(true), "agrp": .text("TEAM.shared")]),
            (Fixture.app, ["r_Data": .bool(true), "pdmn": .text("ck")]),
            (Fixture.app, ["r_Data": .bool(true), "m_Limit": .text("m_LimitAll")]),
            (Fixture.app, ["r_Data": .bool(true), "m_Limit": .text("m_LimitAll"), "sync": .text("syna")]),
            (Fixture.other, ["r_Data": .bool(true)]),
            // An administrator naming an app's group: reading its secrets is refused (no presence
            // needed without a passphrase, so it is allowed here), the same either way.
            (Fixture.admin, ["r_Data": .bool(true), "agrp": .text("TEAM.app")]),
            (Fixture.admin, ["r_PersistentRef": .bool(true), "agrp": .text("TEAM.shared")]),
        ]
        var found = 0
        var lentCount = 0
        for (caller, shape) in shapes {
            let base = try service.compileCopy(query("base", "base", shape), caller: caller)
            #expect(service.copiesInPlace(base), "\(shape)")
            for (svce, acct) in Self.pairs {
                let full = Answer { () throws(KeychainError) in
                    try service.copyMatching(query(svce, acct, shape), caller: caller)
                }
                let inPlace = Array(svce.utf8).withUnsafeBytes { s in
                    Array(acct.utf8).withUnsafeBytes { a in
                        Answer { () throws(KeychainError) in try service.copy(base, service: s, account: a) }
                    }
                }
                #expect(inPlace == full, "\(shape) \(svce)/\(acct)")
                if case .value(let v) = full, v != nil { found += 1 }
                // A copy of one item's data alone is also lent where it was opened, in place and
                // from a compiled query of the same values (what a connection frames from).
                guard service.lendsData(base) else { continue }
                let lent = Array(svce.utf8).withUnsafeBytes { s in
                    Array(acct.utf8).withUnsafeBytes { a in
                        Answer(lent: { (data) throws(KeychainError) in
                            try service.withData(of: base, service: s, account: a, into: data)
                        })
                    }
                }
                #expect(lent == full, "lent in place: \(shape) \(svce)/\(acct)")
                let compiled = try service.compileCopy(query(svce, acct, shape), caller: caller)
                let lentCompiled = Answer(lent: { (data) throws(KeychainError) in
                    try service.withData(of: compiled, into: data)
                })
                #expect(lentCompiled == full, "lent compiled: \(shape) \(svce)/\(acct)")
                lentCount += 1
            }
        }
        #expect(found > 20, "too few queries found an item to compare anything")
        #expect(lentCount > 20, "too few queries lent their data to compare anything")
    }

    @Test("only a key-only copy of one item's data alone is lent where it is opened")
    func onlyOneItemsDataIsLent() throws {
        try withKeychain { fx in
            let s = fx.service
            func lends(_ extra: [String: Value], _ caller: Caller = Fixture.app) throws -> Bool {
                s.lendsData(try s.compileCopy(query("s", "a", extra), caller: caller))
            }
            for extra: [String: Value] in [["r_Data": .bool(true)], ["r_Data": .bool(true), "m_Limit": .int(1)]] {
                let lent = try lends(extra)
                #expect(lent, "\(extra)")
            }
            for extra: [String: Value] in [
                ["r_PersistentRef": .bool(true)], ["r_Data": .bool(true), "r_PersistentRef": .bool(true)],
                ["r_Data": .bool(true), "m_Limit": .text("m_LimitAll")], ["r_Data": .bool(true), "m_Limit": .int(2)],
                ["r_Data": .bool(true), "r_Attributes": .bool(true)], ["r_Data": .bool(true), "labl": .text("l")],
            ] {
                let lent = try lends(extra)
                #expect(!lent, "\(extra)")
            }
            // An administrator without presence has its reach checked after the open: its copies
            // take the full path. With presence (no passphrase set, or one given) nothing is checked.
            var absent = Fixture.admin
            absent.hasPresence = false
            let withoutPresence = try lends(["r_Data": .bool(true), "agrp": .text("TEAM.app")], absent)
            #expect(!withoutPresence)
            let withPresence = try lends(["r_Data": .bool(true), "agrp": .text("TEAM.app")], Fixture.admin)
            #expect(withPresence)
        }
    }

    @Test("only a key-only point lookup is run in place")
    func onlyKeyOnlyPointLookups() throws {
        try withKeychain { fx in
            let app = Fixture.app
            let s = fx.service
            #expect(s.copiesInPlace(try s.compileCopy(query("s", "a", ["r_Data": .bool(true)]), caller: app)))
            // Attributes to return, or filters besides the key: opened and matched in full.
            for extra: [String: Value] in [
                ["r_Attributes": .bool(true)], ["labl": .text("l")], ["r_Data": .bool(true), "gena": .bytes([1])],
            ] {
                #expect(!s.copiesInPlace(try s.compileCopy(query("s", "a", extra), caller: app)), "\(extra)")
            }
            // No point lookup: no scope (an administrator's whole keychain), or no account.
            #expect(
                !s.copiesInPlace(try s.compileCopy(query("s", "a", ["r_Data": .bool(true)]), caller: Fixture.admin)))
            var noAccount = query("s", "a", ["r_Data": .bool(true)])
            noAccount["acct"] = nil
            #expect(!s.copiesInPlace(try s.compileCopy(noAccount, caller: app)))
            // And the call refuses any other.
            let other = try s.compileCopy(query("s", "a", ["r_Attributes": .bool(true)]), caller: app)
            let refused = Array("s".utf8).withUnsafeBytes { b in
                Answer { () throws(KeychainError) in try s.copy(other, service: b, account: b) }
            }
            guard case .error(let status, _) = refused else {
                Issue.record("a copy with attribute filters was run in place")
                return
            }
            #expect(status == .internal)
        }
    }

    /// The columns a key-only copy opens in place come straight from SQLite when the lookup cache is
    /// off: a damaged or moved column must be refused there exactly as through a row.
    @Test(
        "a damaged or moved row is refused in place as on the full path",
        arguments: [
            "UPDATE items SET secret = (SELECT secret FROM items WHERE rowid = 2) WHERE rowid = 1",
            "UPDATE items SET item_key = (SELECT item_key FROM items WHERE rowid = 2) WHERE rowid = 1",
            "flip item_key", "flip secret", "flip ref",
            "UPDATE items SET ref = substr(ref, 2) WHERE rowid = 1",
            "UPDATE items SET class = 8 WHERE rowid = 1",
            // The two rows' uniqueness digests swapped: alice's lookup finds bob's row.
            """
            CREATE TEMP TABLE saved AS SELECT rowid AS r, key_ix AS k FROM items;
            UPDATE items SET key_ix = zeroblob(32) WHERE rowid = 1;
            UPDATE items SET key_ix = (SELECT k FROM saved WHERE r = 1) WHERE rowid = 2;
            UPDATE items SET key_ix = (SELECT k FROM saved WHERE r = 2) WHERE rowid = 1;
            """,
        ])
    func damagedRowsAreRefusedInPlace(tamper: String) throws {
        let temporary = try TemporaryDirectory(prefix: "kc-in-place")
        defer { temporary.remove() }
        let directory = temporary.appending("data")
        var service = try ItemService(directory: directory, lookupCacheEntries: 0)
        _ = try service.add(item("svc", "alice", secret: "alice-secret", ["pdmn": .text("ak")]), caller: Fixture.app)
        _ = try service.add(item("svc", "bob", secret: "bob-secret", ["pdmn": .text("ak")]), caller: Fixture.app)
        service.close()
        let db = try SQLiteConnection(path: directory + "/" + ItemService.databaseName, create: false)
        if tamper.hasPrefix("flip ") {
            // One bit of the column's middle byte.
            let column = String(tamper.dropFirst(5))
            var bytes = try db.withStatement("SELECT \(column) FROM items WHERE rowid = 1") {
                (s) throws(KeychainError) in
                _ = try s.step()
                return s.blob(0)
            }
            bytes[bytes.count / 2] ^= 0x01
            try db.withStatement("UPDATE items SET \(column) = ? WHERE rowid = 1") { (s) throws(KeychainError) in
                try s.bind(1, bytes)
                try s.run()
            }
        } else {
            try db.execute(tamper)
        }
        db.close()
        // The row-state record would refuse the whole database at open: accepted as the user's
        // `--accept-database` would, so that the reads themselves meet the damage.
        service = try ItemService(directory: directory, lookupCacheEntries: 0, acceptCurrentRows: true)
        defer { service.close() }
        for shape: [String: Value] in [["r_Data": .bool(true)], ["r_PersistentRef": .bool(true)], [:]] {
            let base = try service.compileCopy(query("base", "base", shape), caller: Fixture.app)
            let full = Answer { () throws(KeychainError) in
                try service.copyMatching(query("svc", "alice", shape), caller: Fixture.app)
            }
            let inPlace = Array("svc".utf8).withUnsafeBytes { s in
                Array("alice".utf8).withUnsafeBytes { a in
                    Answer { () throws(KeychainError) in try service.copy(base, service: s, account: a) }
                }
            }
            #expect(inPlace == full, "\(shape)")
            if service.lendsData(base) {
                let lent = Array("svc".utf8).withUnsafeBytes { s in
                    Array("alice".utf8).withUnsafeBytes { a in
                        Answer(lent: { (data) throws(KeychainError) in
                            try service.withData(of: base, service: s, account: a, into: data)
                        })
                    }
                }
                #expect(lent == full, "lent: \(shape)")
            }
            // Without the secret asked for, only what the item key's associated data covers is
            // checked (and a ref asked for is read from the row).
            if shape["r_Data"] != nil || tamper.contains("key_ix") || tamper.contains("class")
                || tamper.contains("item_key") || tamper.contains("ref")
            {
                guard case .error(let status, _) = inPlace else {
                    Issue.record("a damaged row was answered: \(tamper) \(shape)")
                    continue
                }
                #expect(status == .decode, "\(tamper) \(shape)")
            }
        }
    }
}
