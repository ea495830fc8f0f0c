import KeychainCore
import KeychainWire
import Testing

/// The daemon recognises the common request shape from its bytes (to reuse a compiled copy query):
/// it must agree with the full decoder on every request it accepts, and refuse every other shape.
@Suite("Request shape scanning")
struct RequestShapeTests {
    func body(_ value: Value) -> [UInt8] { CBOR.encode(value) }

    func scan(_ bytes: [UInt8]) -> RequestShape? {
        bytes.withUnsafeBytes { RequestShape.scan($0) }
    }

    @Test("the requests clients write are recognised with the decoder's id, op and query")
    func agreesWithTheDecoder() throws {
        let query: [String: Value] = [
            "class": .text("genp"), "svce": .text("s"), "acct": .text("a"), "r_Data": .bool(true),
        ]
        for id: Int64 in [0, 1, 23, 24, 255, 256, 65_535, 65_536, 1 << 40, Int64.max] {
            for op in ["copy", "add", "delete"] {
                let bytes = body(Request(id: id, op: op, query: query).value)
                let shape = try #require(scan(bytes))
                #expect(shape.id == id)
                #expect(shape.op?.rawValue == op)
                #expect(try CBOR.decode(Array(bytes[shape.queryStart...])) == .map(query))
            }
        }
    }

    @Test("an unknown op is still the shape, with no operation")
    func unknownOp() throws {
        let shape = try #require(scan(body(Request(id: 3, op: "frobnicate", query: [:]).value)))
        #expect(shape.op == nil)
    }

    @Test("every other shape is left to the decoder")
    func otherShapes() {
        let query: Value = .map(["class": .text("genp")])
        let refused: [Value] = [
            .map(["v": .int(1), "id": .int(1), "op": .text("copy")]),  // no query
            .map(["v": .int(1), "id": .int(1), "op": .text("update"), "query": query, "attributes": .map([:])]),
            .map(["v": .int(2), "id": .int(1), "op": .text("copy"), "query": query]),  // version
            .map(["v": .int(1), "id": .int(-1), "op": .text("copy"), "query": query]),  // negative id
            .map(["v": .int(1), "id": .text("1"), "op": .text("copy"), "query": query]),
            .map(["v": .int(1), "id": .int(1), "op": .bytes(Array("copy".utf8)), "query": query]),
            .map(["v": .int(1), "id": .int(1), "op": .text("copy"), "query": .array([])]),
            .map(["v": .int(1), "id": .int(1), "op": .text("copy"), "query": query, "passphrase": .bytes([1])]),
            .array([]), .int(4),
        ]
        for value in refused { #expect(scan(body(value)) == nil, "\(value)") }
        // Keys out of canonical order, a non-minimal "v", truncated input, and nothing at all.
        var swapped = body(Request(id: 1, op: "copy", query: ["class": .text("genp")]).value)
        swapped[1...3] = [0x61, 0x76, 0x18]
        #expect(scan(swapped) == nil)
        let whole = body(Request(id: 1 << 40, op: "copy", query: ["class": .text("genp")]).value)
        let queryStart = scan(whole)?.queryStart ?? 0
        #expect(queryStart == 30)
        for cut in 0...queryStart { #expect(scan(Array(whole[..<cut])) == nil, "cut at \(cut)") }
        #expect(scan([]) == nil)
    }

    @Test("one changed byte in any fixed key, or in the map heads, is refused")
    func everyFixedByteCounts() throws {
        // The scanner compares the keys a word at a time: each byte of each word must still count.
        let whole = body(Request(id: 300, op: "copy", query: ["class": .text("genp")]).value)
        let shape = try #require(scan(whole))
        // A4 "v" 01 "id" | 19 01 2C | "op" head | copy | "query" head
        let idHead = 7
        let opKey = idHead + 3
        let queryKey = opKey + 4 + 4
        #expect(queryKey + 6 == shape.queryStart)
        let fixed = Array(0..<idHead) + Array(opKey..<opKey + 3) + Array(queryKey..<queryKey + 6)
        for position in fixed {
            for bit in 0..<8 {
                var changed = whole
                changed[position] ^= UInt8(1 << bit)
                #expect(scan(changed) == nil, "byte \(position), bit \(bit)")
            }
        }
        // The op's name is compared whole: any changed byte of "copy" is no longer the copy operation.
        for position in opKey + 4..<opKey + 8 {
            var changed = whole
            changed[position] ^= 0x01
            #expect(scan(changed)?.op != .copy, "op byte \(position)")
        }
        // The query's head must be a map (major type 5).
        var notMap = whole
        notMap[shape.queryStart] = 0x81  // an array of one
        #expect(scan(notMap) == nil)
    }
}
