import KeychainCore
import KeychainSystem

/// An exclusive `flock` on `keychain.db-lock`, held for the life of an open `ItemStore`, so one
/// keychain is never served by two processes (or two stores in one process): each would keep its own
/// row-state sum and overwrite the other's record. The socket check alone missed a second daemon
/// started with another `--socket`, and `--accept-database` racing a start.
final class DatabaseLock: Sendable {
    static let suffix = "-lock"
    private let file: FileDescriptor

    /// Takes the lock or fails at once (errSecNotAvailable, saying another keychaind holds it).
    init(databasePath: String) throws(KeychainError) {
        let path = databasePath + Self.suffix
        do { file = try FileDescriptor.open(path, [.readWrite, .create, .noFollow], permissions: 0o600) } catch {
            throw KeychainError(.notAvailable, "cannot open \(path)", error)
        }
        do { try file.lockExclusiveWithoutWaiting() } catch {
            file.close()
            if error.code == .wouldBlock {
                throw KeychainError(
                    .notAvailable,
                    "another keychaind is already serving the keychain in \(databasePath) (it holds \(path)); stop it first (systemctl --user stop keychaind.socket keychaind.service)"
                )
            }
            throw KeychainError(.notAvailable, "cannot lock \(path)", error)
        }
    }

    /// Lets go of the lock (closing the descriptor releases it). Later calls do nothing.
    func release() { file.close() }
}
