public import KeychainCore
import KeychainItems
import KeychainSystem

/// Refuses a data directory whose database was deleted or truncated to nothing while its device key
/// is still there. SQLite would open such a file as a new, empty database and the daemon would come
/// up with an empty keychain — a silent reset (found by the tamper campaign, docs/reliability.md).
/// The daemon itself never produces that state: it creates the database (and its schema) before the
/// device key, so a key beside a missing or empty database means the database was lost.
public enum DataDirectoryGuard {
    /// Throws `errSecNotAvailable` when `directory` holds the device key beside a missing or empty database.
    public static func check(directory: String) throws(KeychainError) {
        let database = directory + "/" + ItemService.databaseName
        let key = directory + "/" + ItemService.deviceKeyName
        guard (try? FileSystem.status(key, followLinks: false)) != nil else { return }  // no key yet: a first start
        let st = try? FileSystem.status(database, followLinks: false)
        let missing = st == nil
        guard missing || st?.size == 0 else { return }
        throw KeychainError(
            .notAvailable,
            """
            the database \(database) is \(missing ? "missing" : "empty") but the device key file \(key) exists: \
            the keychain was deleted or truncated. Refusing to start with an empty keychain. Restore \
            \(ItemService.databaseName) from a backup, or move \(ItemService.deviceKeyName) away to start an empty keychain
            """)
    }
}
