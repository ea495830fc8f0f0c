public import KeychainSystem

/// A strict CBOR (RFC 8949) codec for `Value`.
///
/// Strict means: definite lengths only, map keys must be text and unique, integers must fit in
/// `Int64`, only tag 1 (epoch date) is accepted, nesting and sizes are bounded, and the input must be
/// exactly one data item. Anything else is `KeychainError(.decode, …)` with a message that names the
/// problem and its offset, never the data.
public enum CBOR {
    /// Bounds on what a decoder accepts, so a hostile frame cannot exhaust the stack or memory.
    public struct Limits: Sendable {
        /// Deepest nesting of arrays and maps.
        public var maxDepth: Int
        /// Most elements in one array or entries in one map.
        public var maxCount: Int
        /// Limits of at most `maxDepth` nested arrays and maps and `maxCount` elements in each.
        public init(maxDepth: Int = 16, maxCount: Int = 4096) {
            self.maxDepth = maxDepth
            self.maxCount = maxCount
        }
        /// The daemon's limits: 16 levels of nesting, 4096 elements per array or map.
        public static let `default` = Limits()
    }

    // MARK: Encoding

    /// Encodes `value` as CBOR bytes in a plain array; use the `SecretBytes` overload when it may hold a secret.
    public static func encode(_ value: Value) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        encode(value, into: &out)
        return out
    }

    /// Appends the CBOR encoding of `value` to `out`, a plain array (not wiped when freed).
    public static func encode(_ value: Value, into out: inout [UInt8]) {
        write(value, into: &out)
    }

    /// Encodes into wiping storage: for values that may hold a secret (`Value.secret`).
    public static func encode(_ value: Value, into out: inout SecretBytes) {
        write(value, into: &out)
    }

    /// Appends a text string (for encoders that write maps field by field, in canonical key order).
    public static func appendText(_ t: String, into out: inout [UInt8]) {
        write(.text(t), into: &out)
    }

    /// Appends a text string into wiping storage.
    public static func appendText(_ t: String, into out: inout SecretBytes) {
        write(.text(t), into: &out)
    }

    /// Appends the head of a map of `count` entries.
    public static func appendMapHeader(_ count: Int, into out: inout [UInt8]) {
        writeHead(5, UInt64(count), &out)
    }

    /// Appends the head of a map of `count` entries into wiping storage.
    public static func appendMapHeader(_ count: Int, into out: inout SecretBytes) {
        writeHead(5, UInt64(count), &out)
    }

    /// How many bytes the head of a data item with argument `n` takes: 1, 2, 3, 5 or 9.
    public static func headCount(_ n: UInt64) -> Int {
        switch n {
        case 0..<24: 1
        case 24...0xFF: 2
        case 0x100...0xFFFF: 3
        case 0x1_0000...0xFFFF_FFFF: 5
        default: 9
        }
    }

    /// Writes bytes into memory sized beforehand (`headCount` and the lengths of what follows), for
    /// encoders that know a frame's size and fill it in one pass. Writing past the end traps.
    public struct Cursor {
        /// Where the bytes go.
        public let buffer: UnsafeMutableRawBufferPointer
        @usableFromInline var position = 0

        /// A cursor at the start of `buffer`.
        @inlinable public init(_ buffer: UnsafeMutableRawBufferPointer) { self.buffer = buffer }

        /// How many bytes have been written.
        @inlinable public var offset: Int { position }

        /// Writes one byte.
        @inlinable
        public mutating func byte(_ b: UInt8) {
            precondition(position < buffer.count, "CBOR cursor written past its end")
            buffer[position] = b
            position += 1
        }

        /// Writes `value` big-endian in its own width: a fixed run of bytes (an encoded key, a
        /// length header) stored at once, without an array to copy it from.
        @inlinable @inline(__always)
        public mutating func bigEndian<T: FixedWidthInteger>(_ value: T) {
            precondition(MemoryLayout<T>.size <= buffer.count - position, "CBOR cursor written past its end")
            (buffer.baseAddress! + position).storeBytes(of: value.bigEndian, as: T.self)
            position += MemoryLayout<T>.size
        }

        /// Lets `body` write the next `count` bytes in place (a byte string's content made where it
        /// goes). When `body` throws, the cursor stays where it was and the bytes it may have written
        /// are zeroed before the error goes on.
        @inlinable @inline(__always)
        public mutating func fill<E: Error>(
            _ count: Int, _ body: (UnsafeMutableRawBufferPointer) throws(E) -> Void
        ) throws(E) {
            precondition(count >= 0 && count <= buffer.count - position, "CBOR cursor written past its end")
            let region = UnsafeMutableRawBufferPointer(rebasing: buffer[position..<position + count])
            do throws(E) {
                try body(region)
            } catch {
                Zeroing.zero(region)
                throw error
            }
            position += count
        }

        /// Writes `bytes` as they are (an encoded key, a byte string's content).
        @inlinable
        public mutating func raw(_ bytes: UnsafeRawBufferPointer) {
            guard bytes.count > 0 else { return }
            precondition(bytes.count <= buffer.count - position, "CBOR cursor written past its end")
            (buffer.baseAddress! + position).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            position += bytes.count
        }

        /// Writes the head of a data item of major type `major` (0–7) with argument `n`, big-endian
        /// in the fewest bytes (RFC 8949 §4.2.1).
        @inlinable
        public mutating func head(_ major: UInt8, _ n: UInt64) {
            let m = major << 5
            let info: UInt8  // the additional information: how many bytes follow
            let following: Int
            switch n {
            case 0..<24:
                byte(m | UInt8(n))
                return
            case 24...0xFF: (info, following) = (24, 1)
            case 0x100...0xFFFF: (info, following) = (25, 2)
            case 0x1_0000...0xFFFF_FFFF: (info, following) = (26, 4)
            default: (info, following) = (27, 8)
            }
            byte(m | info)
            for i in stride(from: following - 1, through: 0, by: -1) {
                byte(UInt8(truncatingIfNeeded: n >> UInt64(i * 8)))
            }
        }
    }

    private static func write<Sink: CBORSink>(_ value: Value, into out: inout Sink) {
        switch value {
        case .int(let v):
            if v >= 0 { writeHead(0, UInt64(v), &out) } else { writeHead(1, UInt64(-1 - v), &out) }
        case .bytes(let b):
            writeHead(2, UInt64(b.count), &out)
            b.withUnsafeBytes { out.append(contentsOf: $0) }
        case .secret(let b):
            writeHead(2, UInt64(b.count), &out)
            b.withUnsafeBytes { out.append(contentsOf: $0) }
        case .text(let t):
            var t = t
            t.withUTF8 { utf8 in
                writeHead(3, UInt64(utf8.count), &out)
                out.append(contentsOf: UnsafeRawBufferPointer(utf8))
            }
        case .array(let a):
            writeHead(4, UInt64(a.count), &out)
            for e in a { write(e, into: &out) }
        case .map(let m):
            writeHead(5, UInt64(m.count), &out)
            // Deterministic order (RFC 8949 §4.2.1 core rule: shorter encoded key first, then bytewise).
            for k in m.keys.sorted(by: keyOrder) {
                write(.text(k), into: &out)
                write(m[k]!, into: &out)
            }
        case .bool(let b):
            out.append(b ? 0xF5 : 0xF4)
        case .null:
            out.append(0xF6)
        case .float(let d):
            writeFloat(d, &out)
        case .date(let d):
            writeHead(6, 1, &out)
            if d == d.rounded(), abs(d) < 9.0e15 {
                write(.int(Int64(d)), into: &out)
            } else {
                writeFloat(d, &out)
            }
        }
    }

    private static func keyOrder(_ a: String, _ b: String) -> Bool {
        let (ca, cb) = (a.utf8.count, b.utf8.count)
        if ca != cb { return ca < cb }
        return a.utf8.lexicographicallyPrecedes(b.utf8)
    }

    private static func writeFloat<Sink: CBORSink>(_ d: Double, _ out: inout Sink) {
        out.append(0xFB)
        let bits = d.bitPattern
        for shift in stride(from: 56, through: 0, by: -8) {
            out.append(UInt8(truncatingIfNeeded: bits >> UInt64(shift)))
        }
    }

    private static func writeHead<Sink: CBORSink>(_ major: UInt8, _ n: UInt64, _ out: inout Sink) {
        let m = major << 5
        switch n {
        case 0..<24:
            out.append(m | UInt8(n))
        case 24...0xFF:
            out.append(m | 24)
            out.append(UInt8(n))
        case 0x100...0xFFFF:
            out.append(m | 25)
            out.append(UInt8(n >> 8))
            out.append(UInt8(truncatingIfNeeded: n))
        case 0x1_0000...0xFFFF_FFFF:
            out.append(m | 26)
            for shift in stride(from: 24, through: 0, by: -8) {
                out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift)))
            }
        default:
            out.append(m | 27)
            for shift in stride(from: 56, through: 0, by: -8) {
                out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift)))
            }
        }
    }

    // MARK: Decoding

    /// Decodes exactly one data item from `bytes`; throws errSecDecode naming the problem and offset, never the data.
    public static func decode(
        _ bytes: [UInt8], limits: Limits = .default,
        secretKeys: Set<String> = []
    ) throws(KeychainError) -> Value {
        try withBytes(bytes) { (raw) throws(KeychainError) in try decode(raw, limits: limits, secretKeys: secretKeys) }
    }

    /// Decodes a frame body held in wiping storage.
    public static func decode(
        _ bytes: SecretBytes, limits: Limits = .default,
        secretKeys: Set<String> = []
    ) throws(KeychainError) -> Value {
        try bytes.withUnsafeBytes { (raw) throws(KeychainError) in
            try decode(raw, limits: limits, secretKeys: secretKeys)
        }
    }

    /// Decodes `bytes`. A byte string that is the value of a map key in `secretKeys` (at any depth),
    /// or an element of an array that is, becomes `Value.secret`, copied straight into wiping storage.
    public static func decode(
        _ bytes: UnsafeRawBufferPointer, limits: Limits = .default,
        secretKeys: Set<String> = []
    ) throws(KeychainError) -> Value {
        var reader = Reader(bytes: bytes, limits: limits, secretKeys: secretKeys)
        let value = try reader.readValue(depth: 0)
        if reader.offset != bytes.count {
            throw KeychainError(.decode, "CBOR: \(bytes.count - reader.offset) trailing bytes after the data item")
        }
        return value
    }

    /// The content of a text string as the decoder makes it: nil when it is not valid UTF-8. (For
    /// scanners that find a text string in encoded bytes and must read it exactly as `decode` would.)
    public static func text(_ content: UnsafeRawBufferPointer) -> String? {
        // ASCII (every key, most values) is valid UTF-8 as it is; only other text needs validating.
        if content.allSatisfy({ $0 < 0x80 }) { return String(decoding: content, as: UTF8.self) }
        return String(validating: content, as: UTF8.self)
    }

    /// Whether `text(content)` is non-nil (the bytes are valid UTF-8), without making the string
    /// for ASCII: a scanner that uses the bytes as they are accepts exactly what the decoder does.
    public static func isText(_ content: UnsafeRawBufferPointer) -> Bool {
        var i = 0
        var high: UInt64 = 0
        while i + 8 <= content.count {
            high |= content.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            i += 8
        }
        while i < content.count {
            high |= UInt64(content[i])
            i += 1
        }
        if high & 0x8080_8080_8080_8080 == 0 { return true }
        return String(validating: content, as: UTF8.self) != nil
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        let limits: Limits
        let secretKeys: Set<String>
        /// Bit n set when a secret key is n bytes long: most keys are ruled out without hashing them.
        let secretKeyLengths: UInt64
        var offset = 0

        init(bytes: UnsafeRawBufferPointer, limits: Limits, secretKeys: Set<String>) {
            self.bytes = bytes
            self.limits = limits
            self.secretKeys = secretKeys
            secretKeyLengths = secretKeys.reduce(0) { mask, key in
                key.utf8.count < 64 ? mask | (1 << UInt64(key.utf8.count)) : mask
            }
        }

        func isSecretKey(_ key: String) -> Bool {
            let n = key.utf8.count
            guard n < 64, secretKeyLengths & (1 << UInt64(n)) != 0 else { return false }
            return secretKeys.contains(key)
        }

        func fail(_ what: String) -> KeychainError {
            KeychainError(.decode, "CBOR: \(what) at offset \(offset)")
        }

        mutating func byte() throws(KeychainError) -> UInt8 {
            guard offset < bytes.count else { throw fail("unexpected end of input") }
            let b = bytes[offset]
            offset += 1
            return b
        }

        mutating func uint(_ count: Int) throws(KeychainError) -> UInt64 {
            guard bytes.count - offset >= count else { throw fail("unexpected end of input") }
            var n: UInt64 = 0
            for i in 0..<count { n = (n << 8) | UInt64(bytes[offset + i]) }
            offset += count
            return n
        }

        /// The argument of a head with additional info `info`; indefinite lengths are refused.
        mutating func argument(_ info: UInt8) throws(KeychainError) -> UInt64 {
            switch info {
            case 0..<24: return UInt64(info)
            case 24: return try uint(1)
            case 25: return try uint(2)
            case 26: return try uint(4)
            case 27: return try uint(8)
            case 31: throw fail("indefinite length is not accepted")
            default: throw fail("reserved additional information \(info)")
            }
        }

        mutating func length(_ info: UInt8) throws(KeychainError) -> Int {
            let n = try argument(info)
            guard n <= UInt64(bytes.count - offset) else { throw fail("length \(n) exceeds the input") }
            return Int(n)
        }

        mutating func readText(_ info: UInt8) throws(KeychainError) -> String {
            let n = try length(info)
            guard let s = CBOR.text(UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + n])) else {
                throw fail("text string is not valid UTF-8")
            }
            offset += n
            return s
        }

        mutating func readValue(depth: Int, secret: Bool = false) throws(KeychainError) -> Value {
            let head = try byte()
            let major = head >> 5
            let info = head & 0x1F
            switch major {
            case 0:
                let n = try argument(info)
                guard n <= UInt64(Int64.max) else { throw fail("integer does not fit in 64 signed bits") }
                return .int(Int64(n))
            case 1:
                let n = try argument(info)
                guard n <= UInt64(Int64.max) else { throw fail("integer does not fit in 64 signed bits") }
                return .int(-1 - Int64(n))
            case 2:
                let n = try length(info)
                let raw = UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + n])
                offset += n
                return secret ? .secret(SecretBytes(copying: raw)) : .bytes(Array(raw))
            case 3:
                return .text(try readText(info))
            case 4:
                guard depth < limits.maxDepth else { throw fail("nesting deeper than \(limits.maxDepth)") }
                let n = try argument(info)
                guard n <= UInt64(limits.maxCount) else {
                    throw fail("array of \(n) elements exceeds \(limits.maxCount)")
                }
                guard n <= UInt64(bytes.count - offset) else { throw fail("array length exceeds the input") }
                var a: [Value] = []
                a.reserveCapacity(Int(n))
                for _ in 0..<n { a.append(try readValue(depth: depth + 1, secret: secret)) }
                return .array(a)
            case 5:
                guard depth < limits.maxDepth else { throw fail("nesting deeper than \(limits.maxDepth)") }
                let n = try argument(info)
                guard n <= UInt64(limits.maxCount) else { throw fail("map of \(n) entries exceeds \(limits.maxCount)") }
                guard n <= UInt64(bytes.count - offset) / 2 else { throw fail("map length exceeds the input") }
                var m: [String: Value] = [:]
                m.reserveCapacity(Int(n))
                for _ in 0..<n {
                    let keyHead = try byte()
                    guard keyHead >> 5 == 3 else { throw fail("map key is not a text string") }
                    let key = try readText(keyHead & 0x1F)
                    let value = try readValue(depth: depth + 1, secret: secretKeyLengths != 0 && isSecretKey(key))
                    guard m.updateValue(value, forKey: key) == nil else { throw fail("duplicate map key") }
                }
                return .map(m)
            case 6:
                let tag = try argument(info)
                guard tag == 1 else { throw fail("tag \(tag) is not accepted (only tag 1, epoch date)") }
                // Only a number may follow (major 0, 1 or 7): checking the head first keeps a chain of
                // tags from recursing once per byte (a 1 MiB frame of 0xC1 overflowed the stack).
                guard offset < bytes.count, [0, 1, 7].contains(bytes[offset] >> 5) else {
                    throw fail("tag 1 must hold an integer or a finite float")
                }
                switch try readValue(depth: depth + 1) {
                case .int(let s): return .date(Double(s))
                case .float(let d) where d.isFinite: return .date(d)
                default: throw fail("tag 1 must hold an integer or a finite float")
                }
            default:
                switch info {
                case 20: return .bool(false)
                case 21: return .bool(true)
                case 22: return .null
                case 25:
                    return .float(Double(Self.halfToFloat(UInt16(try uint(2)))))
                case 26:
                    return .float(Double(Float(bitPattern: UInt32(try uint(4)))))
                case 27:
                    return .float(Double(bitPattern: try uint(8)))
                default:
                    throw fail("simple value \(info) is not accepted")
                }
            }
        }

        static func halfToFloat(_ h: UInt16) -> Float {
            let sign: Float = (h & 0x8000) != 0 ? -1 : 1
            let exp = Int((h >> 10) & 0x1F)
            let mant = Float(h & 0x3FF)
            switch exp {
            case 0: return sign * mant * Float(sign: .plus, exponent: -24, significand: 1)
            case 31: return mant == 0 ? sign * .infinity : .nan
            default: return sign * (1 + mant / 1024) * Float(sign: .plus, exponent: exp - 15, significand: 1)
            }
        }
    }
}

/// Where the encoder writes: an ordinary array, or wiping storage for values holding secrets.
protocol CBORSink {
    mutating func append(_ byte: UInt8)
    mutating func append(contentsOf bytes: UnsafeRawBufferPointer)
}

extension Array: CBORSink where Element == UInt8 {}
extension SecretBytes: CBORSink {}
