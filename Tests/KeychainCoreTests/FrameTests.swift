import KeychainCore
import KeychainSystem
import KeychainWire
import Testing

@Suite("Frames and messages")
struct FrameTests {
    @Test("a frame is a 4-byte big-endian length and one CBOR map")
    func frameLayout() throws {
        let frame = Frame.encode(.map(["id": .int(7)]))
        #expect(frame.count == 4 + 5)
        #expect(Array(frame[0..<4]) == [0, 0, 0, 5])
        #expect(try CBOR.decode(Array(frame[4...])) == .map(["id": .int(7)]))
    }

    @Test("pipelined frames arriving byte by byte come out whole and in order")
    func incrementalFrames() throws {
        var stream: [UInt8] = []
        for i in 0..<5 {
            stream += Frame.encode(Request(id: Int64(i), op: "copy", query: ["class": .text("genp")]).value)
        }
        var buffer = FrameBuffer()
        var ids: [Int64] = []
        for byte in stream {
            buffer.append([byte])
            while let body = try buffer.next() { ids.append(try Request(CBOR.decode(body)).id) }
        }
        #expect(ids == [0, 1, 2, 3, 4])
        #expect(buffer.pendingCount == 0)
    }

    @Test("frames lent where they lie come out whole and in order; a partial one waits for its rest")
    func lentFrames() throws {
        var stream: [UInt8] = []
        for i in 0..<3 {
            stream += Frame.encode(Request(id: Int64(i), op: "copy", query: ["class": .text("genp")]).value)
        }
        let last = Frame.encode(Request(id: 3, op: "delete", query: ["svce": .text("s")]).value)
        var buffer = FrameBuffer()
        buffer.append(stream + last.prefix(5))
        var ids: [Int64] = []
        while let id = try buffer.withNextFrame({ body in try? Request(CBOR.decode(body)).id }) { ids.append(id!) }
        #expect(ids == [0, 1, 2])
        #expect(buffer.pendingCount == 5)
        buffer.append(Array(last.dropFirst(5)))
        #expect(try buffer.withNextFrame({ body in try? Request(CBOR.decode(body)).op }) == "delete")
        #expect(try buffer.withNextFrame({ _ in 0 }) == nil)
        #expect(buffer.pendingCount == 0)
    }

    @Test("a read while part of a frame is held goes into the room the buffer has, without growing it")
    func readsIntoTheRoomThere() throws {
        let first = Frame.encode(Request(id: 1, op: "copy", query: ["class": .text("genp")]).value)
        let second = Frame.encode(Request(id: 2, op: "copy", query: ["class": .text("genp")]).value)
        var buffer = FrameBuffer()
        func feed(_ bytes: [UInt8], offered: Int) -> Int {
            buffer.receive(upTo: offered) { (room) -> Int in
                #expect(room.count >= bytes.count)
                room.copyBytes(from: bytes)
                return bytes.count
            }
        }
        _ = feed(first + second.prefix(3), offered: 64 * 1024)
        let room = buffer.capacity
        #expect(room >= 64 * 1024)
        #expect(try buffer.withNextFrame { try? Request(CBOR.decode($0)).id } == 1)
        #expect(buffer.pendingCount == 3)
        // Offered as much again: the read gets the room left, and the buffer keeps its size.
        _ = buffer.receive(upTo: 64 * 1024) { (room) -> Int in
            #expect(room.count < 64 * 1024)
            room.copyBytes(from: second.dropFirst(3))
            return second.count - 3
        }
        #expect(buffer.capacity == room)
        #expect(try buffer.withNextFrame { try? Request(CBOR.decode($0)).id } == 2)
        #expect(feed(first, offered: 64 * 1024) == first.count && buffer.capacity == room)
    }

    @Test("a header announcing more than the limit is refused before the body arrives")
    func oversizedHeader() {
        var buffer = FrameBuffer(maxBytes: 1024)
        buffer.append([0, 0, 4, 1])
        #expect(throws: KeychainError.self) { _ = try buffer.next() }
    }

    @Test("requests round-trip, and envelope errors are errSecParam")
    func requestEnvelope() throws {
        let r = Request(id: 42, op: "update", query: ["svce": .text("s")], attributes: ["labl": .text("l")])
        let back = try Request(r.value)
        #expect(
            back.id == 42 && back.op == "update" && back.query == ["svce": .text("s")]
                && back.attributes == ["labl": .text("l")])
        #expect(throws: KeychainError(.param, "request lacks \"v\" (protocol version)")) {
            try Request(.map(["id": .int(1), "op": .text("copy")]))
        }
        #expect(throws: KeychainError(.param, "request \"v\" (protocol version) must be the integer 1")) {
            try Request(.map(["v": .text("1"), "id": .int(1), "op": .text("copy")]))
        }
        do {
            _ = try Request(.map(["v": .int(2), "id": .int(1), "op": .text("copy")]))
            Issue.record("v2 accepted")
        } catch {
            #expect(error.status == .param)
        }
        do {
            _ = try Request(.map(["v": .int(1), "id": .int(1), "op": .text("copy"), "query": .text("x")]))
            Issue.record("query text accepted")
        } catch {
            #expect(error.status == .param)
        }
    }

    @Test("responses carry status, message and result")
    func responseRoundTrip() throws {
        let r = Response(id: 3, error: KeychainError(.itemNotFound))
        let back = try Response(CBOR.decode(CBOR.encode(r.value)))
        #expect(back.id == 3 && back.status == .itemNotFound && back.message == Status.itemNotFound.defaultMessage)
        #expect(throws: KeychainError.self) { try back.check() }
    }
}

