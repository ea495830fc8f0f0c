public import KeychainCore
public import KeychainSystem
import Synchronization

/// A Unix-domain stream socket to or from keychaind: the system socket plus the protocol's rules
/// (which peers to trust, how frames are read, how a connection ends without losing the last answer).
/// Every system-call failure becomes a `KeychainError` here.
public final class UnixSocket: Sendable {
    /// The owned socket (closed once, by `close()` or deinit).
    public let socket: Socket
    /// Set on a client's new connection until its first write, which carries a pidfd of this process
    /// (docs/protocol.md: a daemon on a kernel without `SO_PEERPIDFD` needs it to trust bytes that
    /// arrived before it could pin the connecting process).
    private let firstWriteCarriesProcess: Atomic<Bool>

    /// Takes ownership of `fd` (closed once, by `close()` or when released).
    public init(adopting fd: Int32) {
        socket = Socket(adopting: fd)
        firstWriteCarriesProcess = Atomic(false)
    }

    /// Wraps `socket`, taking ownership of it.
    public init(_ socket: Socket) {
        self.socket = socket
        firstWriteCarriesProcess = Atomic(false)
    }

    private init(connecting socket: Socket) {
        self.socket = socket
        firstWriteCarriesProcess = Atomic(true)
    }

    /// The descriptor; -1 once closed.
    public var fd: Int32 { socket.fd }

    /// Closes the socket (once; later calls do nothing).
    public func close() { socket.close() }

    /// A new, unconnected stream socket with close-on-exec set.
    public static func stream() throws(KeychainError) -> UnixSocket {
        do { return UnixSocket(try Socket.stream()) } catch { throw KeychainError(.io, error) }
    }

    /// A new stream socket for a client: its first write carries a pidfd of this process.
    static func clientStream() throws(KeychainError) -> UnixSocket {
        do { return UnixSocket(connecting: try Socket.stream()) } catch { throw KeychainError(.io, error) }
    }

    /// The address of `path`, or errSecParam saying why it cannot be one.
    public static func address(_ path: String) throws(KeychainError) -> SocketAddress {
        do { return try SocketAddress(path: path) } catch {
            switch error {
            case .length(let bytes, let capacity):
                throw KeychainError(
                    .param, "socket path is \(bytes) bytes; a Unix socket path must be 1 to \(capacity - 1) bytes")
            case .nul:
                throw KeychainError(.param, "socket path contains a NUL byte")
            }
        }
    }

    /// Connects to the daemon's socket at `path`.
    public static func connect(to path: String) throws(KeychainError) -> UnixSocket {
        let address = try address(path)
        let sock = try clientStream()
        do { try sock.socket.connect(to: address) } catch {
            throw KeychainError(.notAvailable, "cannot connect to keychaind at \(path)", error)
        }
        // Only a daemon of this user (or root) may receive our secrets and passphrases: a socket in
        // a directory someone else controls could lead to an impostor.
        let peer = sock.peerUID()
        guard let peer, peer == CurrentProcess.uid || peer == 0 else {
            throw KeychainError(
                .notAvailable,
                "refusing \(path): the process serving it runs as uid \(peer.map(String.init) ?? "unknown"), not as this user"
            )
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
        socket.shutdown(.write)
        // An absolute deadline: a peer trickling a byte at a time cannot hold the thread longer.
        let deadline = MonotonicClock.now() + Double(milliseconds) / 1000
        var sink = [UInt8](repeating: 0, count: 4096)
        var total = 0
        while total < 65 << 20 {  // enough for the largest request a client may be sending
            let left = deadline - MonotonicClock.now()
            if left <= 0 { break }
            // Without the timeout the receive below could wait past the deadline: stop draining.
            guard (try? socket.setTimeouts(receive: left + 1e-6, send: nil)) != nil else { break }
            let n = (try? withMutableBytes(&sink) { (b) throws(Errno) in try socket.receive(into: b) }) ?? 0
            if n <= 0 { break }
            total += n
        }
        Zeroing.zero(&sink)
    }

    /// The uid of the process on the other end (SO_PEERCRED), or nil when it cannot be read.
    public func peerUID() -> UInt32? {
        (try? socket.peerCredentials())?.uid
    }

    /// Writes every byte, retrying on EINTR and short writes; never raises SIGPIPE.
    public func writeAll(_ bytes: [UInt8]) throws(KeychainError) {
        try withBytes(bytes) { (b) throws(KeychainError) in try writeAll(b) }
    }

    /// Writes every byte of a frame held in wiping storage.
    public func writeAll(_ bytes: SecretBytes) throws(KeychainError) {
        try bytes.withUnsafeBytes { (b) throws(KeychainError) in try writeAll(b) }
    }

    /// Writes every byte of `bytes`.
    public func writeAll(_ bytes: UnsafeRawBufferPointer) throws(KeychainError) {
        do {
            if firstWriteCarriesProcess.load(ordering: .relaxed),
                firstWriteCarriesProcess.exchange(false, ordering: .acquiringAndReleasing)
            {
                try socket.sendAllPassingOwnProcess(bytes)
            } else {
                try socket.sendAll(bytes)
            }
        } catch { throw KeychainError(.notAvailable, error) }
    }

    /// Reads one whole frame body, or nil at a clean end of stream between frames.
    public func readFrame(_ frames: inout FrameBuffer) throws(KeychainError) -> SecretBytes? {
        while true {
            if let body = try frames.next() { return body }
            let n: Int
            do {
                // Straight into the frame buffer (wiping storage): no second copy of what arrives.
                n = try frames.receive(upTo: 16 * 1024) { (b) throws(Errno) in try socket.receive(into: b) }
            } catch {
                throw KeychainError(.notAvailable, error)
            }
            if n == 0 {
                if frames.pendingCount == 0 { return nil }
                throw KeychainError(.notAvailable, "connection closed in the middle of a frame")
            }
        }
    }

    /// A system call's failure as errSecIO (or `status`) naming the call.
    public static func error(_ errno: Errno, status: Status = .io) -> KeychainError {
        KeychainError(status, errno)
    }
}

/// Where the daemon's socket is: `$KEYCHAIND_SOCKET`, else `$XDG_RUNTIME_DIR/keychaind/keychaind.sock`,
/// else `/run/user/<uid>/keychaind/keychaind.sock`.
public enum SocketLocation {
    /// The socket path from these environment variables.
    public static func resolve(environment: [String: String]) -> String {
        if let p = environment["KEYCHAIND_SOCKET"], !p.isEmpty { return p }
        let runtime =
            environment["XDG_RUNTIME_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/run/user/\(CurrentProcess.uid)"
        return runtime + "/keychaind/keychaind.sock"
    }

    /// The socket path from this process's environment.
    public static func fromProcessEnvironment() -> String {
        var env: [String: String] = [:]
        for key in ["KEYCHAIND_SOCKET", "XDG_RUNTIME_DIR"] {
            if let v = CurrentProcess.environment(key) { env[key] = v }
        }
        return resolve(environment: env)
    }
}
