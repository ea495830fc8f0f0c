import CSodium
public import KeychainCore

/// Long-lived key material in libsodium guarded memory: `sodium_malloc` (guard pages, `mlock`ed when the
/// limit allows), read-only once filled, zeroed and unmapped by `sodium_free` on deinit.
///
/// `description` shows only the length. Allocation costs a few system calls (≈15 µs), so this type is
/// for keys that live as long as the daemon; per-request material uses plain buffers + `Sodium.zero`.
///
/// Each allocation maps a few pages of its own (guard pages around the data), so a process runs out
/// of them long before it runs out of memory: the kernel's limit on mappings (`vm.max_map_count`,
/// 65 530 by default) allows about 16 000 live regions. Running out is `errSecAllocate`, not a crash.
public final class SecureBytes: @unchecked Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    // Safety: the memory is written only inside the initialiser and read-only afterwards.
    @usableFromInline let pointer: UnsafeMutableRawPointer
    /// Length of the key material in bytes (never 0).
    public let count: Int

    /// Guarded memory of `count` bytes, filled by `fill` and then made read-only; errSecAllocate when
    /// the kernel gives no more mappings or memory (nothing is left allocated then).
    public init(count: Int, fill: (UnsafeMutableRawBufferPointer) -> Void) throws(KeychainError) {
        precondition(count > 0, "SecureBytes must not be empty")
        Sodium.ensureInitialized()
        guard let p = sodium_malloc(count) else { throw SecureBytes.exhausted }
        let buffer = UnsafeMutableRawBufferPointer(start: p, count: count)
        Sodium.zero(buffer)
        fill(buffer)
        // mprotect fails only when the kernel cannot split the mapping (out of memory or of map
        // entries): the same condition as a failed sodium_malloc above, treated the same way.
        guard sodium_mprotect_readonly(p) == 0 else {
            sodium_free(p)  // zeroes what `fill` wrote
            throw SecureBytes.exhausted
        }
        pointer = p
        self.count = count
    }

    /// `count` random bytes.
    public convenience init(random count: Int) throws(KeychainError) {
        try self.init(count: count) { Sodium.randomFill($0) }
    }

    /// A guarded copy of `bytes` (the caller zeroes its own copy).
    public convenience init(copying bytes: UnsafeRawBufferPointer) throws(KeychainError) {
        try self.init(count: bytes.count) { $0.copyMemory(from: bytes) }
    }

    /// What a failed allocation of guarded memory is.
    public static let exhausted = KeychainError(
        .allocate, "out of guarded memory for keys (the process's memory mappings are used up)")

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