@Suite("Response frames")
struct ResponseFrameTests {
    @Test("the field-by-field response frame is byte-identical to encoding the response map")
    func frameMatchesCanonicalEncoding() {
        let cases = [
            Response(id: 0, status: .success),
            Response(id: 7, result: .bytes(Array("secret".utf8))),
            Response(id: 1 << 40, error: KeychainError(.itemNotFound)),
            Response(id: 3, result: .array([.map(["acct": .text("a"), "cdat": .date(1.5)])])),
            Response(id: 4, status: .param, message: "ünïcode message", result: .null),
        ]
        for r in cases { #expect(r.frame() == Frame.encode(r.value)) }
    }

    @Test("a success carrying a byte string or nothing, written in one pass, is the canonical frame too")
    func oneSuccessPass() {
        // Each size where a CBOR head changes length, for the id and for the payload.
        let ids: [Int64] = [0, 23, 24, 255, 256, 65_535, 65_536, 1 << 32 - 1, 1 << 32, .max]
        let sizes = [0, 23, 24, 255, 256, 65_535, 65_536]
        for id in ids {
            let none = Response(id: id)
            #expect(none.frame() == Frame.encode(none.value))
            for n in sizes {
                let payload = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
                for r in [
                    Response(id: id, result: .bytes(payload)), Response(id: id, result: .secret(SecretBytes(payload))),
                ] {
                    // Appended after bytes already in the buffer, as pipelined answers are.
                    var out = SecretBytes([0xAA, 0xBB])
                    r.appendFrame(to: &out)
                    #expect(
                        out.unprotectedArray == [0xAA, 0xBB]
                            + Frame.encode(Response(id: id, result: .bytes(payload)).value))
                }
                // From data lent where it lies, and from data written in place (a secret opened
                // into the frame), negative ids too.
                for i in [id, -1 - id] {
                    let expected = [0xAA, 0xBB] + Frame.encode(Response(id: i, result: .bytes(payload)).value)
                    var out = SecretBytes([0xAA, 0xBB])
                    payload.withUnsafeBytes { Response.appendSuccess(id: i, data: $0, to: &out) }
                    #expect(out.unprotectedArray == expected)
                    var filled = SecretBytes([0xAA, 0xBB])
                    Response.appendSuccess(id: i, count: n, to: &filled) { room in
                        #expect(room.count == n)
                        payload.withUnsafeBytes { room.copyMemory(from: $0) }
                    }
                    #expect(filled.unprotectedArray == expected)
                }
            }
        }
    }

    @Test("data that fails to open in its place leaves nothing behind: not a byte appended, the room zeroed")
    func failedFillLeavesNothing() {
        struct Refused: Error {}
        for id: Int64 in [5, 1 << 40, -3] {
            // Room enough that nothing grows, and the room known to be clear beforehand.
            var out = SecretBytes(capacity: 256)
            out.append(contentsOf: [0xAA, 0xBB])
            _ = out.append(upTo: 200) { room in
                room.initializeMemory(as: UInt8.self, repeating: 0)
                return 0
            }
            #expect(throws: Refused.self) {
                try Response.appendSuccess(id: id, count: 40, to: &out) { (room) throws(Refused) in
                    room.initializeMemory(as: UInt8.self, repeating: 0x5C)  // half-opened plaintext
                    throw Refused()
                }
            }
            #expect(out.unprotectedArray == [0xAA, 0xBB], "id \(id)")
            // Room past the held bytes never keeps what was written there.
            _ = out.append(upTo: 200) { room in
                #expect(!room.contains(0x5C), "id \(id): written bytes left in the buffer's room")
                return 0
            }
        }
    }

    @Test("non-ASCII text still decodes and invalid UTF-8 is still refused")
    func textPaths() throws {
        #expect(try CBOR.decode(CBOR.encode(.text("Grüße, 世界"))) == .text("Grüße, 世界"))
        #expect(throws: KeychainError.self) { try CBOR.decode([0x62, 0xC3, 0x28]) }
        #expect(throws: KeychainError.self) { try CBOR.decode([0x61, 0xFF]) }
    }
}
