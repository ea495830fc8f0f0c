internal import CSupport
import Glibc

/// A `sockaddr_un` for a filesystem path, or an abstract name written with a leading `@`.
public struct SocketAddress: Sendable {
    private var storage = sockaddr_un()
    private let length: socklen_t

    /// Why a path cannot be a socket address.
    public enum Problem: Error, Sendable {
        /// The path is empty or longer than `sun_path` holds (`capacity` - 1 bytes at most).
        case length(bytes: Int, capacity: Int)
        /// A filesystem path with a NUL byte in it.
        case nul
    }

    /// The address for `path`; errors say why it cannot be a Unix socket address.
    public init(path: String) throws(Problem) {
        var bytes = Array(path.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: storage.sun_path)
        guard !bytes.isEmpty, bytes.count < capacity else { throw .length(bytes: bytes.count, capacity: capacity) }
        guard abstract || !bytes.contains(0) else { throw .nul }
        storage.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &storage.sun_path) { raw in
            raw.copyBytes(from: bytes)
        }
        let base = MemoryLayout<sa_family_t>.size
        length = socklen_t(base + bytes.count + (abstract ? 0 : 1))
    }

    fileprivate mutating func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        let len = length
        return withUnsafePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, len) }
        }
    }
}

/// Who is on the other end of a Unix socket, as the kernel recorded it at connect (`SO_PEERCRED`).
public struct PeerCredentials: Sendable, Equatable {
    /// The process id at connect time.
    public let pid: Int32
    /// The user id at connect time.
    public let uid: UInt32
    /// The group id at connect time.
    public let gid: UInt32
}

/// A Unix-domain socket that owns its descriptor (closed once: `close()` or deinit).
///
/// The one place where keychaind makes socket system calls; failures are `Errno`s naming the call.
public final class Socket: Sendable {
    /// The owned descriptor.
    public let descriptor: FileDescriptor

    /// Takes ownership of `fd`.
    public init(adopting fd: Int32) {
        descriptor = FileDescriptor(adopting: fd)
    }

    /// The descriptor number, or -1 once closed.
    public var fd: Int32 { descriptor.rawValue }

    /// Closes the socket (once).
    public func close() { descriptor.close() }

    /// A new, unconnected stream socket (close-on-exec).
    public static func stream() throws(Errno) -> Socket {
        Socket(
            adopting: try valueOrErrno("socket") {
                socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            })
    }

    /// A new datagram socket (close-on-exec).
    public static func datagram() throws(Errno) -> Socket {
        Socket(
            adopting: try valueOrErrno("socket") {
                socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            })
    }

    /// `connect(2)`.
    public func connect(to address: SocketAddress) throws(Errno) {
        var address = address
        try descriptor.withDescriptor("connect") { (fd) throws(Errno) in
            _ = try valueOrErrno("connect") { address.withSockaddr { Glibc.connect(fd, $0, $1) } }
        }
    }

    /// `bind(2)`.
    public func bind(to address: SocketAddress) throws(Errno) {
        var address = address
        try descriptor.withDescriptor("bind") { (fd) throws(Errno) in
            _ = try valueOrErrno("bind") { address.withSockaddr { Glibc.bind(fd, $0, $1) } }
        }
    }

    /// `listen(2)`.
    public func listen(backlog: Int32) throws(Errno) {
        try descriptor.withDescriptor("listen") { (fd) throws(Errno) in
            _ = try valueOrErrno("listen") { Glibc.listen(fd, backlog) }
        }
    }

    /// `accept4(2)` with close-on-exec: the new connection's descriptor (owned by the caller).
    /// EINTR is retried; anything else (the listener shut down, out of descriptors) is thrown.
    public func accept() throws(Errno) -> Int32 {
        try descriptor.withDescriptor("accept") { (fd) throws(Errno) in
            try valueOrErrno("accept") { kc_accept_cloexec(fd) }
        }
    }

    /// `dup(2)` with close-on-exec: a second descriptor for the same socket.
    public func duplicate() throws(Errno) -> Socket {
        try descriptor.withDescriptor("dup") { (fd) throws(Errno) in
            Socket(adopting: try valueOrErrno("dup") { fcntl(fd, F_DUPFD_CLOEXEC, 0) })
        }
    }

