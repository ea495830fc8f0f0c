#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization
import CSupport
import KeychainCore
import KeychainWire
import KeychainItems

/// The daemon's lifecycle: configuration, the item service, the listener, one thread per
/// connection, signals (SIGTERM/SIGINT graceful stop, SIGHUP reload of apps.d), sd_notify.
public final class Daemon: @unchecked Sendable {
    let settings: Settings
    let bundledCLI: String?
    let handler: RequestHandler
    let items: ItemService
    let listener: Listener
    private let connections = Mutex<[Int32: UnixSocket]>([:])
    private let stopping = Atomic<Bool>(false)
    private let drained = NSCondition()

    /// Resolves settings from defaults, the config file and the flags, in that order.
    public static func settings(for options: Options, environment env: [String: String]) throws(ConfigurationError) -> Settings {
        let home = env["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? "/"
        let configHome = env["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.config"
        let dataHome = env["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.local/share"
        var s = Settings(socketPath: SocketLocation.resolve(environment: env.filter { $0.key == "XDG_RUNTIME_DIR" }),
                         dataDirectory: dataHome + "/keychaind",
                         configFile: options.configFile ?? configHome + "/keychaind/keychaind.json")
        if options.configFile != nil && !FileManager.default.fileExists(atPath: s.configFile) {
            throw ConfigurationError(file: s.configFile, reason: "does not exist (given with --config)")
        }
        try s.apply(configFile: s.configFile)
        if let p = options.socketPath { s.socketPath = p }
        if let d = options.dataDirectory { s.dataDirectory = d }
        if let l = options.logLevel {
            guard let level = Log.Level(name: l) else {
                throw ConfigurationError(file: "--log-level", reason: "must be error, warning, notice, info or debug")
            }
            s.logLevel = level
        }
        return s
    }

    /// The `keychainctl` beside this executable: an admin by default (SPEC §5).
    public static func bundledCLIPath() -> String? {
        guard let exe = AppRegistry.realPath("/proc/self/exe") else { return nil }
        let cli = Listener.parentDirectory(of: exe) + "/keychainctl"
        return access(cli, X_OK) == 0 ? (AppRegistry.realPath(cli) ?? cli) : nil
    }

    public init(settings: Settings) throws {
        self.settings = settings
        self.bundledCLI = Self.bundledCLIPath()
        let apps = try AppFiles.load(directory: settings.appsDirectory)
        let registry = AppRegistry(apps: apps, bundledCLI: bundledCLI)
        items = try ItemService(directory: settings.dataDirectory)
        handler = RequestHandler(items: items, registry: registry)
        if let inherited = try Listener.inherited() {
            listener = inherited
        } else {
            listener = try Listener.bind(path: settings.socketPath)
        }
        Log.info("keychaind started", [("version", RequestHandler.version), ("apps", String(apps.count)),
                                        ("activated", String(listener.activated)), ("pid", String(getpid()))])
    }

    /// Accepts until stopped, then drains in-flight requests. Returns the exit status.
    public func run() -> Int32 {
        startSignalThread()
        ServiceNotifier.send("READY=1\nSTATUS=serving\nMAINPID=\(getpid())")
        while let fd = listener.accept() {
            if stopping.load(ordering: .acquiring) {
                close(fd)
                break
            }
            admit(fd)
        }
        drain()
        items.close()
        listener.removeSocketFile()
        Log.info("keychaind stopped")
        return 0
    }

    private func admit(_ fd: Int32) {
        let socket = UnixSocket(adopting: fd)
        let open = handler.openConnections.load(ordering: .relaxed)
        if open >= settings.maxConnections {
            Log.warning("connection refused: limit reached", [("limit", String(settings.maxConnections))])
            return refuse(socket, KeychainError(.allocate, "too many connections (\(open)); try again later"))
        }
        let peer: PeerIdentity
        do { peer = try PeerIdentity.of(socket: fd) } catch {
            Log.warning("connection refused: peer credentials unavailable")
            return
        }
        guard peer.uid == getuid() else {
            Log.warning("connection refused: other uid", [("uid", String(peer.uid)), ("pid", String(peer.pid))])
            return refuse(socket, KeychainError(.missingEntitlement, "keychaind serves only uid \(getuid()); caller is uid \(peer.uid)"))
        }
        Connection.setTimeouts(fd: fd, idleSeconds: settings.idleTimeoutSeconds, sendSeconds: 30)
        handler.openConnections.add(1, ordering: .relaxed)
        connections.withLock { $0[fd] = socket }
        let connection = Connection(socket: socket, peer: peer, handler: handler, maxFrameBytes: settings.maxFrameBytes)
        let thread = Thread { [self] in
            connection.run()
            // Forget the fd before closing it, so a new connection reusing the number stays listed.
            self.connections.withLock { _ = $0.removeValue(forKey: fd) }
            socket.close()
            self.handler.openConnections.subtract(1, ordering: .relaxed)
            self.drained.lock()
            self.drained.broadcast()
            self.drained.unlock()
        }
        thread.stackSize = 512 * 1024
        thread.start()
    }

    /// Answers a connection we will not serve with one error frame, then closes it without losing
    /// that frame (on its own thread, so the accept loop does not wait).
    private func refuse(_ socket: UnixSocket, _ error: KeychainError) {
        try? socket.writeAll(Frame.encode(Response(id: 0, error: error).value))
        let thread = Thread { socket.lingeringClose() }
        thread.stackSize = 128 * 1024
        thread.start()
    }

    /// Stops reading from every connection; each finishes the request it is serving and exits.
    private func drain() {
        connections.withLock { all in
            for fd in all.keys { _ = Glibc.shutdown(fd, Int32(SHUT_RD)) }
        }
        let deadline = Date().addingTimeInterval(10)
        drained.lock()
        while handler.openConnections.load(ordering: .relaxed) > 0 {
            if !drained.wait(until: deadline) { break }
        }
        drained.unlock()
    }

    public func stop() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        ServiceNotifier.send("STOPPING=1\nSTATUS=stopping")
        Log.info("stopping: finishing in-flight requests")
        listener.shutdown()
    }

    func reloadApps() {
        do {
            let apps = try AppFiles.load(directory: settings.appsDirectory)
            handler.replaceRegistry(AppRegistry(apps: apps, bundledCLI: bundledCLI))
            Log.info("apps reloaded", [("apps", String(apps.count))])
            ServiceNotifier.send("STATUS=serving (apps reloaded)")
        } catch {
            Log.error("apps not reloaded; keeping the previous ones", [("reason", String(describing: error))])
        }
    }

    /// Signals are blocked in every thread (see `blockSignals`) and taken here with sigwait, so no
    /// handler runs at an arbitrary point and no Dispatch closure is involved.
    private func startSignalThread() {
        let thread = Thread { [self] in
            var set = Daemon.signalSet()
            while true {
                var sig: Int32 = 0
                guard sigwait(&set, &sig) == 0 else { continue }
                switch sig {
                case SIGHUP: self.reloadApps()
                case SIGTERM, SIGINT: self.stop()
                default: break
                }
            }
        }
        thread.stackSize = 256 * 1024
        thread.start()
    }

    static func signalSet() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGHUP)
        return set
    }

    /// Call first thing in main, before any thread exists, so every thread inherits the mask.
    public static func blockSignals() {
        var set = signalSet()
        pthread_sigmask(SIG_BLOCK, &set, nil)
        signal(SIGPIPE, SIG_IGN)
    }
}
