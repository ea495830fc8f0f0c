import Foundation
import KeychainCore
import KeychainItems
import KeychainSystem
import KeychainWire
import Testing

@testable import KeychainDaemon

/// A connection's memo keeps only short queries, whichever table they go to: a client must not park
/// large compiled queries in the daemon outside its buffer budget.
@Suite("CopyMemo bounds")
struct CopyMemoBoundsTests {
    /// A store in a temporary directory, an app calling it and a memo token.
    final class Fixture {
        let directory: String
        let items: ItemService
        let caller = Caller(applicationIdentifier: "TEAM.app", accessGroups: ["TEAM.app"])
        let token = CopyMemo.Token(registryGeneration: 1, passphraseSet: false, indexGeneration: 0)

        init() throws {
            directory = try FileSystem.makeTemporaryDirectory(in: NSTemporaryDirectory(), prefix: "kc-memo-")
            items = try ItemService(directory: directory + "/data")
        }

        /// Closes the store and removes its directory.
        func remove() {
            items.close()
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    @Test("a template is kept only for a query of at most maxQueryBytes, however short its key")
    func templateOfALongQueryIsNotKept() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let (items, caller, token) = (fixture.items, fixture.caller, fixture.token)
        for (service, kept) in [("short", true), (String(repeating: "s", count: CopyMemo.maxQueryBytes), false)] {
            let query: [String: Value] = [
                "class": .text("genp"), "svce": .text(service), "acct": .text("a"), "r_Data": .bool(true),
            ]
            let bytes = CBOR.encode(.map(query))
            let template = try #require(bytes.withUnsafeBytes { QueryTemplate.scan($0) })
            #expect(template.key.count < 64, "the key leaves the service out")
            let memo = CopyMemo()
            memo.store(
                template: template.key, queryCount: bytes.count, token: token,
                compiled: try items.compileCopy(query, caller: caller))
            #expect((memo.lookup(template: template.key, token: token) != nil) == kept, "\(bytes.count) bytes")
        }
    }

    @Test("a query longer than any kept still finds the template of a short one")
    func aLongQueryFindsItsTemplate() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let (items, caller, token) = (fixture.items, fixture.caller, fixture.token)
        func query(_ service: String) -> [String: Value] {
            ["class": .text("genp"), "svce": .text(service), "acct": .text("a"), "r_Data": .bool(true)]
        }
        let short = CBOR.encode(.map(query("s")))
        let template = try #require(short.withUnsafeBytes { QueryTemplate.scan($0) })
        let memo = CopyMemo()
        memo.store(
            template: template.key, queryCount: short.count, token: token,
            compiled: try items.compileCopy(query("s"), caller: caller))
        let service = String(repeating: "s", count: 2 * CopyMemo.maxQueryBytes)
        for (bytes, expected) in [(short, "s"), (CBOR.encode(.map(query(service))), service)] {
            let found = try #require(bytes.withUnsafeBytes { memo.lookup(templateOf: $0, token: token) })
            let text = bytes.withUnsafeBytes { CBOR.text(UnsafeRawBufferPointer(rebasing: $0[found.service])) }
            #expect(text == expected, "\(bytes.count) bytes")
        }
    }

