internal import CSupport
import Glibc
import Synchronization

/// An open file descriptor owned by this object: closed exactly once, by `close()` or in `deinit`
/// (the shape of SwiftNIO's `BaseSocket`). The number lives in an atomic, so `close` racing another
/// thread's `close` still closes it once; after `close` every call fails with EBADF instead of
/// touching a number the kernel may have handed to someone else.
public final class FileDescriptor: Sendable {
    private let number: Atomic<Int32>

    /// Takes ownership of `fd`.
    public init(adopting fd: Int32) {
        number = Atomic(fd)
    }

    deinit { close() }

    /// The descriptor, or -1 once closed. Valid only while this object is alive and not closed.
    public var rawValue: Int32 { number.load(ordering: .acquiring) }

    /// Whether `close` has not run yet.
    public var isOpen: Bool { rawValue >= 0 }

    /// Closes the descriptor (once; later calls do nothing).
    public func close() {
        let fd = number.exchange(-1, ordering: .acquiringAndReleasing)
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    /// Runs `body` with the descriptor, or throws EBADF (named `call`) once it was closed.
    @inline(__always)
    func withDescriptor<R>(_ call: @autoclosure () -> String, _ body: (Int32) throws(Errno) -> R) throws(Errno) -> R {
        let fd = rawValue
        guard fd >= 0 else { throw Errno(.badDescriptor, call: call()) }
        return try body(fd)
    }

    // MARK: Files

    /// How `open` opens a file. Every descriptor keychaind opens is close-on-exec.
    public struct Options: OptionSet, Sendable {
        /// The `open(2)` flags.
        public let rawValue: Int32
        /// Options from raw `open(2)` flags.
        public init(rawValue: Int32) { self.rawValue = rawValue }

        /// Open for reading (the default).
        public static let readOnly = Options([])
        /// Open for writing only.
        public static let writeOnly = Options(rawValue: O_WRONLY)
        /// Open for reading and writing.
        public static let readWrite = Options(rawValue: O_RDWR)
        /// Create the file when it does not exist.
        public static let create = Options(rawValue: O_CREAT)
        /// With `create`: fail with EEXIST instead of opening an existing file.
        public static let exclusive = Options(rawValue: O_EXCL)
        /// Empty the file when it is opened for writing.
        public static let truncate = Options(rawValue: O_TRUNC)
        /// Refuse a symbolic link as the last component.
        public static let noFollow = Options(rawValue: O_NOFOLLOW)
        /// Fail unless the path is a directory.
        public static let directory = Options(rawValue: O_DIRECTORY)
        /// Do not wait in `open` or `read` (a FIFO without a writer opens at once, reads nothing).
        public static let nonBlocking = Options(rawValue: O_NONBLOCK)
        /// A terminal that must not become the controlling terminal.
        public static let noControllingTerminal = Options(rawValue: O_NOCTTY)
        /// A handle on the file that reads and writes nothing (`O_PATH`): enough for `status`, and
        /// closing it drops none of the process's POSIX locks on the file, which closing any other
        /// descriptor of it does.
        public static let pathOnly = Options(rawValue: kc_open_path_flag())
    }

    /// Opens `path` (close-on-exec); `permissions` apply when the file is created.
    public static func open(
        _ path: String, _ options: Options = .readOnly,
        permissions: UInt32 = 0o600
    ) throws(Errno) -> FileDescriptor {
        let fd = try valueOrErrno("open \(path)") {
            Glibc.open(path, options.rawValue | O_CLOEXEC, mode_t(permissions))
        }
        return FileDescriptor(adopting: fd)
    }

    /// A close-on-exec copy of `fd`, a descriptor someone else owns (one a library lends for as long
    /// as its message lives, such as a D-Bus reply's `h`).
    public static func duplicate(_ fd: Int32) throws(Errno) -> FileDescriptor {
        FileDescriptor(adopting: try valueOrErrno("fcntl F_DUPFD_CLOEXEC") { fcntl(fd, F_DUPFD_CLOEXEC, 0) })
    }

    /// Reads once into `buffer`: the bytes read, 0 at end of file.
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        try withDescriptor("read") { (fd) throws(Errno) in
            try valueOrErrno("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
        }
    }

    /// Reads until `buffer` is full or the file ends: the bytes read.
    public func readFully(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        var done = 0
        while done < buffer.count {
            let n = try read(into: UnsafeMutableRawBufferPointer(rebasing: buffer[done...]))
            if n == 0 { break }
            done += n
        }
        return done
    }

    /// The parent of the namespace this descriptor names (`/proc/<pid>/ns/user` or `…/pid` opened):
    /// `ioctl(NS_GET_PARENT)`, close-on-exec.
    public func namespaceParent() throws(Errno) -> FileDescriptor {
        try withDescriptor("ioctl NS_GET_PARENT") { (fd) throws(Errno) in
            FileDescriptor(adopting: try valueOrErrno("ioctl NS_GET_PARENT") { kc_namespace_parent(fd) })
        }
    }

    /// The user namespace that owns the namespace this descriptor names (`/proc/<pid>/ns/mnt`
    /// opened, say): `ioctl(NS_GET_USERNS)`, close-on-exec.
    public func namespaceOwner() throws(Errno) -> FileDescriptor {
        try withDescriptor("ioctl NS_GET_USERNS") { (fd) throws(Errno) in
            FileDescriptor(adopting: try valueOrErrno("ioctl NS_GET_USERNS") { kc_namespace_owner(fd) })
        }
    }

    /// Whether the file lies on a read-only mount (`fstatvfs(2)`'s `ST_RDONLY`): nobody writes it
    /// through this mount while it stays so (the same file may still be writable through another
    /// mount of it, elsewhere).
    public func isOnReadOnlyMount() throws(Errno) -> Bool {
        try withDescriptor("fstatvfs") { (fd) throws(Errno) in
            var info = statvfs()
            _ = try valueOrErrno("fstatvfs") { fstatvfs(fd, &info) }
            return info.f_flag & UInt(ST_RDONLY) != 0
        }
    }

    /// The id of the mount the file was opened through (`mnt_id` in `/proc/self/fdinfo/<fd>`): the
    /// first field of that mount's line in any process's `/proc/<pid>/mountinfo`.
    public func mountID() throws(Errno) -> Int {
        let fdinfo = try FileDescriptor.open("/proc/self/fdinfo/\(rawValue)", [.noControllingTerminal])
        defer { fdinfo.close() }
        let text = String(decoding: try fdinfo.readToEnd(chunk: 4096), as: UTF8.self)
        for line in text.split(separator: "\n") where line.hasPrefix("mnt_id:") {
            if let id = Int(line.dropFirst("mnt_id:".count).filter { $0 != " " && $0 != "\t" }) { return id }
        }
        throw Errno(EINVAL, call: "fdinfo mnt_id")
    }

    /// Reads until end of file into a new array (`chunk` bytes at a time). The reading buffer is
    /// zeroed before it is freed, for callers that read secrets.
    public func readToEnd(chunk: Int = 64 * 1024) throws(Errno) -> [UInt8] {
        try WipingReader.readToEnd(chunk: chunk) { (b) throws(Errno) in try read(into: b) }
    }

    /// Writes every byte of `bytes`, retrying short writes.
    public func writeAll(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        try withDescriptor("write") { (fd) throws(Errno) in
            var done = 0
            while done < bytes.count {
                done += try valueOrErrno("write") { Glibc.write(fd, bytes.baseAddress! + done, bytes.count - done) }
            }
        }
    }

    /// Whether the descriptor was opened for writing (`O_WRONLY` or `O_RDWR`, from `fcntl(F_GETFL)`).
    public func isOpenForWriting() throws(Errno) -> Bool {
        try withDescriptor("fcntl F_GETFL") { (fd) throws(Errno) in
            let flags = try valueOrErrno("fcntl F_GETFL") { fcntl(fd, F_GETFL) }
            let mode = flags & O_ACCMODE
            return mode == O_WRONLY || mode == O_RDWR
        }
    }

    /// Writes every byte of `bytes` without waiting for room: the open file is non-blocking for the
    /// write (its flags are restored after), so a pipe or socket that nobody reads and that is full
    /// is EAGAIN at once instead of a wait. For a descriptor another process handed over.
    public func writeAllWithoutWaiting(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        try withDescriptor("write") { (fd) throws(Errno) in
            let flags = try valueOrErrno("fcntl F_GETFL") { fcntl(fd, F_GETFL) }
            if flags & O_NONBLOCK == 0 {
                _ = try valueOrErrno("fcntl F_SETFL") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
            }
            defer { if flags & O_NONBLOCK == 0 { _ = fcntl(fd, F_SETFL, flags) } }
            var done = 0
            while done < bytes.count {
                done += try valueOrErrno("write") { Glibc.write(fd, bytes.baseAddress! + done, bytes.count - done) }
            }
        }
    }

    /// Writes every byte of `bytes`.
    public func writeAll(_ bytes: [UInt8]) throws(Errno) {
        try withBytes(bytes) { (b) throws(Errno) in try writeAll(b) }
    }

    /// Writes every byte of `bytes` at `offset` (`pwrite(2)`, retrying short writes); the file
    /// position does not move.
    public func writeAll(_ bytes: [UInt8], at offset: Int64) throws(Errno) {
        try withBytes(bytes) { (b) throws(Errno) in
            try withDescriptor("pwrite") { (fd) throws(Errno) in
                var done = 0
                while done < b.count {
                    done += try valueOrErrno("pwrite") {
                        pwrite(fd, b.baseAddress! + done, b.count - done, off_t(offset) + off_t(done))
                    }
                }
            }
        }
    }

    /// `fsync(2)`: the file's data and metadata reach the disk.
    public func sync() throws(Errno) {
        try withDescriptor("fsync") { (fd) throws(Errno) in _ = try valueOrErrno("fsync") { fsync(fd) } }
    }

    /// `fdatasync(2)`: the file's data (and the metadata needed to read it back) reach the disk.
    public func syncData() throws(Errno) {
        try withDescriptor("fdatasync") { (fd) throws(Errno) in _ = try valueOrErrno("fdatasync") { fdatasync(fd) } }
    }

    /// `fstat(2)`.
    public func status() throws(Errno) -> FileStatus {
        try withDescriptor("fstat") { (fd) throws(Errno) in
            var st = stat()
            _ = try valueOrErrno("fstat") { fstat(fd, &st) }
            return FileStatus(st)
        }
    }

    /// `fchmod(2)`.
    public func setPermissions(_ mode: UInt32) throws(Errno) {
        try withDescriptor("fchmod") { (fd) throws(Errno) in _ = try valueOrErrno("fchmod") { fchmod(fd, mode_t(mode)) }
        }
    }

    /// An exclusive `flock` taken without waiting: EWOULDBLOCK when another descriptor holds it.
    public func lockExclusiveWithoutWaiting() throws(Errno) {
        try withDescriptor("flock") { (fd) throws(Errno) in
            _ = try valueOrErrno("flock") { flock(fd, LOCK_EX | LOCK_NB) }
        }
    }

    /// Whether the descriptor is a terminal.
    public var isTerminal: Bool { isatty(rawValue) == 1 }

    /// Standard input, output and error: borrowed, never closed by these helpers.
    public static func standard(_ fd: Int32) -> StandardStream { StandardStream(fd: fd) }
}

/// One of descriptors 0, 1 and 2 (or another descriptor this process did not open): written and read
/// without taking ownership.
public struct StandardStream: Sendable {
    /// The descriptor number (not owned).
    public let fd: Int32

