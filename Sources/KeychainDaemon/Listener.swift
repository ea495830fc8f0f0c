public import KeychainCore
import KeychainRequests
public import KeychainSystem
import KeychainWire

/// The listening socket: inherited from systemd (`LISTEN_FDS`, fd 3) or bound at the configured path.
public final class Listener: Sendable {
    /// The listening socket connections are accepted from.
    public let socket: Socket
    /// The path we bound and must unlink at exit; nil for an inherited socket.
    public let boundPath: String?
    /// Whether the socket came from systemd socket activation rather than being bound here.
    public let activated: Bool

    private init(socket: Socket, boundPath: String?, activated: Bool) {
        self.socket = socket
        self.boundPath = boundPath
        self.activated = activated
    }

    /// The listening descriptor.
    public var fd: Int32 { socket.fd }

    /// The socket systemd passed, when `LISTEN_PID` is this process and `LISTEN_FDS` ≥ 1.
    public static func inherited() throws(KeychainError) -> Listener? {
        guard let pidText = CurrentProcess.environment("LISTEN_PID"),
            let pid = Int32(pidText), pid == CurrentProcess.pid,
            let countText = CurrentProcess.environment("LISTEN_FDS"),
            let count = Int(countText), count >= 1
        else { return nil }
        CurrentProcess.unsetEnvironment("LISTEN_PID")
        CurrentProcess.unsetEnvironment("LISTEN_FDS")
        CurrentProcess.unsetEnvironment("LISTEN_FDNAMES")
        // fd 3 is ours; any further ones systemd passed are closed (and made close-on-exec by dup).
        let passed = Socket(adopting: 3)
        for extra in 1..<max(count, 1) { Socket(adopting: 3 + Int32(extra)).close() }
        let socket: Socket
        do { socket = try passed.duplicate() } catch { throw UnixSocket.error(error) }
        passed.close()
        guard socket.option(.domain) == Socket.unixDomain, socket.option(.type) == Socket.streamType,
            socket.option(.acceptsConnections) == 1
        else {
            throw KeychainError(.param, "the socket passed by systemd (fd 3) is not a listening Unix stream socket")
        }
        // Connections made from now on carry their writers' credentials (see `bind`). Those already
        // waiting did not, unless the unit set PassCredentials=yes (ours does).
        if socket.option(.passesCredentials) != 1 {
            Log.warning(
                "the inherited socket was created without SO_PASSCRED (PassCredentials=yes); connections made before keychaind started are refused once"
            )
            do { try socket.passCredentials() } catch { throw UnixSocket.error(error) }
        }
        return Listener(socket: socket, boundPath: nil, activated: true)
    }

    /// Binds `path` (socket 0600; its directory created 0700 when missing). A leftover socket from a
    /// crashed run is replaced only if it really is a socket and nobody answers on it. A path written
    /// `@name` is an abstract socket: no file, no directory, no permissions (the uid check alone
    /// keeps other users out, and another process may hold the name first).
    ///
    /// SO_PASSCRED is set on the listening socket before any connection exists, so every connection
    /// inherits it and the kernel tags every byte with the pid that wrote it (Connection checks it).
    public static func bind(path: String) throws(KeychainError) -> Listener {
        let address = try UnixSocket.address(path)
        let abstract = path.hasPrefix("@")
        if !abstract {
            try makeDirectory(FileSystem.parentDirectory(of: path))
        }
        if !abstract, try refuseIfServed(path: path) {
            FileSystem.removeIfPresent(path)
        }
        let socket: Socket
        do { socket = try Socket.stream() } catch { throw UnixSocket.error(error) }
        do { try socket.passCredentials() } catch { throw UnixSocket.error(error) }
        do { try socket.bind(to: address) } catch {
            if abstract && error.code == .addressInUse {
                throw KeychainError(
                    .param,
                    "the abstract socket \(path) is already taken (another keychaind, or another program holds the name)"
                )
            }
            throw KeychainError(.io, "bind \(path)", error)
        }
        if !abstract {
            do { try FileSystem.setPermissions(path, 0o600) } catch { throw UnixSocket.error(error) }
        }
        do { try socket.listen(backlog: 1024) } catch { throw UnixSocket.error(error) }
        return Listener(socket: socket, boundPath: abstract ? nil : path, activated: false)
    }

    /// Throws when something already answers at `path`, or `path` is not a socket; true when a
    /// leftover socket that nobody answers on is there (a crashed run's), false when nothing is.
    /// keychaind asks before it opens the keychain, so a second daemon started on a socket in use
    /// leaves no new keychain behind in a data directory of its own.
    @discardableResult
    public static func refuseIfServed(path: String) throws(KeychainError) -> Bool {
        guard !path.hasPrefix("@"), let st = try? FileSystem.status(path, followLinks: false) else { return false }
        guard st.kind == .socket else {
            throw KeychainError(.param, "\(path) exists and is not a socket; refusing to replace it")
        }
        if let probe = try? UnixSocket.connect(to: path) {
            probe.close()
            throw KeychainError(.param, "another keychaind is already serving \(path)")
        }
        return true
    }

    /// `mkdir -p` with 0700 for every directory it creates.
    static func makeDirectory(_ path: String) throws(KeychainError) {
        if let st = try? FileSystem.status(path) {
            guard st.kind == .directory else { throw KeychainError(.param, "\(path) is not a directory") }
            // Someone else's directory, or one others may write to (without the sticky bit), would
            // let them replace our socket and receive clients' secrets.
            guard st.uid == CurrentProcess.uid || st.uid == 0 else {
                throw KeychainError(.param, "socket directory \(path) belongs to uid \(st.uid), not to this user")
            }
            guard st.permissions & 0o022 == 0 || st.isSticky else {
                throw KeychainError(
                    .param, "socket directory \(path) is writable by other users; use a private directory (0700)")
            }
            return
        }
        let parent = FileSystem.parentDirectory(of: path)
        if parent != path && parent != "." { try makeDirectory(parent) }
        do { try FileSystem.makeDirectory(path, permissions: 0o700) } catch {
            if error.code != .exists { throw UnixSocket.error(error) }
        }
    }

    /// Waits for the next connection; nil once the listener was shut down.
    public func accept() -> Socket? {
        while true {
            do { return Socket(adopting: try socket.accept()) } catch {
                if error.code == .connectionAborted || error.code == .protocolError { continue }
                if error.code.isResourceShortage {
                    Log.warning("accept is out of resources; pausing", [("errno", String(error.code.rawValue))])
                    sleep(microseconds: 50_000)
                    continue
                }
                return nil
            }
        }
    }

    /// Wakes a blocked `accept` (close alone would not) and stops new connections.
    public func shutdown() {
        socket.shutdown(.both)
    }

    /// Unlinks the socket file this listener bound, if any; leaves an inherited socket's file alone.
    public func removeSocketFile() {
        if let boundPath { FileSystem.removeIfPresent(boundPath) }
    }
}