    @Test("a query compiled from a template is kept the second time, and never one carrying a secret")
    func recompiledQueriesAreKeptTheSecondTime() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let (items, caller, token) = (fixture.items, fixture.caller, fixture.token)
        for carriesSecret in [false, true] {
            var query: [String: Value] = [
                "class": .text("genp"), "svce": .text("s"), "acct": .text("a"), "r_Data": .bool(true),
            ]
            if carriesSecret { query["v_Data"] = .bytes(Array("secret".utf8)) }
            let bytes = CBOR.encode(.map(query))
            let compiled = try items.compileCopy(query, caller: caller)
            let memo = CopyMemo()
            var kept: [Bool] = []
            for _ in 0..<2 {
                bytes.withUnsafeBytes { memo.storeRecompiled($0, token: token, compiled: compiled) }
                kept.append(bytes.withUnsafeBytes { memo.lookup($0, token: token) } != nil)
            }
            #expect(kept == (carriesSecret ? [false, false] : [false, true]), "secret: \(carriesSecret)")
        }
    }

    @Test("a query served from its template is noted the first time and kept the second, never a long one")
    func noteRecompiledSaysWhenToKeep() {
        let memo = CopyMemo()
        for (count, expected) in [
            (64, [false, true, false, true]), (CopyMemo.maxQueryBytes + 1, [false, false, false, false]),
        ] {
            let bytes = [UInt8](repeating: 0x61, count: count)
            let said = bytes.withUnsafeBytes { b in
                (0..<4).map { _ in memo.noteRecompiled(b, hash: CopyMemo.hash(b)) }
            }
            #expect(said == expected, "\(count) bytes")
        }
        // Another query's note in the same slot in between starts over.
        let a = [UInt8]("first query".utf8)
        let slotmate = (0..<100_000).lazy.map { [UInt8]("other \($0)".utf8) }.first { other in
            let (ha, ho) = (a.withUnsafeBytes { CopyMemo.hash($0) }, other.withUnsafeBytes { CopyMemo.hash($0) })
            return ha != ho && (ha ^ ho) & UInt64(CopyMemo.slots - 1) == 0
        }
        guard let other = slotmate else {
            Issue.record("no query found in the same slot")
            return
        }
        func note(_ q: [UInt8]) -> Bool { q.withUnsafeBytes { memo.noteRecompiled($0, hash: CopyMemo.hash($0)) } }
        #expect([note(a), note(other), note(a), note(a)] == [false, false, false, true])
    }

    @Test("the last template is matched without a scan only for its token, and finds what the scan finds")
    func lastTemplateFollowsTheToken() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let (items, caller, token) = (fixture.items, fixture.caller, fixture.token)
        func query(_ service: String, _ more: [String: Value] = [:]) -> [String: Value] {
            var q: [String: Value] = [
                "class": .text("genp"), "svce": .text(service), "acct": .text("a"), "r_Data": .bool(true),
            ]
            q.merge(more) { _, new in new }
            return q
        }
        let memo = CopyMemo()
        var compiled: [ItemService.CompiledCopy] = []
        for shape in [[:], ["r_PersistentRef": Value.bool(true)]] {
            let bytes = CBOR.encode(.map(query("s", shape)))
            let template = try #require(bytes.withUnsafeBytes { QueryTemplate.scan($0) })
            compiled.append(try items.compileCopy(query("s", shape), caller: caller))
            memo.store(
                template: template.key, queryCount: bytes.count, token: token, compiled: compiled.last!,
                markers: template.markers)
        }
        // The second shape's entry is the last; a query of the first is found by its scan, and
        // both by theirs afterwards, under their token only.
        let stale = CopyMemo.Token(registryGeneration: 2, passphraseSet: false, indexGeneration: 0)
        for (i, shape) in [(0, [:]), (1, ["r_PersistentRef": Value.bool(true)]), (0, [:])] {
            let bytes = CBOR.encode(.map(query("other service", shape)))
            let found = try #require(bytes.withUnsafeBytes { memo.lookup(templateOf: $0, token: token) })
            let text = bytes.withUnsafeBytes { CBOR.text(UnsafeRawBufferPointer(rebasing: $0[found.service])) }
            #expect(text == "other service")
            #expect(found.compiled === compiled[i])
            #expect(bytes.withUnsafeBytes { memo.lookup(templateOf: $0, token: stale) } == nil)
        }
    }

    @Test("queries are equal only when every byte is, at every length (the word compares overlap at the end)")
    func equalityCountsEveryByte() {
        for n in 0...40 {
            let a = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            a.withUnsafeBytes { ra in
                #expect(CopyMemo.same(ra, ra), "length \(n)")
                let copy = a
                copy.withUnsafeBytes { rc in #expect(CopyMemo.same(ra, rc), "length \(n), a copy") }
            }
            for position in 0..<n {
                var b = a
                b[position] ^= 0x80
                a.withUnsafeBytes { ra in
                    b.withUnsafeBytes { rb in #expect(!CopyMemo.same(ra, rb), "length \(n), byte \(position)") }
                }
            }
        }
    }
}
