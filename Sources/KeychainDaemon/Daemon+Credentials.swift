import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainRequests
import KeychainSystem

/// Unlocking from a systemd credential at start, and checking that key memory is locked.
extension Daemon {
    /// systemd credentials (`LoadCredentialEncrypted=keychaind.passphrase:…` or
    /// `ImportCredential=keychaind.passphrase`): when `$CREDENTIALS_DIRECTORY/keychaind.passphrase`
    /// exists, its first line is the passphrase and the daemon unlocks itself before serving. A wrong
    /// one counts as a failed unlock like any other and leaves the keychain locked.
    static let credentialName = "keychaind.passphrase"

    static func unlockFromCredential(_ items: ItemService) {
        guard let dir = CurrentProcess.environment("CREDENTIALS_DIRECTORY"), !dir.isEmpty else { return }
        let path = dir + "/" + credentialName
        let file: FileDescriptor
        do { file = try FileDescriptor.open(path) } catch {
            if error.code != .noEntry {
                Log.warning(
                    "credential not readable", [("name", credentialName), ("errno", String(error.code.rawValue))])
            }
            return
        }
        let capacity = PasswordHash.maxPassphraseBytes + 2
        var buffer = [UInt8](repeating: 0, count: capacity)
        defer { Sodium.zero(&buffer) }
        let length: Int
        do { length = try withMutableBytes(&buffer) { (b) throws(Errno) in try file.readFully(into: b) } } catch {
            Log.warning("credential not readable", [("name", credentialName), ("errno", String(error.code.rawValue))])
            return
        }
        file.close()
        // The first line: a file written with `echo … | systemd-creds encrypt` ends in a newline.
        var end = buffer[0..<length].firstIndex(of: 10) ?? length
        if end > 0 && buffer[end - 1] == 13 { end -= 1 }
        do throws(KeychainError) {
            let passphrase = try withBytes(buffer) { (b) throws(KeychainError) in
                try PasswordHash.passphrase(UnsafeRawBufferPointer(rebasing: b[0..<end]))
            }
            guard let passphrase else {
                Log.warning("credential passphrase is empty; staying locked", [("name", credentialName)])
                return
            }
            try items.unlock(passphrase: passphrase)
            Log.info("keychain unlocked", [("by", "credential")])
        } catch {
            Log.warning(
                "credential did not unlock the keychain; staying locked",
                [("name", credentialName), ("status", String(error.status.rawValue))])
        }
    }

    /// Key pages are `sodium_malloc`ed, which `mlock`s them when RLIMIT_MEMLOCK allows and silently
    /// does not otherwise; `VmLck` tells which.
    static func checkLockedMemory() {
        guard let bytes = FileSystem.contents(of: "/proc/self/status"),
            case let status = String(decoding: bytes, as: UTF8.self),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmLck:") })
        else { return }
        let kB = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        if kB == 0 {
            Log.warning("no memory is locked: key pages may be written to swap; raise LimitMEMLOCK (ulimit -l)")
        } else {
            Log.debug("key memory locked", [("VmLck_kB", String(kB))])
        }
    }
}
