internal import CSupport
import Glibc

/// The kernel's cryptographically secure random bytes (`getrandom(2)`), for code that has no
/// libsodium at hand (the client library's `SecRandomCopyBytes`).
public enum SystemRandom {
    /// Fills `buffer` completely (short reads and EINTR retried); throws the errno otherwise.
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer) throws(Errno) {
        var filled = 0
        while filled < buffer.count {
            filled += try valueOrErrno("getrandom") {
                kc_getrandom(buffer.baseAddress! + filled, buffer.count - filled)
            }
        }
    }
}
