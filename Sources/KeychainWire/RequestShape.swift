import KeychainCore

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

    public init(id: Int64, op: Operation?, queryStart: Int) {
        self.id = id
        self.op = op
        self.queryStart = queryStart
    }

    /// A map of four entries, "v" = 1, then the key "id"; the keys "op" and "query" (CBOR text heads).
    static let start: [UInt8] = [0xA4, 0x61, 0x76, 0x01, 0x62, 0x69, 0x64]
    static let opKey: [UInt8] = [0x62, 0x6F, 0x70]
    static let queryKey: [UInt8] = [0x65, 0x71, 0x75, 0x65, 0x72, 0x79]

    /// The shape of `body`, or nil when it is not exactly the common one.
    public static func scan(_ body: UnsafeRawBufferPointer) -> RequestShape? {
        var at = 0
        func byte() -> UInt8? {
            guard at < body.count else { return nil }
            defer { at += 1 }
            return body[at]
        }
        func literal(_ bytes: [UInt8]) -> Bool {
            let n = bytes.count
            guard body.count - at >= n else { return false }
            for i in 0..<n where body[at + i] != bytes[i] { return false }
            at += n
            return true
        }
        // A map of four entries; "v" = 1; "id" = an unsigned integer that fits Int64.
        guard literal(Self.start), let head = byte(), head >> 5 == 0 else { return nil }
        var id: UInt64
        switch head & 0x1F {
        case let small where small < 24: id = UInt64(small)
        case let info where info <= 27:
            let width = 1 << Int(info - 24)
            guard body.count - at >= width else { return nil }
            id = 0
            for _ in 0..<width { id = id << 8 | UInt64(body[at]); at += 1 }
        default: return nil
        }
        guard id <= UInt64(Int64.max) else { return nil }
        // "op" = a short ASCII text string.
        guard literal(Self.opKey), let opHead = byte(), opHead >> 5 == 3 else { return nil }
        let opLength = Int(opHead & 0x1F)
        guard opLength < 24, body.count - at >= opLength else { return nil }
        let opBytes = UnsafeRawBufferPointer(rebasing: body[at..<at + opLength])
        at += opLength
        // "query" = a map (its head only: the rest is compared byte for byte by the caller).
        guard literal(Self.queryKey), at < body.count, body[at] >> 5 == 5 else { return nil }
        return RequestShape(id: Int64(id), op: Operation.named(opBytes), queryStart: at)
    }
}

extension Operation {
    /// The operation whose name is exactly these bytes, without making a String.
    static func named(_ bytes: UnsafeRawBufferPointer) -> Operation? {
        for op in Operation.allCases where op.rawValue.utf8.elementsEqual(bytes) { return op }
        return nil
    }
}
