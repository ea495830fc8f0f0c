#if canImport(Glibc)
import Glibc
#endif
import KeychainCore

/// An exclusive `flock` on `keychain.db-lock`, held for the life of an open `ItemStore`, so one
/// keychain is never served by two processes (or two stores in one process): each would keep its own
/// row-state sum and overwrite the other's record. The socket check alone missed a second daemon
/// started with another `--socket`, and `--accept-database` racing a start.
final class DatabaseLock: @unchecked Sendable {
    static let suffix = "-lock"
    private let fd: Locked<Int32>

    /// Takes the lock or fails at once (errSecNotAvailable, saying another keychaind holds it).
    init(databasePath: String) throws(KeychainError) {
        let path = databasePath + Self.suffix
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            throw KeychainError(.notAvailable, "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let busy = errno == EWOULDBLOCK
            let reason = String(cString: strerror(errno))
            close(descriptor)
            throw KeychainError(.notAvailable, busy
                ? "another keychaind is already serving the keychain in \(databasePath) (it holds \(path)); stop it first (systemctl --user stop keychaind.socket keychaind.service)"
                : "cannot lock \(path): \(reason)")
        }
        fd = Locked(descriptor)
    }

    /// Lets go of the lock (closing the descriptor releases it). Later calls do nothing.
    func release() {
        let descriptor = fd.withLock { d -> Int32 in
            defer { d = -1 }
            return d
        }
        if descriptor >= 0 { close(descriptor) }
    }

    deinit { release() }
}
