import KeychainCore
import KeychainWire
import Testing

/// The daemon compiles a `copy` query from an earlier one of the same template (the query but for its
/// service and account): two queries may share a template only when nothing else in them differs.
@Suite("Query templates")
struct QueryTemplateTests {
    func template(_ query: [String: Value]) -> QueryTemplate? {
        CBOR.encode(.map(query)).withUnsafeBytes { QueryTemplate.scan($0) }
    }

    func query(_ service: String, _ account: String, _ more: [String: Value] = [:]) -> [String: Value] {
        var q: [String: Value] = ["class": .text("genp"), "svce": .text(service), "acct": .text(account)]
        q.merge(more) { _, new in new }
        return q
    }

    @Test("queries that differ only in service and account share a template, whatever the values' lengths")
    func sameShape() throws {
        let base = try #require(template(query("s", "a", ["r_Data": .bool(true), "m_Limit": .text("m_LimitOne")])))
        for (service, account) in [
            ("s", "a"), ("", ""), (String(repeating: "x", count: 30), "é"), ("ü", String(repeating: "y", count: 300)),
        ] {
            let other = try #require(
                template(query(service, account, ["r_Data": .bool(true), "m_Limit": .text("m_LimitOne")])))
            #expect(other.key == base.key, "\(service.utf8.count)/\(account.utf8.count) bytes")
        }
    }

    @Test("a query carrying a secret has no template: the scan never copies a secret into its key")
    func noSecret() {
        #expect(template(query("s", "a", ["v_Data": .bytes([1, 2, 3])])) == nil)
        #expect(template(query("s", "a", ["v_Dat": .bytes([1, 2, 3])])) != nil)  // only that key
    }

    @Test("the ranges are the values' text, as the decoder reads it")
    func ranges() throws {
        let service = "com.example.a-long-service-name"
        let account = "ünïcode account"
        let bytes = CBOR.encode(.map(query(service, account, ["agrp": .text("TEAM.g")])))
        let t = try #require(bytes.withUnsafeBytes { QueryTemplate.scan($0) })
        bytes.withUnsafeBytes { raw in
            #expect(CBOR.text(UnsafeRawBufferPointer(rebasing: raw[t.service])) == service)
            #expect(CBOR.text(UnsafeRawBufferPointer(rebasing: raw[t.account])) == account)
        }
    }

    @Test("a value's head written longer than it need be: the same template, the range still its text")
    func nonMinimalHeads() throws {
        let minimal = CBOR.encode(.map(query("s", "a")))
        let base = try #require(minimal.withUnsafeBytes { QueryTemplate.scan($0) })
        // "svce": "s" is 64 73 76 63 65 61 73; write the value's head as 78 01 (one-byte length).
        let at = try #require(
            (0..<minimal.count - 6).first { Array(minimal[$0..<$0 + 7]) == [0x64, 0x73, 0x76, 0x63, 0x65, 0x61, 0x73] })
        var longer = minimal
        longer.replaceSubrange((at + 5)...(at + 5), with: [0x78, 0x01])
        #expect(try CBOR.decode(longer) == CBOR.decode(minimal), "the decoder reads both alike")
        let t = try #require(longer.withUnsafeBytes { QueryTemplate.scan($0) })
        #expect(t.key == base.key)
        longer.withUnsafeBytes { raw in
            #expect(CBOR.text(UnsafeRawBufferPointer(rebasing: raw[t.service])) == "s")
        }
    }

    @Test("anything else that differs gives another template")
    func otherDifferences() throws {
        let base = try #require(template(query("s", "a", ["r_Data": .bool(true)])))
        let others: [[String: Value]] = [
            query("s", "a", ["r_Data": .bool(false)]),
            query("s", "a", ["r_Attributes": .bool(true)]),
            query("s", "a", ["r_Data": .bool(true), "agrp": .text("TEAM.g")]),
            query("s", "a", ["r_Data": .bool(true), "pdmn": .text("ak")]),
            query("s", "a", ["r_Data": .bool(true), "m_Limit": .int(2)]),
            query("s", "a", ["r_Data": .bool(true), "labl": .text("s")]),
            query("s", "a", ["r_Data": .bool(true), "sync": .text("syna")]),
            ["class": .text("genp"), "svce": .text("s"), "acct": .text("a"), "r_Data": .int(1)],
            ["class": .text("keys"), "svce": .text("s"), "acct": .text("a"), "r_Data": .bool(true)],
        ]
        for other in others {
            let t = try #require(template(other), "\(other)")
            #expect(t.key != base.key, "\(other)")
        }
    }

    @Test("no template without both values as text, or with values the scan does not read")
    func noTemplate() {
        let refused: [[String: Value]] = [
            ["class": .text("genp"), "svce": .text("s")],
            ["class": .text("genp"), "acct": .text("a")],
            ["class": .text("genp"), "svce": .bytes([1]), "acct": .text("a")],
            ["class": .text("genp"), "svce": .text("s"), "acct": .bytes([2])],
            query("s", "a", ["mdat": .date(5)]),
            query("s", "a", ["gena": .array([])]),
            query("s", "a", ["x": .map([:])]),
            query("s", "a", ["crtr": .float(1.5)]),
        ]
        for q in refused { #expect(template(q) == nil, "\(q)") }
        #expect([UInt8]().withUnsafeBytes { QueryTemplate.scan($0) } == nil)
    }

    @Test("a repeated key, trailing bytes, or input cut short is no template")
    func malformed() throws {
        // {"svce": "s", "acct": "a", "svce": "t"} written by hand: a map of three with a repeated key.
        let repeated: [UInt8] =
            [0xA3, 0x64] + Array("svce".utf8) + [0x61, 0x73, 0x64] + Array("acct".utf8) + [0x61, 0x61, 0x64]
            + Array("svce".utf8) + [0x61, 0x74]
        #expect(repeated.withUnsafeBytes { QueryTemplate.scan($0) } == nil)
        let whole = CBOR.encode(.map(query("service", "account", ["r_Data": .bool(true)])))
        #expect(whole.withUnsafeBytes { QueryTemplate.scan($0) } != nil)
        #expect((whole + [0]).withUnsafeBytes { QueryTemplate.scan($0) } == nil)
        for cut in 0..<whole.count {
            #expect(Array(whole[..<cut]).withUnsafeBytes { QueryTemplate.scan($0) } == nil, "cut at \(cut)")
        }
    }

    @Test("matching a known template's key finds exactly what scanning the query would")
    func matchAgreesWithScan() throws {
        var rng = SystemRandomNumberGenerator()
        let bases: [[String: Value]] = [
            query("s", "a", ["r_Data": .bool(true)]),
            query("bench.fill", "user1", ["r_Data": .bool(true), "m_Limit": .text("m_LimitOne")]),
            // 0xFF bytes elsewhere in the key: the markers say which are the values'.
            query("s", "a", ["gena": .bytes([0xFF, 0xFF, 0x63]), "r_PersistentRef": .bool(true)]),
            query(String(repeating: "x", count: 40), "ü", ["agrp": .text("TEAM.g"), "labl": .text("label")]),
            ["svce": .text("s"), "acct": .text("a")],
        ]
        for base in bases {
            let bytes = CBOR.encode(.map(base))
            let template = try #require(bytes.withUnsafeBytes { QueryTemplate.scan($0) })
            // Other values, the base itself, and byte-level damage of each.
            var candidates: [[UInt8]] = [bytes]
            for (service, account) in [("", ""), ("t", "b"), (String(repeating: "y", count: 300), "é"), ("ü", "a")] {
                var other = base
                other["svce"] = .text(service)
                other["acct"] = .text(account)
                candidates.append(CBOR.encode(.map(other)))
                var bytesValue = base
                bytesValue["svce"] = .bytes(Array(service.utf8))
                candidates.append(CBOR.encode(.map(bytesValue)))
            }
            for c in Array(candidates) {
                candidates.append(c + [0])
                candidates.append(Array(c.dropLast()))
                for _ in 0..<40 {
                    var damaged = c
                    damaged[Int.random(in: 0..<damaged.count, using: &rng)] = .random(in: 0...255, using: &rng)
                    candidates.append(damaged)
                }
                for cut in 0..<c.count { candidates.append(Array(c[..<cut])) }
            }
            var matched = 0
            for candidate in candidates {
                let scanned = candidate.withUnsafeBytes { QueryTemplate.scan($0) }
                let expected = scanned.flatMap { $0.key == template.key ? ($0.service, $0.account) : nil }
                let found = candidate.withUnsafeBytes { q in
                    template.key.withUnsafeBytes { QueryTemplate.match(q, key: $0, markers: template.markers) }
                }
                #expect(found?.service == expected?.0 && found?.account == expected?.1, "\(candidate)")
                if found != nil { matched += 1 }
            }
            #expect(matched >= 5, "too few candidates matched to compare anything")
        }
    }
}
