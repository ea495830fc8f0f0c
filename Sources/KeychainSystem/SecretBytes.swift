import Glibc

/// Bytes that may be a secret (an item's `v_Data`, a passphrase, a frame that carries one): a
/// copy-on-write buffer that zeroes its memory before freeing it, and zeroes the old buffer whenever
/// it grows into a new one — so no copy is left behind in freed heap memory.
///
/// The shape of swift-crypto's `SecureBytes`: a value type over a class that owns the memory. Copies
/// share the buffer until one of them is changed. `description` shows only the length; equality is
/// compared in constant time and hashing uses the length alone, so neither leaks the content.
public struct SecretBytes: @unchecked Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    // Safety: `storage` is written only through the mutating members below, which first make it
    // unique (isKnownUniquelyReferenced) — the copy-on-write discipline of Array's buffer — so a
    // storage shared between threads is only ever read.
    @usableFromInline var storage: Storage

    /// `count` zero bytes.
    public init(count: Int = 0) {
        storage = Storage.make(capacity: count)
        storage.pointer.initializeMemory(as: UInt8.self, repeating: 0, count: count)
        storage.count = count
    }

    /// An empty buffer with room for `capacity` bytes before it must grow.
    public init(capacity: Int) {
        storage = Storage.make(capacity: capacity)
    }

    /// A copy of `bytes` (the caller wipes its own copy if it must).
    public init(copying bytes: UnsafeRawBufferPointer) {
        storage = Storage.make(capacity: bytes.count)
        append(contentsOf: bytes)
    }

    /// A copy of `bytes` (the caller wipes its own copy if it must).
    public init(_ bytes: some Collection<UInt8>) {
        storage = Storage.make(capacity: bytes.count)
        storage.count = bytes.count
        UnsafeMutableRawBufferPointer(start: storage.pointer, count: bytes.count).copyBytes(from: bytes)
    }

    /// The number of bytes.
    @inlinable public var count: Int { storage.count }
    /// Whether there are no bytes.
    @inlinable public var isEmpty: Bool { storage.count == 0 }
    /// How many bytes fit before the buffer must grow.
    @inlinable public var capacity: Int { storage.room }

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
        makeUnique(capacity: storage.room)
        return try body(UnsafeMutableRawBufferPointer(start: storage.pointer, count: storage.count))
    }

    /// Makes room for `capacity` bytes in all.
    public mutating func reserveCapacity(_ capacity: Int) {
        if capacity > storage.room || !isKnownUniquelyReferenced(&storage) {
            makeUnique(capacity: Swift.max(capacity, storage.room))
        }
    }

    /// Appends `bytes`, growing (into a new buffer, the old one zeroed) when needed.
    @inlinable
    public mutating func append(contentsOf bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        let needed = storage.count + bytes.count
        if needed > storage.room || !isKnownUniquelyReferenced(&storage) {
            makeUnique(capacity: needed > storage.room ? Swift.max(needed, storage.room * 2, 64) : storage.room)
        }
        (storage.pointer + storage.count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        storage.count = needed
    }

    /// Lets `body` write up to `count` bytes straight after the bytes held (growing first when
    /// needed) and keeps as many as it says it wrote: reading from a socket without a second buffer.
    /// `body` must write no more than it reports.
    @inlinable
    public mutating func append<E: Error>(
        upTo count: Int, _ body: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) -> Int {
        let needed = storage.count + count
        if needed > storage.room || !isKnownUniquelyReferenced(&storage) {
            makeUnique(capacity: needed > storage.room ? Swift.max(needed, storage.room * 2, 64) : storage.room)
        }
        let written = try body(UnsafeMutableRawBufferPointer(start: storage.pointer + storage.count, count: count))
        precondition(written >= 0 && written <= count, "wrote outside the space given")
        storage.count += written
        return written
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
    @inlinable
    public mutating func append(_ byte: UInt8) {
        if storage.count < storage.room && isKnownUniquelyReferenced(&storage) {
            storage.pointer.storeBytes(of: byte, toByteOffset: storage.count, as: UInt8.self)
            storage.count += 1
        } else {
            var b = byte
            Swift.withUnsafeBytes(of: &b) { append(contentsOf: $0) }
        }
    }

    /// Drops the first `n` bytes, moving the rest to the front and zeroing what was behind them.
    public mutating func removeFirst(_ n: Int) {
        precondition(n >= 0 && n <= count, "removeFirst beyond the end")
        guard n > 0 else { return }
        makeUnique(capacity: storage.room)
        let rest = storage.count - n
        if rest > 0 { storage.pointer.copyMemory(from: storage.pointer + n, byteCount: rest) }
        explicit_bzero(storage.pointer + rest, n)
        storage.count = rest
    }

    /// Drops the last `n` bytes, zeroing them.
    public mutating func removeLast(_ n: Int) {
        precondition(n >= 0 && n <= count, "removeLast beyond the start")
        guard n > 0 else { return }
        makeUnique(capacity: storage.room)
        storage.count -= n
        explicit_bzero(storage.pointer + storage.count, n)
    }

    /// Zeroes and empties the buffer, keeping its capacity when `keepingCapacity`.
    public mutating func removeAll(keepingCapacity: Bool = false) {
        if keepingCapacity && isKnownUniquelyReferenced(&storage) {
            // Bytes past `count` never hold anything kept (every way of shrinking zeroes what it
            // drops), so zeroing what is in use is enough.
            explicit_bzero(storage.pointer, storage.count)
            storage.count = 0
        } else {
            storage = Storage.make(capacity: keepingCapacity ? storage.room : 0)
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
        if isKnownUniquelyReferenced(&storage) && capacity == storage.room { return }
        let copy = Storage.make(capacity: Swift.max(capacity, storage.count))
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
    /// No children for `dump` and debuggers: the length only, as `description`.
    public var customMirror: Mirror { Mirror(self, children: [:]) }
    /// The length only, never the bytes.
    public var debugDescription: String { description }

    /// The memory, allocated with the object (one allocation, as an array's), zeroed in full
    /// (capacity, not just count) before it is freed.
    @usableFromInline
    final class Storage: ManagedBuffer<StorageHeader, UInt8> {

        /// A buffer with room for `capacity` bytes (its content undefined until written).
        @usableFromInline
        static func make(capacity: Int) -> Storage {
            let size = Swift.max(capacity, 1)
            let buffer = Storage.create(minimumCapacity: size) { _ in StorageHeader(count: 0, room: size) }
            return unsafeDowncast(buffer, to: Storage.self)
        }

        /// The first byte (stable for the object's life).
        @inlinable
        var pointer: UnsafeMutableRawPointer {
            withUnsafeMutablePointerToElements { UnsafeMutableRawPointer($0) }
        }

        // The header through its pointer, not `header`: that is a class property, and every access
        // to it would pay Swift's dynamic exclusivity check (tens of instructions, several times per
        // byte appended). The copy-on-write discipline above already makes writes exclusive.

        /// Bytes in use.
        @inlinable
        var count: Int {
            get { withUnsafeMutablePointerToHeader { $0.pointee.count } }
            set { withUnsafeMutablePointerToHeader { $0.pointee.count = newValue } }
        }

        /// Bytes that fit without growing (what was asked for; the allocation may be larger).
        @inlinable
        var room: Int { withUnsafeMutablePointerToHeader { $0.pointee.room } }

        deinit {
            withUnsafeMutablePointerToElements { explicit_bzero($0, room) }
        }
    }
}

/// The count and room kept in front of a `SecretBytes` buffer.
@usableFromInline
struct StorageHeader {
    @usableFromInline var count: Int
    @usableFromInline let room: Int

    @usableFromInline
    init(count: Int, room: Int) {
        self.count = count
        self.room = room
    }
}
