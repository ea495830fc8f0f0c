#if canImport(Glibc)
import Glibc
#endif
import CSupport
import KeychainCore
import KeychainWire

/// The listening socket: inherited from systemd (`LISTEN_FDS`, fd 3) or bound at the configured path.
public final class Listener: @unchecked Sendable {
    public let fd: Int32
    /// The path we bound and must unlink at exit; nil for an inherited socket.
    public let boundPath: String?
    public let activated: Bool

    private init(fd: Int32, boundPath: String?, activated: Bool) {
        self.fd = fd
        self.boundPath = boundPath
        self.activated = activated
    }

    /// The socket systemd passed, when `LISTEN_PID` is this process and `LISTEN_FDS` ≥ 1.
    public static func inherited() throws(KeychainError) -> Listener? {
        guard let pidText = getenv("LISTEN_PID").map({ String(cString: $0) }),
              let pid = Int32(pidText), pid == getpid(),
              let countText = getenv("LISTEN_FDS").map({ String(cString: $0) }),
              let count = Int(countText), count >= 1 else { return nil }
        unsetenv("LISTEN_PID")
        unsetenv("LISTEN_FDS")
        unsetenv("LISTEN_FDNAMES")
        let fd: Int32 = 3
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        for extra in 1..<max(count, 1) { close(fd + Int32(extra)) }
        guard option(fd, SO_DOMAIN) == AF_UNIX, option(fd, SO_TYPE) == Int32(SOCK_STREAM.rawValue),
              option(fd, SO_ACCEPTCONN) == 1 else {
            throw KeychainError(.param, "the socket passed by systemd (fd 3) is not a listening Unix stream socket")
        }
        // Connections made from now on carry their writers' credentials (see `bind`). Those already
        // waiting did not, unless the unit set PassCredentials=yes (ours does).
        if option(fd, SO_PASSCRED) != 1 {
            Log.warning("the inherited socket was created without SO_PASSCRED (PassCredentials=yes); connections made before keychaind started are refused once")
            guard kc_pass_credentials(fd) == 0 else { throw UnixSocket.errnoError("setsockopt SO_PASSCRED") }
        }
        return Listener(fd: fd, boundPath: nil, activated: true)
    }

    private static func option(_ fd: Int32, _ name: Int32) -> Int32 {
        var value: Int32 = -1
        var len = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, name, &value, &len) == 0 else { return -1 }
        return value
    }

    /// Binds `path` (socket 0600; its directory created 0700 when missing). A leftover socket from a
    /// crashed run is replaced only if it really is a socket and nobody answers on it. A path written
    /// `@name` is an abstract socket: no file, no directory, no permissions (the uid check alone
    /// keeps other users out, and another process may hold the name first).
    ///
    /// SO_PASSCRED is set on the listening socket before any connection exists, so every connection
    /// inherits it and the kernel tags every byte with the pid that wrote it (Connection checks it).
    public static func bind(path: String) throws(KeychainError) -> Listener {
        var address = try SocketAddress(path: path)
        let abstract = path.hasPrefix("@")
        var st = stat()
        if !abstract {
            try makeDirectory(parentDirectory(of: path))
        }
        if !abstract && lstat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFSOCK else {
                throw KeychainError(.param, "\(path) exists and is not a socket; refusing to replace it")
            }
            if let probe = try? UnixSocket.connect(to: path) {
                probe.close()
                throw KeychainError(.param, "another keychaind is already serving \(path)")
            }
            unlink(path)
        }
        let sock = try UnixSocket.stream()
        let fd = sock.fd
        guard kc_pass_credentials(fd) == 0 else { throw UnixSocket.errnoError("setsockopt SO_PASSCRED") }
        let rc = address.withSockaddr { Glibc.bind(fd, $0, $1) }
        guard rc == 0 else {
            if abstract && errno == EADDRINUSE {
                throw KeychainError(.param, "the abstract socket \(path) is already taken (another keychaind, or another program holds the name)")
            }
            throw UnixSocket.errnoError("bind \(path)")
        }
        if !abstract {
            guard chmod(path, 0o600) == 0 else { throw UnixSocket.errnoError("chmod \(path)") }
        }
        guard listen(fd, 1024) == 0 else { throw UnixSocket.errnoError("listen") }
        let owned = dup(fd)
        _ = fcntl(owned, F_SETFD, FD_CLOEXEC)
        return Listener(fd: owned, boundPath: abstract ? nil : path, activated: false)
    }

    static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// `mkdir -p` with 0700 for every directory it creates.
    static func makeDirectory(_ path: String) throws(KeychainError) {
        var st = stat()
        if stat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFDIR else { throw KeychainError(.param, "\(path) is not a directory") }
            // Someone else's directory, or one others may write to (without the sticky bit), would
            // let them replace our socket and receive clients' secrets.
            guard st.st_uid == getuid() || st.st_uid == 0 else {
                throw KeychainError(.param, "socket directory \(path) belongs to uid \(st.st_uid), not to this user")
            }
            guard st.st_mode & 0o022 == 0 || st.st_mode & S_ISVTX != 0 else {
                throw KeychainError(.param, "socket directory \(path) is writable by other users; use a private directory (0700)")
            }
            return
        }
        let parent = parentDirectory(of: path)
        if parent != path && parent != "." { try makeDirectory(parent) }
        if mkdir(path, 0o700) != 0 && errno != EEXIST { throw UnixSocket.errnoError("mkdir \(path)") }
    }

    /// Waits for the next connection; nil once the listener was shut down.
    public func accept() -> Int32? {
        while true {
            let c = kc_accept_cloexec(fd)
            if c >= 0 { return c }
            switch errno {
            case EINTR, ECONNABORTED, EPROTO: continue
            case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                Log.warning("accept is out of resources; pausing", [("errno", String(errno))])
                usleep(50_000)
                continue
            default:
                return nil
            }
        }
    }

    /// Wakes a blocked `accept` (close alone would not) and stops new connections.
    public func shutdown() {
        _ = Glibc.shutdown(fd, Int32(SHUT_RDWR))
    }

    public func removeSocketFile() {
        if let boundPath { unlink(boundPath) }
    }
}
