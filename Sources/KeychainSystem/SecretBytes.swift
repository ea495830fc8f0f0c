import Glibc

/// Bytes that may be a secret (an item's `v_Data`, a passphrase, a frame that carries one): a
/// copy-on-write buffer that zeroes its memory before freeing it, and zeroes the old buffer whenever
/// it grows into a new one — so no copy is left behind in freed heap memory.
///
/// The shape of swift-crypto's `SecureBytes`: a value type over a class that owns the memory. Copies
/// share the buffer until one of them is changed. `description` shows only the length; equality is
/// compared in constant time and hashing uses the length alone, so neither leaks the content.
public struct SecretBytes: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    @usableFromInline var storage: Storage

    /// `count` zero bytes.
    public init(count: Int = 0) {
        storage = Storage(capacity: count)
        storage.count = count
    }

    /// An empty buffer with room for `capacity` bytes before it must grow.
    public init(capacity: Int) {
        storage = Storage(capacity: capacity)
    }

    /// A copy of `bytes` (the caller wipes its own copy if it must).
    public init(copying bytes: UnsafeRawBufferPointer) {
        storage = Storage(capacity: bytes.count)
        append(contentsOf: bytes)
    }

    /// A copy of `bytes` (the caller wipes its own copy if it must).
    public init(_ bytes: some Collection<UInt8>) {
        storage = Storage(capacity: bytes.count)
        storage.count = bytes.count
        let buffer = UnsafeMutableRawBufferPointer(start: storage.pointer, count: bytes.count)
        _ = buffer.copyBytes(from: bytes) as Void?
    }

    /// The number of bytes.
    public var count: Int { storage.count }
    /// Whether there are no bytes.
    public var isEmpty: Bool { storage.count == 0 }

    /// The bytes as an ordinary array: a copy nothing will wipe. Only for handing a secret to code
    /// that takes arrays and owns the result (an app's own `Data`).
    public var unprotectedArray: [UInt8] { withUnsafeBytes { Array($0) } }

    /// Runs `body` with the bytes (valid only inside it).
    @inlinable
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: storage.pointer, count: storage.count))
    }

    /// Runs `body` with the bytes, writable (copying them first when they are shared).
    @inlinable
    public mutating func withUnsafeMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R)
        throws(E) -> R
    {
        makeUnique(capacity: storage.capacity)
        return try body(UnsafeMutableRawBufferPointer(start: storage.pointer, count: storage.count))
    }

    /// Makes room for `capacity` bytes in all.
    public mutating func reserveCapacity(_ capacity: Int) {
        if capacity > storage.capacity || !isKnownUniquelyReferenced(&storage) {
            makeUnique(capacity: Swift.max(capacity, storage.capacity))
        }
    }

    /// Appends `bytes`, growing (into a new buffer, the old one zeroed) when needed.
    public mutating func append(contentsOf bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        let needed = storage.count + bytes.count
        if needed > storage.capacity || !isKnownUniquelyReferenced(&storage) {
            makeUnique(
                capacity: needed > storage.capacity ? Swift.max(needed, storage.capacity * 2, 64) : storage.capacity)
        }
        (storage.pointer + storage.count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        storage.count = needed
    }

    /// Appends the bytes of `other`.
    public mutating func append(contentsOf other: SecretBytes) {
        other.withUnsafeBytes { append(contentsOf: $0) }
    }

    /// Appends `bytes` (an array holding no secret, or one the caller wipes).
    public mutating func append(contentsOf bytes: [UInt8]) {
        bytes.withUnsafeBytes { append(contentsOf: $0) }
    }

    /// Appends one byte.
    public mutating func append(_ byte: UInt8) {
        var b = byte
        Swift.withUnsafeBytes(of: &b) { append(contentsOf: $0) }
    }

    /// Drops the first `n` bytes, moving the rest to the front and zeroing what was behind them.
    public mutating func removeFirst(_ n: Int) {
        precondition(n >= 0 && n <= count, "removeFirst beyond the end")
        guard n > 0 else { return }
        makeUnique(capacity: storage.capacity)
        let rest = storage.count - n
        if rest > 0 { storage.pointer.copyMemory(from: storage.pointer + n, byteCount: rest) }
        explicit_bzero(storage.pointer + rest, n)
        storage.count = rest
    }

    /// Zeroes and empties the buffer, keeping its capacity when `keepingCapacity`.
    public mutating func removeAll(keepingCapacity: Bool = false) {
        if keepingCapacity && isKnownUniquelyReferenced(&storage) {
            explicit_bzero(storage.pointer, storage.capacity)
            storage.count = 0
        } else {
            storage = Storage(capacity: keepingCapacity ? storage.capacity : 0)
        }
    }

    /// Bytes `range` as a new buffer.
    public func extracting(_ range: Range<Int>) -> SecretBytes {
        precondition(range.lowerBound >= 0 && range.upperBound <= count, "range beyond the end")
        return withUnsafeBytes { SecretBytes(copying: UnsafeRawBufferPointer(rebasing: $0[range])) }
    }

    /// The byte at `index`.
    public subscript(index: Int) -> UInt8 {
        precondition(index >= 0 && index < count, "index out of range")
        return storage.pointer.load(fromByteOffset: index, as: UInt8.self)
    }

    @usableFromInline
    mutating func makeUnique(capacity: Int) {
        if isKnownUniquelyReferenced(&storage) && capacity == storage.capacity { return }
        let copy = Storage(capacity: Swift.max(capacity, storage.count))
        copy.pointer.copyMemory(from: storage.pointer, byteCount: storage.count)
        copy.count = storage.count
        storage = copy  // the old buffer is zeroed when its last holder lets go
    }

    /// Constant time in the content (the lengths may differ quickly).
    public static func == (a: SecretBytes, b: SecretBytes) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<a.count { difference |= a[i] ^ b[i] }
        return difference == 0
    }

    /// The length only: equal values have equal lengths, and the content stays out of hash tables.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
    }

    /// The length only, never the bytes.
    public var description: String { "<\(count) secret bytes>" }
    /// The length only, never the bytes.
    public var debugDescription: String { description }

    /// The memory: malloc'ed, zeroed in full (capacity, not just count) before it is freed.
    @usableFromInline
    final class Storage: @unchecked Sendable {
        // Safety: written only through SecretBytes' mutating members, which first make the storage
        // unique (isKnownUniquelyReferenced) — the copy-on-write discipline of Array's buffer — so a
        // storage shared between threads is only ever read.
        @usableFromInline let pointer: UnsafeMutableRawPointer
        @usableFromInline let capacity: Int
        @usableFromInline var count = 0

        init(capacity: Int) {
            self.capacity = capacity
            guard let p = calloc(Swift.max(capacity, 1), 1) else { fatalError("out of memory") }
            pointer = p
        }

        deinit {
            explicit_bzero(pointer, capacity)
            free(pointer)
        }
    }
}
