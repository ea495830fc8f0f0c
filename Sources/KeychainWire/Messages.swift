public import KeychainCore
public import KeychainSystem

/// The request keys whose byte strings are secrets: decoded straight into wiping storage
/// (`Value.secret`) wherever they appear in a request.
public let secretRequestKeys: Set<String> = ["v_Data", "passphrase", "old", "new", "keychainPassphrase"]

/// The response keys whose byte strings a client decodes into wiping storage (`Value.secret`): a
/// copy's `result` (the secret alone, or a list of them) and `v_Data` in result maps. A client that
/// decodes without them leaves a copy of every secret it reads in freed heap.
public let secretResponseKeys: Set<String> = ["result", "v_Data"]

/// Protocol version carried in every request's `v`.
public let protocolVersion: Int64 = 1

/// One request: `{"v": 1, "id": <uint>, "op": <text>, "query": {…}, "attributes": {…}, …}`.
public struct Request: Sendable {
    /// The request id, echoed in the response so a client can match the two.
    public var id: Int64
    /// The operation name (`add`, `copy`, `update`, `delete`, or an admin operation).
    public var op: String
    /// The item query (`kSecClass`, attributes to match, `kSecReturn…`, …), when the operation takes one.
    public var query: [String: Value]?
    /// The attributes to set (`add`, `update`), when the operation takes them.
    public var attributes: [String: Value]?
    /// Further keys of admin operations (for example `passphrase`).
    public var arguments: [String: Value]

    /// A request with these fields; `arguments` holds any further keys of the operation.
    public init(
        id: Int64, op: String, query: [String: Value]? = nil, attributes: [String: Value]? = nil,
        arguments: [String: Value] = [:]
    ) {
        self.id = id
        self.op = op
        self.query = query
        self.attributes = attributes
        self.arguments = arguments
    }

    /// The request as a CBOR map, with the protocol version filled in: what a client encodes.
    public var value: Value {
        var m = arguments
        m["v"] = .int(protocolVersion)
        m["id"] = .int(id)
        m["op"] = .text(op)
        if let query { m["query"] = .map(query) }
        if let attributes { m["attributes"] = .map(attributes) }
        return .map(m)
    }

    /// The request id of a decoded map, when it has a usable one (to answer even a malformed request).
    public static func id(of value: Value) -> Int64? {
        guard case .map(let m) = value, case .int(let id)? = m["id"], id >= 0 else { return nil }
        return id
    }

    /// The envelope keys; anything else in a request map is an argument of the operation.
    static let envelopeKeys: Set<String> = ["v", "id", "op", "query", "attributes"]

    /// Decodes and validates a request map's envelope; throws errSecParam naming the bad or missing key.
    /// Operation-specific checks happen where the operation is served.
    public init(_ value: Value) throws(KeychainError) {
        // Lookups only: mutating a copy of the map would copy the whole dictionary on every request.
        guard case .map(let m) = value else { throw .param("request is not a CBOR map") }
        guard let version = m["v"] else { throw .param("request lacks \"v\" (protocol version)") }
        guard case .int(let v) = version else {
            throw .param("request \"v\" (protocol version) must be the integer \(protocolVersion)")
        }
        guard v == protocolVersion else {
            throw .param("protocol version \(v) is not supported (this daemon speaks \(protocolVersion))")
        }
        guard case .int(let id)? = m["id"], id >= 0 else { throw .param("request lacks a non-negative integer \"id\"") }
        guard case .text(let op)? = m["op"] else { throw .param("request lacks a text \"op\"") }
        self.id = id
        self.op = op
        var present = 3
        switch m["query"] {
        case nil: query = nil
        case .map(let q)?:
            query = q
            present += 1
        case let other?: throw .param("\"query\" must be a map, not \(other.kindName)")
        }
        switch m["attributes"] {
        case nil: attributes = nil
        case .map(let a)?:
            attributes = a
            present += 1
        case let other?: throw .param("\"attributes\" must be a map, not \(other.kindName)")
        }
        arguments = m.count == present ? [:] : m.filter { !Self.envelopeKeys.contains($0.key) }
    }
}

