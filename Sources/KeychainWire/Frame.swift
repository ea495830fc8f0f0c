#if canImport(Glibc)
import Glibc
#endif
import KeychainCore

/// Framing of the wire protocol: a 4-byte big-endian length, then that many bytes of one CBOR map.
public enum Frame {
    /// Default largest frame body a peer accepts (SPEC §4 `maxFrameBytes`).
    public static let defaultMaxBytes = 1 << 20

    /// The frame for `value`: header and CBOR body in one buffer, ready to write.
    public static func encode(_ value: Value) -> [UInt8] {
        var out: [UInt8] = [0, 0, 0, 0]
        CBOR.encode(value, into: &out)
        patchLength(&out)
        return out
    }

    /// Writes the body length into the 4 header bytes reserved at the start of `frame`.
    public static func patchLength(_ frame: inout [UInt8]) {
        patchLength(&frame, at: 0)
    }

    /// The same for a frame that starts at `start` and runs to the end of `buffer`.
    public static func patchLength(_ buffer: inout [UInt8], at start: Int) {
        let n = UInt32(buffer.count - start - 4)
        buffer[start] = UInt8(n >> 24)
        buffer[start + 1] = UInt8(truncatingIfNeeded: n >> 16)
        buffer[start + 2] = UInt8(truncatingIfNeeded: n >> 8)
        buffer[start + 3] = UInt8(truncatingIfNeeded: n)
    }
}

/// Collects bytes read from a stream and cuts them into frame bodies.
///
/// `append` what was read, then call `next()` until it returns nil. A header announcing more than
/// `maxBytes` throws at once, before the body arrives, so a client cannot make the reader buffer it.
public struct FrameBuffer: Sendable {
    /// The largest body accepted; may change between reads (it grows once a peer is identified).
    public var maxBytes: Int
    private var storage: [UInt8] = []
    private var start = 0

    public init(maxBytes: Int = Frame.defaultMaxBytes) {
        self.maxBytes = maxBytes
    }

    /// Bytes held that do not yet form a whole frame.
    public var pendingCount: Int { storage.count - start }

    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        compact()
        storage.append(contentsOf: bytes)
    }

    public mutating func append(_ bytes: [UInt8]) {
        compact()
        storage.append(contentsOf: bytes)
    }

    /// The next complete frame body, or nil when more bytes are needed.
    public mutating func next() throws(KeychainError) -> [UInt8]? {
        guard storage.count - start >= 4 else { return nil }
        let n = Int(storage[start]) << 24 | Int(storage[start + 1]) << 16 | Int(storage[start + 2]) << 8 | Int(storage[start + 3])
        guard n <= maxBytes else {
            throw KeychainError(.param, "frame of \(n) bytes exceeds the limit of \(maxBytes) bytes")
        }
        guard storage.count - start - 4 >= n else { return nil }
        let body = Array(storage[(start + 4)..<(start + 4 + n)])
        // Requests can carry secrets and passphrases: wipe what was handed out before the buffer
        // is reused or compacted.
        storage.withUnsafeMutableBytes { raw in
            _ = memset(raw.baseAddress! + start, 0, 4 + n)
        }
        start += 4 + n
        if start == storage.count { storage.removeAll(keepingCapacity: storage.capacity <= 64 * 1024); start = 0 }
        return body
    }

    private mutating func compact() {
        if start > 0 && start >= storage.count / 2 {
            storage.removeFirst(start)
            start = 0
        }
    }
}
