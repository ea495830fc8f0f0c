#if canImport(Glibc)
import Glibc
#endif
import KeychainCore

/// The device key file (`device.key`): 32 random bytes, mode 0600, the root of this device's keys.
///
/// Created atomically (O_CREAT|O_EXCL temporary file, fsync, link into place without replacing, fsync
/// of the directory), so a crash never leaves a half-written key and two starters never overwrite each
/// other's key. Read straight into guarded memory.
public enum DeviceKeyFile {
    public static let length = 32

    /// Reads the key; nil when the file does not exist. A file of the wrong size, of the wrong kind, or
    /// readable by other users is an error, never replaced.
    public static func load(path: String) throws(KeychainError) -> SecureBytes? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        if fd < 0 {
            let e = errno
            if e == ENOENT { return nil }
            throw KeychainError(.io, "cannot open device key file \(path): \(errnoText(e))")
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw KeychainError(.io, "cannot stat device key file \(path): \(errnoText(errno))") }
        guard (st.st_mode & S_IFMT) == S_IFREG else {
            throw KeychainError(.io, "device key file \(path) is not a regular file")
        }
        guard st.st_uid == geteuid() else {
            throw KeychainError(.io, "device key file \(path) is owned by uid \(st.st_uid), not by this user (uid \(geteuid()))")
        }
        guard st.st_mode & 0o077 == 0 else {
            throw KeychainError(.io, "device key file \(path) is accessible by other users (mode \(String(st.st_mode & 0o777, radix: 8))); run: chmod 600 \(path)")
        }
        guard Int(st.st_size) == length else {
            throw KeychainError(.io, "device key file \(path) has \(st.st_size) bytes, expected \(length); it is damaged")
        }
        var failure: KeychainError?
        let key = SecureBytes(count: length) { buffer in
            var done = 0
            while done < length {
                let n = read(fd, buffer.baseAddress! + done, length - done)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 {
                    failure = KeychainError(.io, "cannot read device key file \(path): \(n < 0 ? errnoText(errno) : "short read")")
                    return
                }
                done += n
            }
        }
        if let failure { throw failure }
        return key
    }

    /// Creates a new random key file at `path`. If another process created one meanwhile, that one is
    /// loaded instead (never overwritten).
    public static func create(path: String) throws(KeychainError) -> SecureBytes {
        let directory = parentDirectory(of: path)
        var suffix = Sodium.randomBytes(8)
        let tmp = path + ".tmp-" + suffix.map { String($0, radix: 16) }.joined()
        Sodium.zero(&suffix)
        let fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw KeychainError(.io, "cannot create \(tmp): \(errnoText(errno))") }
        var ok = false
        defer { if !ok { unlink(tmp) } }
        let key = SecureBytes(random: length)
        let written: Int = key.withUnsafeBytes { b in
            var done = 0
            while done < length {
                let n = write(fd, b.baseAddress! + done, length - done)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return -1 }
                done += n
            }
            return done
        }
        guard written == length, fchmod(fd, 0o600) == 0, fsync(fd) == 0 else {
            let e = errno
            close(fd)
            throw KeychainError(.io, "cannot write \(tmp): \(errnoText(e))")
        }
        close(fd)
        // link(2) fails with EEXIST instead of replacing: a concurrent starter's key is never clobbered.
        if link(tmp, path) != 0 {
            let e = errno
            unlink(tmp)
            ok = true
            if e == EEXIST, let existing = try load(path: path) { return existing }
            throw KeychainError(.io, "cannot install device key file \(path): \(errnoText(e))")
        }
        unlink(tmp)
        ok = true
        try syncDirectory(directory)
        return key
    }

    static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let dir = String(path[..<slash])
        return dir.isEmpty ? "/" : dir
    }

    /// fsync of a directory, so a new name in it survives a crash.
    public static func syncDirectory(_ directory: String) throws(KeychainError) {
        let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw KeychainError(.io, "cannot open directory \(directory): \(errnoText(errno))") }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw KeychainError(.io, "cannot sync directory \(directory): \(errnoText(errno))") }
    }
}

func errnoText(_ e: Int32) -> String {
    if let s = strerror(e) { return String(cString: s) }
    return "errno \(e)"
}
