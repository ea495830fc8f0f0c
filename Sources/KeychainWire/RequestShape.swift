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
        // Every read is checked against `count` first. The fixed keys are compared a word at a time
        // (little-endian loads of the bytes as they stand in the frame): this runs before every
        // request, so it stays free of closures, arrays and allocation, and of byte-by-byte loops.
        let count = body.count
        // A map of four entries; "v" = 1; the key "id" (A4 61 76 01 62 69 64), then the id's head.
        guard count > 7,
            word(body, 0, as: UInt64.self) & 0x00FF_FFFF_FFFF_FFFF == 0x0064_6962_0176_61A4
        else { return nil }
        var at = 7
        let head = body[at]
        at += 1
        // "id" = an unsigned integer that fits Int64.
        guard head >> 5 == 0 else { return nil }
        guard let id = RawCBOR.argument(body, head & 0x1F, &at), id <= UInt64(Int64.max) else { return nil }
        // "op" (62 6F 70) = a short text string (its head is the fourth byte).
        guard count - at >= 4 else { return nil }
        let opWord = word(body, at, as: UInt32.self)
        guard opWord & 0x00FF_FFFF == 0x0070_6F62 else { return nil }
        let opHead = UInt8(truncatingIfNeeded: opWord >> 24)
        at += 4
        guard opHead >> 5 == 3 else { return nil }
        let opLength = Int(opHead & 0x1F)
        guard opLength < 24, count - at >= opLength else { return nil }
        let opBytes = UnsafeRawBufferPointer(rebasing: body[at..<at + opLength])
        at += opLength
        // "query" (65 71 75 65 72 79) = a map (its head only: the rest is compared byte for byte by the caller).
        guard count - at >= 7, word(body, at, as: UInt32.self) == 0x6575_7165,
            word(body, at + 4, as: UInt16.self) == 0x7972, body[at + 6] >> 5 == 5
        else { return nil }
        return RequestShape(id: Int64(id), op: Operation.named(opBytes), queryStart: at + 6)
    }

    /// The bytes at `offset` as a little-endian integer (the caller has checked they are there).
    @inline(__always)
    static func word<T: FixedWidthInteger>(_ bytes: UnsafeRawBufferPointer, _ offset: Int, as: T.Type) -> T {
        T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}

extension Operation {
    /// The operation whose name is exactly these bytes, without making a String.
    /// "copy", the hot one, is one compare made where it is called; the others walk `allCases`
    /// (an array built per call) out of line.
    @inline(__always)
    static func named(_ bytes: UnsafeRawBufferPointer) -> Operation? {
        if bytes.count == 4 && RequestShape.word(bytes, 0, as: UInt32.self) == 0x7970_6F63 {
            return .copy
        }
        return namedByWalking(bytes)
    }

    @inline(never)
    private static func namedByWalking(_ bytes: UnsafeRawBufferPointer) -> Operation? {
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
