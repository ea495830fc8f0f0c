import CSodium

/// Long-lived key material in libsodium guarded memory: `sodium_malloc` (guard pages, `mlock`ed when the
/// limit allows), read-only once filled, zeroed and unmapped by `sodium_free` on deinit.
///
/// `description` shows only the length. Allocation costs a few system calls (≈15 µs), so this type is
/// for keys that live as long as the daemon; per-request material uses plain buffers + `Sodium.zero`.
public final class SecureBytes: @unchecked Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    // Safety: the memory is written only inside the initialiser and read-only afterwards.
    @usableFromInline let pointer: UnsafeMutableRawPointer
    /// Length of the key material in bytes (never 0).
    public let count: Int

    /// Guarded memory of `count` bytes, filled by `fill` and then made read-only.
    public init(count: Int, fill: (UnsafeMutableRawBufferPointer) -> Void) {
        precondition(count > 0, "SecureBytes must not be empty")
        Sodium.ensureInitialized()
        guard let p = sodium_malloc(count) else { fatalError("sodium_malloc(\(count)) failed: out of memory") }
        pointer = p
        self.count = count
        let buffer = UnsafeMutableRawBufferPointer(start: p, count: count)
        Sodium.zero(buffer)
        fill(buffer)
        // mprotect fails only when the kernel cannot split the mapping (out of memory or of map
        // entries): the same condition as a failed sodium_malloc above, treated the same way.
        guard sodium_mprotect_readonly(p) == 0 else { fatalError("sodium_mprotect_readonly failed: out of memory") }
    }

    /// `count` random bytes.
    public convenience init(random count: Int) {
        self.init(count: count) { Sodium.randomFill($0) }
    }

    /// A guarded copy of `bytes` (the caller zeroes its own copy).
    public convenience init(copying bytes: UnsafeRawBufferPointer) {
        self.init(count: bytes.count) { $0.copyMemory(from: bytes) }
    }

    /// Calls `body` with the read-only bytes; the pointer is valid only inside `body` and must not escape.
    @inlinable
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    deinit {
        sodium_free(pointer)  // makes the region writable, zeroes it, unmaps it
    }

    /// `SecureBytes(<n> bytes)`: the length only, never the bytes.
    public var description: String { "SecureBytes(\(count) bytes)" }
    /// The same length-only text as `description`; never the bytes.
    public var debugDescription: String { description }
}