/// One response: `{"id": <same>, "status": <int>, "message": <text, on error>, "result": <value>}`.
public struct Response: Sendable {
    /// The id of the request this answers.
    public var id: Int64
    /// The outcome: `.success` or the error's `OSStatus`.
    public var status: Status
    /// The one-line error message, on error; never contains a secret.
    public var message: String?
    /// The operation's result (item, attributes, secret bytes, list), when it has one.
    public var result: Value?
    /// Set on errSecAuthFailed when the request needs the keychain passphrase (`keychainPassphrase`).
    public var needsPassphrase: Bool

    /// A response with these fields; by default a success carrying no result.
    public init(
        id: Int64, status: Status = .success, message: String? = nil, result: Value? = nil,
        needsPassphrase: Bool = false
    ) {
        self.id = id
        self.status = status
        self.message = message
        self.result = result
        self.needsPassphrase = needsPassphrase
    }

    /// The response reporting `error` for request `id`: its status, message and passphrase flag.
    public init(id: Int64, error: KeychainError) {
        self.init(id: id, status: error.status, message: error.message, needsPassphrase: error.needsPassphrase)
    }

    /// The response as one frame, written field by field in canonical key order (id, result, status,
    /// message, needsPassphrase): the same bytes as `Frame.encode(value)`, without building a map on
    /// the hot path.
    public func frame() -> [UInt8] {
        var out = SecretBytes(
            capacity: 64
                + (result.map {
                    if case .bytes(let b) = $0 { return b.count }
                    return 64
                } ?? 0))
        appendFrame(to: &out)
        return out.unprotectedArray
    }

    /// Appends the response's frame to `out`, in wiping storage: what the daemon sends (a result may
    /// hold an item's secret).
    public func appendFrame(to out: inout SecretBytes) {
        // The common answer (a success carrying one byte string, e.g. a copied secret, or nothing)
        // is written in one pass into room reserved once.
        if status == .success, message == nil, !needsPassphrase, id >= 0 {
            switch result {
            case nil: return Self.appendSuccess(id: UInt64(id), payloadCount: nil, to: &out) { _ in }
            case .secret(let s)?: return s.withUnsafeBytes { Self.appendSuccess(id: id, data: $0, to: &out) }
            case .bytes(let b)?: return b.withUnsafeBytes { Self.appendSuccess(id: id, data: $0, to: &out) }
            default: break
            }
        }
        let start = out.count
        out.append(contentsOf: [0, 0, 0, 0])
        write(into: &out)
        Frame.patchLength(&out, from: start)
    }

    /// Appends the frame of a success for request `id` whose result is `data` as a byte string: the
    /// bytes `Response(id: id, result: .bytes(data)).appendFrame(to:)` appends, written in one pass
    /// from where the data lies.
    public static func appendSuccess(id: Int64, data: UnsafeRawBufferPointer, to out: inout SecretBytes) {
        appendSuccess(id: id, count: data.count, to: &out) { $0.copyMemory(from: data) }
    }

