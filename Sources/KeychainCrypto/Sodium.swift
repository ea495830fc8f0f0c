import CSodium
import KeychainCore
import KeychainSystem

/// libsodium's one-time initialisation. `sodium_malloc` before `sodium_init` aborts the process, so every
/// entry point of this module that touches libsodium calls `Sodium.ensureInitialized()` first.
public enum Sodium {
    /// A lazily initialised global: Swift runs the initialiser exactly once, thread-safely.
    private static let initialized: Bool = sodium_init() >= 0

    /// Initialises libsodium once per process; stops the process if it cannot (nothing is safe without it).
    public static func ensureInitialized() {
        precondition(initialized, "libsodium could not be initialised")
    }

    /// Overwrites `buffer` with zeros in a way the compiler cannot optimise away.
    public static func zero(_ buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        sodium_memzero(base, buffer.count)
    }

    /// Overwrites an array's bytes with zeros (for per-request plaintext buffers).
    public static func zero(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { zero($0) }
    }

    /// Fills `buffer` with cryptographically secure random bytes.
    public static func randomFill(_ buffer: UnsafeMutableRawBufferPointer) {
        ensureInitialized()
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        randombytes_buf(base, buffer.count)
    }

    /// A fresh key pair made by `generate` (one of libsodium's `…_keypair` calls, given the public
    /// and the secret key's buffers of these lengths): the public key in a plain array, the secret
    /// key in guarded memory (the temporary copy zeroed). `what` names the pair in the error.
    static func keyPair(
        publicKeyBytes: Int, secretKeyBytes: Int, what: String,
        _ generate: (UnsafeMutablePointer<UInt8>, UnsafeMutablePointer<UInt8>) -> Int32
    ) throws(KeychainError) -> (publicKey: [UInt8], secretKey: SecureBytes) {
        ensureInitialized()
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        var sk = [UInt8](repeating: 0, count: secretKeyBytes)
        defer { zero(&sk) }
        let rc = pk.withUnsafeMutableBufferPointer { p in
            sk.withUnsafeMutableBufferPointer { s in generate(p.baseAddress!, s.baseAddress!) }
        }
        guard rc == 0 else { throw KeychainError(.internal, "cannot make \(what)") }
        let secret = try withBytes(sk) { (b) throws(KeychainError) in try SecureBytes(copying: b) }
        return (pk, secret)
    }

    /// `count` bytes from libsodium's CSPRNG, in a plain array (not wiped when freed).
    public static func randomBytes(_ count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBytes { randomFill($0) }
        return out
    }

    /// Constant-time comparison of two byte arrays (MACs, tags, digests): the time taken depends on
    /// their lengths only, never on where they first differ.
    public static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in equal(pa, pb) } }
    }

    /// Constant-time comparison of two equally long buffers.
    public static func equal(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        guard a.count > 0 else { return true }
        return sodium_memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0
    }
}
