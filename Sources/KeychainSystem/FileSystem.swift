import Glibc

/// What `stat(2)` says about a file.
public struct FileStatus: Sendable, Equatable {
    /// The kind of file.
    public enum Kind: Sendable, Equatable { case regular, directory, socket, symbolicLink, other }

    /// Regular file, directory, socket, link or other.
    public let kind: Kind
    /// Permission bits, set-id and sticky bits (`st_mode & 07777`).
    public let permissions: UInt32
    /// The owner.
    public let uid: UInt32
    /// The group.
    public let gid: UInt32
    /// The size in bytes.
    public let size: Int64
    /// The device the file is on.
    public let device: UInt64
    /// The inode number on that device.
    public let inode: UInt64
    /// The number of hard links to the file.
    public let linkCount: UInt64
    /// When the inode last changed (`st_ctim`, nanoseconds since the epoch): a change of mode,
    /// owner, ACL or link count sets it to the current time, and no unprivileged call can set it back.
    public let changeTime: Int64

    init(_ st: stat) {
        switch st.st_mode & S_IFMT {
        case S_IFREG: kind = .regular
        case S_IFDIR: kind = .directory
        case S_IFSOCK: kind = .socket
        case S_IFLNK: kind = .symbolicLink
        default: kind = .other
        }
        permissions = UInt32(st.st_mode & 0o7777)
        uid = st.st_uid
        gid = st.st_gid
        size = Int64(st.st_size)
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
        linkCount = UInt64(st.st_nlink)
        changeTime = Int64(st.st_ctim.tv_sec) &* 1_000_000_000 &+ Int64(st.st_ctim.tv_nsec)
    }

    /// The sticky bit (in a directory: only a file's owner may remove or rename it).
    public var isSticky: Bool { permissions & UInt32(S_ISVTX) != 0 }
}

/// Path operations on the file system. Every one names the call and the path in its `Errno`.
public enum FileSystem {
    /// `stat(2)` (following symbolic links) or, with `followLinks: false`, `lstat(2)`.
    public static func status(_ path: String, followLinks: Bool = true) throws(Errno) -> FileStatus {
        var st = stat()
        if followLinks {
            _ = try valueOrErrno("stat \(path)") { stat(path, &st) }
        } else {
            _ = try valueOrErrno("lstat \(path)") { lstat(path, &st) }
        }
        return FileStatus(st)
    }

    /// `link(2)`: EEXIST instead of replacing an existing `to`.
    public static func link(_ from: String, to: String) throws(Errno) {
        _ = try valueOrErrno("link \(to)") { Glibc.link(from, to) }
    }

    /// `unlink(2)`.
    public static func unlink(_ path: String) throws(Errno) {
        _ = try valueOrErrno("unlink \(path)") { Glibc.unlink(path) }
    }

    /// `unlink(2)` for clean-up paths: a failure is ignored.
    public static func removeIfPresent(_ path: String) {
        _ = Glibc.unlink(path)
    }

    /// `rename(2)`: replaces `to` atomically.
    public static func rename(_ from: String, to: String) throws(Errno) {
        _ = try valueOrErrno("rename \(from)") { Glibc.rename(from, to) }
    }

    /// `mkdir(2)` with `permissions` (before the umask).
    public static func makeDirectory(_ path: String, permissions: UInt32 = 0o700) throws(Errno) {
        _ = try valueOrErrno("mkdir \(path)") { mkdir(path, mode_t(permissions)) }
    }

    /// `chmod(2)`.
    public static func setPermissions(_ path: String, _ mode: UInt32) throws(Errno) {
        _ = try valueOrErrno("chmod \(path)") { chmod(path, mode_t(mode)) }
    }

    /// Whether `path` exists (`access(F_OK)`).
    public static func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    /// Whether this process may execute `path` (`access(X_OK)`).
    public static func isExecutable(_ path: String) -> Bool { access(path, X_OK) == 0 }

    /// `realpath(3)`: the canonical absolute path, or nil when it cannot be resolved.
    public static func realPath(_ path: String) -> String? {
        guard let p = realpath(path, nil) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }

    /// `readlink(2)`: the target of a symbolic link (as bytes the kernel gave, decoded as UTF-8),
    /// or nil when `path` cannot be read as one.
    public static func readLink(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = Glibc.readlink(path, &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `fsync` of a directory, so a new name in it survives a crash.
    public static func syncDirectory(_ path: String) throws(Errno) {
        let directory = try FileDescriptor.open(path, .directory)
        try directory.sync()
    }

    /// The directory part of `path` ("." when it has none, "/" for a file in the root).
    public static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// The names in directory `path` (without "." and ".."), or nil when it is not a readable directory.
    public static func contentsOfDirectory(_ path: String) -> [String]? {
        try? listDirectory(path)
    }

    /// The names in directory `path` (without "." and ".."); the error says why it cannot be read.
    public static func listDirectory(_ path: String) throws(Errno) -> [String] {
        guard let directory = opendir(path) else { throw Errno.current("opendir \(path)") }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// A new private directory (`mkdtemp`, mode 0700) named `<parent>/<prefix>XXXXXX`.
    public static func makeTemporaryDirectory(in parent: String, prefix: String) throws(Errno) -> String {
        var template = Array("\(parent)/\(prefix)XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) != nil }
        guard made else { throw Errno.current("mkdtemp \(parent)") }
        return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Reads a whole (small) file; nil when it cannot be opened or read.
    public static func contents(of path: String) -> [UInt8]? {
        guard let fd = try? FileDescriptor.open(path) else { return nil }
        return try? fd.readToEnd(chunk: 4096)
    }
}
