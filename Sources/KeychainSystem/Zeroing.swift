import Glibc

/// Zeroing that the compiler cannot drop as a dead store (`explicit_bzero`), for buffers that held
/// secrets and are about to be reused or freed.
public enum Zeroing {
    /// Overwrites `buffer` with zeros.
    public static func zero(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        explicit_bzero(base, buffer.count)
    }

    /// Overwrites an array's bytes with zeros (its count stays).
    public static func zero(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { zero($0) }
    }

    /// Zeroes the storage of an array in place even when the storage is shared with other copies:
    /// every holder sees zeros afterwards. Only for secrets that are about to be dropped.
    public static func zeroShared(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { b in
            guard let base = b.baseAddress, b.count > 0 else { return }
            explicit_bzero(UnsafeMutableRawPointer(mutating: base), b.count)
        }
    }
}
