public import KeychainCore
public import KeychainSystem

/// Framing of the wire protocol: a 4-byte big-endian length, then that many bytes of one CBOR map.
public enum Frame {
    /// Default largest frame body a peer accepts (docs/protocol.md §2, `maxFrameBytes`).
    public static let defaultMaxBytes = 1 << 20

    /// The frame for `value`: header and CBOR body in one buffer, ready to write.
    public static func encode(_ value: Value) -> [UInt8] {
        var out: [UInt8] = [0, 0, 0, 0]
        CBOR.encode(value, into: &out)
        patchLength(&out)
        return out
    }

    /// The frame for `value` in wiping storage: for requests and responses that may carry a secret.
    public static func encodeSecret(_ value: Value) -> SecretBytes {
        var out = SecretBytes(capacity: 256)
        out.append(contentsOf: [0, 0, 0, 0])
        CBOR.encode(value, into: &out)
        patchLength(&out, from: 0)
        return out
    }

    /// Writes the length of the body that follows `start + 4` into the 4 header bytes at `start`.
    public static func patchLength(_ frame: inout SecretBytes, from start: Int) {
        let n = UInt32(frame.count - start - 4)
        frame.withUnsafeMutableBytes { b in
            b[start] = UInt8(n >> 24)
            b[start + 1] = UInt8(truncatingIfNeeded: n >> 16)
            b[start + 2] = UInt8(truncatingIfNeeded: n >> 8)
            b[start + 3] = UInt8(truncatingIfNeeded: n)
        }
    }

    /// Writes the body length into the 4 header bytes reserved at the start of `frame`.
    public static func patchLength(_ frame: inout [UInt8]) {
        let n = UInt32(frame.count - 4)
        frame[0] = UInt8(n >> 24)
        frame[1] = UInt8(truncatingIfNeeded: n >> 16)
        frame[2] = UInt8(truncatingIfNeeded: n >> 8)
        frame[3] = UInt8(truncatingIfNeeded: n)
    }
}

/// Collects bytes read from a stream and cuts them into frame bodies.
///
/// `append` what was read, then call `next()` until it returns nil. A header announcing more than
/// `maxBytes` throws at once, before the body arrives, so a client cannot make the reader buffer it.
public struct FrameBuffer: Sendable {
    /// The largest body accepted; may change between reads (it grows once a peer is identified).
    public var maxBytes: Int
    // Requests can carry secrets and passphrases: the bytes live in wiping storage, so growing,
    // compacting and freeing the buffer leave no copy behind.
    private var storage = SecretBytes()
    private var start = 0

    /// An empty buffer that rejects a frame body longer than `maxBytes`.
    public init(maxBytes: Int = Frame.defaultMaxBytes) {
        self.maxBytes = maxBytes
    }

    /// Bytes held that do not yet form a whole frame.
    public var pendingCount: Int { storage.count - start }

    /// How many bytes the buffer holds before it must grow.
    public var capacity: Int { storage.capacity }

    /// Appends bytes read from the stream, copied into wiping storage.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        compact()
        storage.append(contentsOf: bytes)
    }

    /// Lets `receive` write up to `count` bytes straight into the buffer (a socket read without an
    /// intermediate buffer); returns what `receive` returned (0: end of stream). While the buffer has
    /// room for a useful read (`count`, or 4 KiB when that is less) it reads into that room instead
    /// of growing, so a partial frame held at a read does not double a connection's buffer.
    public mutating func receive<E: Error>(
        upTo count: Int, _ receive: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) -> Int {
        compact()
        let spare = storage.capacity - storage.count
        let useful = Swift.min(count, 4 * 1024)
        return try storage.append(upTo: spare >= useful ? Swift.min(count, spare) : count, receive)
    }

    /// Appends bytes read from the stream, copied into wiping storage (the array itself is not wiped).
    public mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// The next complete frame body, or nil when more bytes are needed.
    public mutating func next() throws(KeychainError) -> SecretBytes? {
        try withNextFrame { SecretBytes(copying: $0) }
    }

    /// Lends the next complete frame body to `body` where it lies in the buffer (no copy is made),
    /// then wipes it and lets it go; nil, without calling `body`, when more bytes are needed. The
    /// bytes are valid only inside `body`.
    public mutating func withNextFrame<R>(_ body: (UnsafeRawBufferPointer) -> R) throws(KeychainError) -> R? {
        guard let n = try completeBodyCount() else { return nil }
        let frame = start..<(start + 4 + n)
        let result = storage.withUnsafeMutableBytes { raw in
            defer {
                // Wipe what was handed out before the buffer is reused or compacted.
                Zeroing.zero(UnsafeMutableRawBufferPointer(rebasing: raw[frame]))
            }
            return body(UnsafeRawBufferPointer(rebasing: raw[(frame.lowerBound + 4)..<frame.upperBound]))
        }
        start = frame.upperBound
        if start == storage.count {
            storage.removeAll(keepingCapacity: storage.count <= 64 * 1024)
            start = 0
        }
        return result
    }

    /// The length of the frame body at `start` when all of it is here; nil when more bytes are
    /// needed; throws when its header announces more than `maxBytes`.
    private func completeBodyCount() throws(KeychainError) -> Int? {
        guard storage.count - start >= 4 else { return nil }
        let n = storage.withUnsafeBytes { raw in
            Int(raw[start]) << 24 | Int(raw[start + 1]) << 16 | Int(raw[start + 2]) << 8 | Int(raw[start + 3])
        }
        guard n <= maxBytes else {
            throw KeychainError(.param, "frame of \(n) bytes exceeds the limit of \(maxBytes) bytes")
        }
        guard storage.count - start - 4 >= n else { return nil }
        return n
    }

    private mutating func compact() {
        if start > 0 && start >= storage.count / 2 {
            storage.removeFirst(start)
            start = 0
        }
    }
}