    /// `send(2)` of all of `bytes` (short writes and EINTR retried); never raises SIGPIPE.
    public func sendAll(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        try descriptor.withDescriptor("send") { (fd) throws(Errno) in
            var sent = 0
            while sent < bytes.count {
                sent += try valueOrErrno("send") {
                    Glibc.send(fd, bytes.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
                }
            }
        }
    }

    /// One datagram to `address` (best effort: `sendto(2)`, no retry but EINTR).
    public func send(_ bytes: [UInt8], to address: SocketAddress) throws(Errno) {
        var address = address
        try descriptor.withDescriptor("sendto") { (fd) throws(Errno) in
            _ = try valueOrErrno("sendto") {
                address.withSockaddr { addr, len in
                    bytes.withUnsafeBytes { Glibc.sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), addr, len) }
                }
            }
        }
    }

    /// `recv(2)` into `buffer`: the bytes read, 0 at end of stream. EINTR is retried; a receive
    /// timeout is an `Errno` whose code `isTimeout`.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        try descriptor.withDescriptor("recv") { (fd) throws(Errno) in
            try valueOrErrno("recv") { Glibc.recv(fd, buffer.baseAddress, buffer.count, 0) }
        }
    }

    /// Like `receive`, through `recvmsg` with SCM_CREDENTIALS: also the pid of the process that
    /// wrote the bytes (0 when they carried none). Needs `passCredentials()` first.
    public func receiveWithWriter(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> (
        count: Int, writer: Int32
    ) {
        try descriptor.withDescriptor("recvmsg") { (fd) throws(Errno) in
            var writer: Int32 = 0
            let n = try valueOrErrno("recvmsg") { kc_recv_from_writer(fd, buffer.baseAddress, buffer.count, &writer) }
            return (n, writer)
        }
    }

    /// Like `receiveWithWriter`, and also a pidfd passed with the bytes (SCM_RIGHTS): the handle, or
    /// nil when none came or what came is not a pidfd (then closed). Further passed descriptors are
    /// closed unread.
    public func receiveWithWriterAndProcess(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> (
        count: Int, writer: Int32, process: ProcessHandle?
    ) {
        try descriptor.withDescriptor("recvmsg") { (fd) throws(Errno) in
            var writer: Int32 = 0
            var passed: Int32 = -1
            let n = try valueOrErrno("recvmsg") {
                kc_recv_from_writer_with_fd(fd, buffer.baseAddress, buffer.count, &writer, &passed)
            }
            guard passed >= 0 else { return (n, writer, nil) }
            // Owned from here: a pidfd becomes the handle, anything else is closed at once.
            guard kc_is_pidfd(passed) == 1 else {
                FileDescriptor(adopting: passed).close()
                return (n, writer, nil)
            }
            return (n, writer, ProcessHandle(adopting: passed))
        }
    }

    /// `send(2)` of all of `bytes`, the first part with a pidfd of this process attached (SCM_RIGHTS),
    /// so that the reader can tell the writer is still the process that now has its pid. When no pidfd
    /// can be had (a kernel before 5.3), the bytes go without one.
    public func sendAllPassingOwnProcess(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        guard bytes.count > 0, let own = try? ProcessHandle.open(pid: CurrentProcess.pid) else {
            try sendAll(bytes)
            return
        }
        let first = try descriptor.withDescriptor("sendmsg") { (fd) throws(Errno) in
            try valueOrErrno("sendmsg") { kc_send_with_fd(fd, bytes.baseAddress, bytes.count, own.rawDescriptor) }
        }
        withExtendedLifetime(own) {}
        if first < bytes.count {
            try sendAll(UnsafeRawBufferPointer(rebasing: bytes[first...]))
        }
    }

    /// The bytes that have arrived and wait to be read (`SIOCINQ`), or nil when that cannot be read.
    public func queuedBytes() -> Int? {
        let n = kc_queued_bytes(fd)
        return n >= 0 ? Int(n) : nil
    }

    /// Whether this kernel hands out a pidfd for a socket's peer (`SO_PEERPIDFD`, Linux 6.5+), asked
    /// once on a socket pair of this process's own.
    public static let kernelPinsPeers: Bool = {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            return false
        }
        let ends = (FileDescriptor(adopting: fds[0]), FileDescriptor(adopting: fds[1]))
        let pidfd = kc_peer_pidfd(ends.0.rawValue)
        withExtendedLifetime(ends) {}
        guard pidfd >= 0 else { return false }
        FileDescriptor(adopting: pidfd).close()
        return true
    }()

    /// Which directions `shutdown` stops.
    public enum Direction: Sendable {
        case read, write, both
    }

    /// `shutdown(2)`; a failure (not connected, already closed) is ignored: this only ever hurries
    /// an ending along.
    public func shutdown(_ direction: Direction) {
        let how: Int32
        switch direction {
        case .read: how = Int32(SHUT_RD)
        case .write: how = Int32(SHUT_WR)
        case .both: how = Int32(SHUT_RDWR)
        }
        let fd = self.fd
        if fd >= 0 { _ = Glibc.shutdown(fd, how) }
    }

    /// Sets the receive and send timeouts (`SO_RCVTIMEO`, `SO_SNDTIMEO`) in seconds (fractions kept);
    /// throws the `setsockopt` errno.
    public func setTimeouts(receive: Double?, send: Double?) throws(Errno) {
        func timeout(_ seconds: Double) -> timeval {
            let whole = seconds.rounded(.down)
            return timeval(tv_sec: Int(whole), tv_usec: Int((seconds - whole) * 1e6))
        }
        let fd = self.fd
        if var r = receive.map(timeout) {
            _ = try valueOrErrno("setsockopt(SO_RCVTIMEO)") {
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &r, socklen_t(MemoryLayout<timeval>.size))
            }
        }
        if var s = send.map(timeout) {
            _ = try valueOrErrno("setsockopt(SO_SNDTIMEO)") {
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &s, socklen_t(MemoryLayout<timeval>.size))
            }
        }
    }

    /// The process on the other end, as the kernel recorded it at connect (`SO_PEERCRED`).
    public func peerCredentials() throws(Errno) -> PeerCredentials {
        try descriptor.withDescriptor("getsockopt SO_PEERCRED") { (fd) throws(Errno) in
            var cred = kc_peer_cred()
            _ = try valueOrErrno("getsockopt SO_PEERCRED") { kc_peer_credentials(fd, &cred) }
            return PeerCredentials(pid: cred.pid, uid: cred.uid, gid: cred.gid)
        }
    }

    /// A pidfd for the process that connected (`SO_PEERPIDFD`, Linux 6.5+; ENOPROTOOPT before).
    public func peerProcess() throws(Errno) -> ProcessHandle {
        try descriptor.withDescriptor("getsockopt SO_PEERPIDFD") { (fd) throws(Errno) in
            ProcessHandle(adopting: try valueOrErrno("getsockopt SO_PEERPIDFD") { kc_peer_pidfd(fd) })
        }
    }

    /// `SO_PASSCRED`: from now on every read says which process wrote the bytes.
    public func passCredentials() throws(Errno) {
        try descriptor.withDescriptor("setsockopt SO_PASSCRED") { (fd) throws(Errno) in
            _ = try valueOrErrno("setsockopt SO_PASSCRED") { kc_pass_credentials(fd) }
        }
    }

    /// An integer `SOL_SOCKET` option; nil when it cannot be read.
    public func option(_ name: Option) -> Int32? {
        var value: Int32 = -1
        var len = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, name.rawValue, &value, &len) == 0 else { return nil }
        return value
    }

    /// The `SOL_SOCKET` options `option` reads.
    public struct Option: Sendable {
        let rawValue: Int32
        /// `SO_DOMAIN`: the address family.
        public static let domain = Option(rawValue: SO_DOMAIN)
        /// `SO_TYPE`: stream or datagram.
        public static let type = Option(rawValue: SO_TYPE)
        /// `SO_ACCEPTCONN`: 1 for a listening socket.
        public static let acceptsConnections = Option(rawValue: SO_ACCEPTCONN)
        /// `SO_PASSCRED`: 1 when reads carry the writer's credentials.
        public static let passesCredentials = Option(rawValue: SO_PASSCRED)
    }

    /// `AF_UNIX`, for comparing with `option(.domain)`.
    public static let unixDomain = AF_UNIX
    /// `SOCK_STREAM`, for comparing with `option(.type)`.
    public static let streamType = Int32(SOCK_STREAM.rawValue)
}

/// A pidfd: a handle on one process that no recycled pid can take over.
public final class ProcessHandle: Sendable {
    private let descriptor: FileDescriptor

    init(adopting fd: Int32) { descriptor = FileDescriptor(adopting: fd) }

    /// The pidfd itself, for calls in this module.
    var rawDescriptor: Int32 { descriptor.rawValue }

    /// `pidfd_open(pid)`.
    public static func open(pid: Int32) throws(Errno) -> ProcessHandle {
        ProcessHandle(adopting: try valueOrErrno("pidfd_open") { kc_pidfd_open(pid) })
    }

    /// Whether the process still runs (its pidfd is not yet readable).
    public var isRunning: Bool { kc_pidfd_exited(descriptor.rawValue) == 0 }

    /// The pid the pidfd refers to, or nil when the process is gone.
    public var pid: Int32? {
        let p = kc_pidfd_pid(descriptor.rawValue)
        return p > 0 ? p : nil
    }
}
