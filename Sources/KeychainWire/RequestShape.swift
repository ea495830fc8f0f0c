public import KeychainCore

/// The shape almost every request has, recognised from its bytes without decoding them:
/// `{"v": 1, "id": <uint>, "op": <text>, "query": <map>}` with the keys in canonical order (the
/// order every client of this repository writes). Nothing is allocated and nothing is validated
/// past the head of `query`: the caller may use the shape only to find a request whose `query`
/// bytes are identical to those of one that was decoded in full before (the daemon's per-connection
/// memo of compiled copy queries). Any other shape is nil, and such a request takes the general path.
public struct RequestShape: Equatable, Sendable {
    /// The request id (`id`).
    public let id: Int64
    /// The operation, when `op` names a known one.
    public let op: Operation?
    /// Where the encoded `query` map starts in the body; it runs to the end of the body.
    public let queryStart: Int

    /// A shape with these fields, as `scan` finds them.
    public init(id: Int64, op: Operation?, queryStart: Int) {
        self.id = id
        self.op = op
        self.queryStart = queryStart
    }

    /// The shape of `body`, or nil when it is not exactly the common one.
    public static func scan(_ body: UnsafeRawBufferPointer) -> RequestShape? {
        // Index arithmetic on the raw bytes, every read bounds-checked against `count` first: this runs
        // before every request, so it stays free of closures, arrays and allocation.
        let count = body.count
        // A map of four entries; "v" = 1; the key "id" (A4 61 76 01 62 69 64), then the id's head.
        guard count > 7, body[0] == 0xA4, body[1] == 0x61, body[2] == 0x76, body[3] == 0x01,
            body[4] == 0x62, body[5] == 0x69, body[6] == 0x64
        else { return nil }
        var at = 7
        let head = body[at]
        at += 1
        // "id" = an unsigned integer that fits Int64.
        guard head >> 5 == 0 else { return nil }
        guard let id = RawCBOR.argument(body, head & 0x1F, &at), id <= UInt64(Int64.max) else { return nil }
        // "op" (62 6F 70) = a short text string.
        guard count - at >= 4, body[at] == 0x62, body[at + 1] == 0x6F, body[at + 2] == 0x70 else { return nil }
        let opHead = body[at + 3]
        at += 4
        guard opHead >> 5 == 3 else { return nil }
        let opLength = Int(opHead & 0x1F)
        guard opLength < 24, count - at >= opLength else { return nil }
        let opBytes = UnsafeRawBufferPointer(rebasing: body[at..<at + opLength])
        at += opLength
        // "query" (65 71 75 65 72 79) = a map (its head only: the rest is compared byte for byte by the caller).
        guard count - at >= 7, body[at] == 0x65, body[at + 1] == 0x71, body[at + 2] == 0x75, body[at + 3] == 0x65,
            body[at + 4] == 0x72, body[at + 5] == 0x79, body[at + 6] >> 5 == 5
        else { return nil }
        return RequestShape(id: Int64(id), op: Operation.named(opBytes), queryStart: at + 6)
    }
}

extension Operation {
    /// The operation whose name is exactly these bytes, without making a String.
    static func named(_ bytes: UnsafeRawBufferPointer) -> Operation? {
        // "copy", the hot one, without walking allCases (an array built per call).
        if bytes.count == 4 && bytes[0] == 0x63 && bytes[1] == 0x6F && bytes[2] == 0x70 && bytes[3] == 0x79 {
            return .copy
        }
        for op in Operation.allCases where op.rawValue.utf8.elementsEqual(bytes) { return op }
        return nil
    }
}

/// Reading encoded CBOR in place, for the scanners of this module (no decoding, no allocation).
enum RawCBOR {
    /// The argument of a head whose additional information is `info`, its bytes read from `bytes`
    /// at `at` (moved past them); nil for an indefinite length, a reserved value or input cut short.
    static func argument(_ bytes: UnsafeRawBufferPointer, _ info: UInt8, _ at: inout Int) -> UInt64? {
        if info < 24 { return UInt64(info) }
        guard info <= 27 else { return nil }
        let width = 1 << Int(info - 24)
        guard bytes.count - at >= width else { return nil }
        var n: UInt64 = 0
        for _ in 0..<width {
            n = n << 8 | UInt64(bytes[at])
            at += 1
        }
        return n
    }
}