    /// Writes every byte; errors are dropped (there is nowhere left to report them).
    public func writeAll(_ bytes: [UInt8]) {
        var done = 0
        while done < bytes.count {
            let n = try? valueOrErrno("write") {
                bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + done, $0.count - done) }
            }
            guard let n else { return }
            done += n
        }
    }

    /// Reads once into `buffer`: the bytes read, 0 at end of file.
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        try valueOrErrno("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
    }

    /// Reads one byte; nil at end of file.
    public func readByte() throws(Errno) -> UInt8? {
        var byte: UInt8 = 0
        let n = try valueOrErrno("read") { Glibc.read(fd, &byte, 1) }
        return n == 0 ? nil : byte
    }

    /// Reads until end of file.
    public func readToEnd() throws(Errno) -> [UInt8] {
        try WipingReader.readToEnd(chunk: 64 * 1024) { (b) throws(Errno) in try read(into: b) }
    }

    /// Whether the descriptor is a terminal.
    public var isTerminal: Bool { isatty(fd) == 1 }
}

/// Reading a descriptor to its end without leaving copies behind: what is read may be a secret (a
/// passphrase file, `--stdin`), so every buffer it passes through is zeroed when it is given up — the
/// chunk buffer, the result's storage each time it grows, and the result itself when a read fails.
enum WipingReader {
    static func readToEnd(
        chunk: Int, _ read: (UnsafeMutableRawBufferPointer) throws(Errno) -> Int
    ) throws(Errno) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(chunk)
        var buffer = [UInt8](repeating: 0, count: chunk)
        defer { Zeroing.zero(&buffer) }
        while true {
            let n: Int
            do { n = try withMutableBytes(&buffer) { (b) throws(Errno) in try read(b) } } catch {
                Zeroing.zero(&out)
                throw error
            }
            if n == 0 { return out }
            if out.count + n > out.capacity {
                var grown: [UInt8] = []
                grown.reserveCapacity(max(out.capacity * 2, out.count + n))
                grown.append(contentsOf: out)
                Zeroing.zero(&out)
                out = grown
            }
            out.append(contentsOf: buffer[0..<n])
        }
    }
}
