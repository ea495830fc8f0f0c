public import KeychainCore
import KeychainSystem

/// The device key file (`device.key`): 32 random bytes, mode 0600, the root of this device's keys.
///
/// Created atomically (O_CREAT|O_EXCL temporary file, fsync, link into place without replacing, fsync
/// of the directory), so a crash never leaves a half-written key and two starters never overwrite each
/// other's key. Read straight into guarded memory.
public enum DeviceKeyFile {
    /// Length of the device key in bytes (32); a file of any other size is refused.
    public static let length = 32

    /// Reads the key; nil when the file does not exist. A file of the wrong size, of the wrong kind, or
    /// readable by other users is an error, never replaced.
    public static func load(path: String) throws(KeychainError) -> SecureBytes? {
        let file: FileDescriptor
        do { file = try FileDescriptor.open(path, [.readOnly, .noFollow]) } catch {
            if error.code == .noEntry { return nil }
            throw KeychainError(.io, "cannot open device key file \(path)", error)
        }
        let st: FileStatus
        do { st = try file.status() } catch { throw KeychainError(.io, "cannot stat device key file \(path)", error) }
        guard st.kind == .regular else {
            throw KeychainError(.io, "device key file \(path) is not a regular file")
        }
        guard st.uid == CurrentProcess.effectiveUID else {
            throw KeychainError(
                .io,
                "device key file \(path) is owned by uid \(st.uid), not by this user (uid \(CurrentProcess.effectiveUID))"
            )
        }
        guard st.permissions & 0o077 == 0 else {
            throw KeychainError(
                .io,
                "device key file \(path) is accessible by other users (mode \(String(st.permissions & 0o777, radix: 8))); run: chmod 600 \(path)"
            )
        }
        guard Int(st.size) == length else {
            throw KeychainError(.io, "device key file \(path) has \(st.size) bytes, expected \(length); it is damaged")
        }
        var failure: KeychainError?
        let key = try SecureBytes(count: length) { buffer in
            do throws(Errno) {
                if try file.readFully(into: buffer) != length {
                    failure = KeychainError(.io, "cannot read device key file \(path): short read")
                }
            } catch {
                failure = KeychainError(.io, "cannot read device key file \(path)", error)
            }
        }
        if let failure { throw failure }
        return key
    }

    /// Creates a new random key file at `path`. If another process created one meanwhile, that one is
    /// loaded instead (never overwritten).
    public static func create(path: String) throws(KeychainError) -> SecureBytes {
        let directory = FileSystem.parentDirectory(of: path)
        var suffix = Sodium.randomBytes(8)
        let tmp = path + ".tmp-" + suffix.map { String($0, radix: 16) }.joined()
        Sodium.zero(&suffix)
        let file: FileDescriptor
        do {
            file = try FileDescriptor.open(tmp, [.writeOnly, .create, .exclusive, .noFollow], permissions: 0o600)
        } catch {
            throw KeychainError(.io, "cannot create \(tmp)", error)
        }
        var ok = false
        defer { if !ok { FileSystem.removeIfPresent(tmp) } }
        let key = try SecureBytes(random: length)
        do throws(Errno) {
            try key.withUnsafeBytes { (b) throws(Errno) in try file.writeAll(b) }
            try file.setPermissions(0o600)
            try file.sync()
        } catch {
            file.close()
            throw KeychainError(.io, "cannot write \(tmp)", error)
        }
        file.close()
        // link(2) fails with EEXIST instead of replacing: a concurrent starter's key is never clobbered.
        do { try FileSystem.link(tmp, to: path) } catch {
            FileSystem.removeIfPresent(tmp)
            ok = true
            if error.code == .exists, let existing = try load(path: path) { return existing }
            throw KeychainError(.io, "cannot install device key file \(path)", error)
        }
        FileSystem.removeIfPresent(tmp)
        ok = true
        try syncDirectory(directory)
        return key
    }

    /// fsync of a directory, so a new name in it survives a crash.
    public static func syncDirectory(_ directory: String) throws(KeychainError) {
        do { try FileSystem.syncDirectory(directory) } catch {
            throw KeychainError(.io, "cannot sync directory \(directory)", error)
        }
    }
}