    /// The same frame for a byte string of `count` bytes that `fill` writes straight into its place
    /// in `out`: an item's secret is opened there, in wiping storage, and nowhere else. When `fill`
    /// throws, nothing is appended, what it wrote is zeroed, and its error goes on.
    public static func appendSuccess<E: Error>(
        id: Int64, count: Int, to out: inout SecretBytes,
        filling fill: (UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) throws(E) {
        if id >= 0 { return try appendSuccess(id: UInt64(id), payloadCount: count, to: &out, filling: fill) }
        var data = SecretBytes(count: count)
        try data.withUnsafeMutableBytes(fill)
        Response(id: id, result: .secret(data)).appendFrame(to: &out)
    }

    /// The keys every response has, as CBOR text: appended whole instead of encoded each time.
    private static let idKey: [UInt8] = [0x62, 0x69, 0x64]  // "id"
    private static let resultKey: [UInt8] = [0x66, 0x72, 0x65, 0x73, 0x75, 0x6C, 0x74]  // "result"
    private static let successStatus: [UInt8] = [0x66, 0x73, 0x74, 0x61, 0x74, 0x75, 0x73, 0x00]  // "status": 0

    /// The frame of a success for request `id` with a byte-string result of `payloadCount` bytes
    /// written by `fill` (or no result, when nil): the same bytes `write(into:)` gives for it.
    @inline(__always)
    private static func appendSuccess<E: Error>(
        id: UInt64, payloadCount: Int?, to out: inout SecretBytes,
        filling fill: (UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) throws(E) {
        // The keys' bytes (as `idKey`, `resultKey` and `successStatus` hold them) written as integers:
        // no static arrays to reach and copy from on every answer.
        var body = 1 + 3 + CBOR.headCount(id) + 8
        if let payloadCount { body += 7 + CBOR.headCount(UInt64(payloadCount)) + payloadCount }
        _ = try out.append(upTo: 4 + body) { (raw) throws(E) -> Int in
            var c = CBOR.Cursor(raw)
            c.bigEndian(UInt32(body))
            c.head(5, payloadCount == nil ? 2 : 3)
            c.bigEndian(UInt16(0x6269))  // "id"
            c.byte(0x64)
            c.head(0, id)
            if let payloadCount {
                c.bigEndian(UInt32(0x6672_6573))  // "result"
                c.bigEndian(UInt16(0x756C))
                c.byte(0x74)
                c.head(2, UInt64(payloadCount))
                do throws(E) {
                    try c.fill(payloadCount, fill)
                } catch {
                    // (`fill` zeroed what it wrote; the head written before it holds no secret, and
                    // is zeroed too, so the room past the buffer's count keeps nothing of this answer.)
                    Zeroing.zero(UnsafeMutableRawBufferPointer(rebasing: raw[..<c.offset]))
                    throw error
                }
            }
            c.bigEndian(UInt64(0x6673_7461_7475_7300))  // "status": 0
            precondition(c.offset == 4 + body, "response frame size mismatch")
            return c.offset
        }
    }

    private func write(into out: inout SecretBytes) {
        CBOR.appendMapHeader(fieldCount, into: &out)
        out.append(contentsOf: Self.idKey)
        CBOR.encode(.int(id), into: &out)
        if let result {
            out.append(contentsOf: Self.resultKey)
            CBOR.encode(result, into: &out)
        }
        if status == .success {
            out.append(contentsOf: Self.successStatus)
        } else {
            CBOR.appendText("status", into: &out)
            CBOR.encode(.int(Int64(status.rawValue)), into: &out)
        }
        if let message {
            CBOR.appendText("message", into: &out)
            CBOR.encode(.text(message), into: &out)
        }
        if needsPassphrase {
            CBOR.appendText("needsPassphrase", into: &out)
            CBOR.encode(.bool(true), into: &out)
        }
    }

    private var fieldCount: Int { 2 + (result == nil ? 0 : 1) + (message == nil ? 0 : 1) + (needsPassphrase ? 1 : 0) }

    /// The response as a CBOR map (slower than `frame()`; for tests and clients that want a `Value`).
    public var value: Value {
        var m: [String: Value] = ["id": .int(id), "status": .int(Int64(status.rawValue))]
        if let message { m["message"] = .text(message) }
        if let result { m["result"] = result }
        if needsPassphrase { m["needsPassphrase"] = .bool(true) }
        return .map(m)
    }

    /// Decodes a response map; throws errSecDecode when it lacks an integer `id` or `status`.
    public init(_ value: Value) throws(KeychainError) {
        guard case .map(let m) = value else { throw KeychainError(.decode, "response is not a CBOR map") }
        guard case .int(let id)? = m["id"] else { throw KeychainError(.decode, "response lacks an integer \"id\"") }
        guard case .int(let s)? = m["status"], let s32 = Int32(exactly: s) else {
            throw KeychainError(.decode, "response lacks an integer \"status\"")
        }
        self.id = id
        self.status = Status(rawValue: s32)
        if case .text(let msg)? = m["message"] { message = msg } else { message = nil }
        result = m["result"]
        needsPassphrase = m["needsPassphrase"] == .bool(true)
    }

    /// Success, or the error this response carries.
    public func check() throws(KeychainError) {
        guard status != .success else { return }
        var error = KeychainError(status, message)
        error.needsPassphrase = needsPassphrase
        throw error
    }
}
