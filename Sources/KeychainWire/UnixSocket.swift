#if canImport(Glibc)
import Glibc
#endif
import KeychainCore

/// A Unix-domain stream socket that owns its file descriptor (closed in `deinit`).
///
/// The one place where daemon and clients turn socket system calls into `KeychainError`s.
public final class UnixSocket: @unchecked Sendable {
    /// The descriptor; -1 once closed.
    public private(set) var fd: Int32

    public init(adopting fd: Int32) {
        self.fd = fd
    }

    deinit {
        if fd >= 0 { Glibc.close(fd) }
    }

    public func close() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }

    /// A new, unconnected stream socket with close-on-exec set.
    public static func stream() throws(KeychainError) -> UnixSocket {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw errnoError("socket") }
        return UnixSocket(adopting: fd)
    }

    /// Connects to the daemon's socket at `path`.
    public static func connect(to path: String) throws(KeychainError) -> UnixSocket {
        let sock = try stream()
        var addr = try SocketAddress(path: path)
        let rc = addr.withSockaddr { Glibc.connect(sock.fd, $0, $1) }
        guard rc == 0 else {
            let e = errno
            throw KeychainError(.notAvailable, "cannot connect to keychaind at \(path): \(String(cString: strerror(e)))")
        }
        // Only a daemon of this user (or root) may receive our secrets and passphrases: a socket in
        // a directory someone else controls could lead to an impostor.
        let peer = sock.peerUID()
        guard let peer, peer == getuid() || peer == 0 else {
            throw KeychainError(.notAvailable, "refusing \(path): the process serving it runs as uid \(peer.map(String.init) ?? "unknown"), not as this user")
        }
        return sock
    }

    /// Ends a connection whose peer may still be sending: stop writing, discard what arrives for up
    /// to `milliseconds`, then close. Closing with unread input would reset the connection, and the
    /// peer could lose the response we just wrote.
    public func lingeringClose(milliseconds: Int = 250) {
        drainForClose(milliseconds: milliseconds)
        close()
    }

    /// The first half of `lingeringClose`: shut down writing and discard input, leaving the fd open.
    public func drainForClose(milliseconds: Int = 250) {
        guard fd >= 0 else { return }
        _ = shutdown(fd, Int32(SHUT_WR))
        // An absolute deadline: a peer trickling a byte at a time cannot hold the thread longer.
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let deadline = Double(now.tv_sec) + Double(now.tv_nsec) / 1e9 + Double(milliseconds) / 1000
        var sink = [UInt8](repeating: 0, count: 4096)
        var total = 0
        while total < 65 << 20 {  // enough for the largest request a client may be sending
            clock_gettime(CLOCK_MONOTONIC, &now)
            let left = deadline - (Double(now.tv_sec) + Double(now.tv_nsec) / 1e9)
            if left <= 0 { break }
            var tv = timeval(tv_sec: Int(left), tv_usec: Int((left - left.rounded(.down)) * 1e6) + 1)
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            let n = sink.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            total += n
        }
    }

    /// The uid of the process on the other end (SO_PEERCRED), or nil when it cannot be read.
    public func peerUID() -> UInt32? {
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; } — not visible to Swift without _GNU_SOURCE.
        var cred: (Int32, UInt32, UInt32) = (0, 0, 0)
        var len = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0, len == 12 else { return nil }
        return cred.1
    }

    /// Writes every byte, retrying on EINTR and short writes; never raises SIGPIPE.
    public func writeAll(_ bytes: [UInt8]) throws(KeychainError) {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { buf in
                send(fd, buf.baseAddress! + sent, buf.count - sent, Int32(MSG_NOSIGNAL))
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw Self.errnoError("send", status: .notAvailable)
            }
            sent += n
        }
    }

    /// Reads one whole frame body, or nil at a clean end of stream between frames.
    public func readFrame(_ frames: inout FrameBuffer) throws(KeychainError) -> [UInt8]? {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            if let body = try frames.next() { return body }
            let n = try readChunk(&chunk)
            if n == 0 {
                if frames.pendingCount == 0 { return nil }
                throw KeychainError(.notAvailable, "connection closed in the middle of a frame")
            }
            chunk.withUnsafeBytes { frames.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
    }

    private func readChunk(_ chunk: inout [UInt8]) throws(KeychainError) -> Int {
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n >= 0 { return n }
            if errno == EINTR { continue }
            throw Self.errnoError("recv", status: .notAvailable)
        }
    }

    public static func errnoError(_ call: String, status: Status = .io) -> KeychainError {
        let e = errno
        return KeychainError(status, "\(call) failed: \(String(cString: strerror(e)))")
    }
}

/// A `sockaddr_un` for a filesystem path, or an abstract name written with a leading `@`.
public struct SocketAddress {
    private var storage = sockaddr_un()
    private let length: socklen_t

    public init(path: String) throws(KeychainError) {
        var bytes = Array(path.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: storage.sun_path)
        guard !bytes.isEmpty, bytes.count < capacity else {
            throw KeychainError(.param, "socket path is \(bytes.count) bytes; a Unix socket path must be 1 to \(capacity - 1) bytes")
        }
        guard abstract || !bytes.contains(0) else { throw KeychainError(.param, "socket path contains a NUL byte") }
        storage.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &storage.sun_path) { raw in
            raw.copyBytes(from: bytes)
        }
        let base = MemoryLayout<sa_family_t>.size
        length = socklen_t(base + bytes.count + (abstract ? 0 : 1))
    }

    public mutating func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        let len = length
        return withUnsafePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, len) }
        }
    }
}

/// Where the daemon's socket is: `$KEYCHAIND_SOCKET`, else `$XDG_RUNTIME_DIR/keychaind/keychaind.sock`,
/// else `/run/user/<uid>/keychaind/keychaind.sock`.
public enum SocketLocation {
    public static func resolve(environment: [String: String]) -> String {
        if let p = environment["KEYCHAIND_SOCKET"], !p.isEmpty { return p }
        let runtime = environment["XDG_RUNTIME_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/run/user/\(getuid())"
        return runtime + "/keychaind/keychaind.sock"
    }

    public static func fromProcessEnvironment() -> String {
        var env: [String: String] = [:]
        for key in ["KEYCHAIND_SOCKET", "XDG_RUNTIME_DIR"] {
            if let v = getenv(key) { env[key] = String(cString: v) }
        }
        return resolve(environment: env)
    }
}
