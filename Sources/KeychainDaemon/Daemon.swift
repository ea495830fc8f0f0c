import Foundation
import Synchronization
import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainSystem
import KeychainWire
import KeychainStore

/// The daemon's lifecycle: configuration, the item service, the listener, one thread per
/// connection, signals (SIGTERM/SIGINT graceful stop, SIGHUP reload of apps.d), sd_notify.
public final class Daemon: Sendable {
    let settings: Settings
    let bundledCLI: String?
    let handler: RequestHandler
    let items: ItemService
    let listener: Listener
    let registrar: Registrar
    private let connections = Locked<[ObjectIdentifier: UnixSocket]>([:])
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
        if !options.systemAppsDirectories.isEmpty { s.systemAppsDirectories = options.systemAppsDirectories }
        if let l = options.logLevel {
            guard let level = Log.Level(name: l) else {
                throw ConfigurationError(file: "--log-level", reason: "must be error, warning, notice, info or debug")
            }
            s.logLevel = level
        }
        return s
    }

    /// The `keychainctl` beside this executable: an app with the group `keychainctl` unless a
    /// registration that counts names it (docs/security.md §2).
    public static func bundledCLIPath() -> String? {
        guard let exe = TrustedPaths.realPath("/proc/self/exe") else { return nil }
        let cli = Listener.parentDirectory(of: exe) + "/keychainctl"
        return FileSystem.isExecutable(cli) ? (TrustedPaths.realPath(cli) ?? cli) : nil
    }

    public init(settings: Settings) throws {
        self.settings = settings
        self.bundledCLI = Self.bundledCLIPath()
        items = try ItemService(directory: settings.dataDirectory, kdfProfile: settings.kdfProfile,
                                lookupCacheEntries: settings.lookupCacheEntries)
        let rowCheck = items.rowCheck
        if rowCheck.resealed {
            Log.info("row-state record written", [("rows", String(rowCheck.rows))])
        } else {
            Log.info("database rows match their sealed row-state record", [("rows", String(rowCheck.rows))])
        }
        if let problem = rowCheck.markProblem { Log.warning("generation mark", [("problem", problem)]) }
        Self.checkLockedMemory()
        if items.hasPassphrase {
            Log.info("keychain locked: a passphrase is set", [("kdfProfile", settings.kdfProfile.rawValue)])
            Self.unlockFromCredential(items)
        } else {
            Log.write(.notice, "no passphrase set: keys are protected by the device key file alone")
        }
        do {
            registrar = try Registrar(systemDirectories: settings.systemAppsDirectories, userDirectory: settings.appsDirectory,
                                      bundledCLI: bundledCLI, items: items)
        } catch {
            items.close()
            throw error
        }
        handler = RequestHandler(items: items, registrar: registrar, maxFrameBytes: settings.maxFrameBytes,
                                 maxBufferedBytes: settings.maxBufferedBytes)
        if let inherited = try Listener.inherited() {
            listener = inherited
        } else {
            listener = try Listener.bind(path: settings.socketPath)
        }
        Log.info("keychaind started", [("version", RequestHandler.version), ("apps", String(registrar.current.registry.registrations.count)),
                                        ("activated", String(listener.activated)), ("pid", String(CurrentProcess.pid))])
    }

    /// Accepts until stopped, then drains in-flight requests. Returns the exit status.
    public func run() -> Int32 {
        startSignalThread()
        startAutoLockThread()
        ServiceNotifier.send("READY=1\nSTATUS=serving\nMAINPID=\(CurrentProcess.pid)")
        while let accepted = listener.accept() {
            if stopping.load(ordering: .acquiring) {
                accepted.close()
                break
            }
            admit(accepted)
        }
        drain()
        items.close()
        listener.removeSocketFile()
        Log.info("keychaind stopped")
        return 0
    }

    private func admit(_ accepted: Socket) {
        let socket = UnixSocket(accepted)
        let open = handler.openConnections.load(ordering: .relaxed)
        if open >= settings.maxConnections {
            Log.warning("connection refused: limit reached", [("limit", String(settings.maxConnections))])
            return refuse(socket, KeychainError(.allocate, "too many connections (\(open)); try again later"))
        }
        let peer: PeerIdentity
        do { peer = try PeerIdentity.of(socket: accepted) } catch {
            Log.warning("connection refused: peer credentials unavailable")
            return
        }
        if let refusal = AccessPolicy.admit(peerUID: peer.uid, daemonUID: CurrentProcess.uid) {
            Log.warning("connection refused: other uid", [("uid", String(peer.uid)), ("pid", String(peer.pid))])
            return refuse(socket, refusal)
        }
        accepted.setTimeouts(receive: Double(settings.idleTimeoutSeconds), send: 30)
        handler.openConnections.add(1, ordering: .relaxed)
        let key = ObjectIdentifier(socket)
        connections.withLock { $0[key] = socket }
        let connection = Connection(socket: socket, peer: ConnectionPeer(peer), handler: handler,
                                    maxFrameBytes: settings.maxFrameBytes, budget: handler.budget)
        let thread = Thread { [self] in
            connection.run()
            // Forget the socket before closing it, so `drain` never shuts down a closed descriptor.
            self.connections.withLock { _ = $0.removeValue(forKey: key) }
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
        try? socket.writeAll(Response(id: 0, error: error).frame())
        let thread = Thread { socket.lingeringClose() }
        thread.stackSize = 128 * 1024
        thread.start()
    }

    /// Stops reading from every connection; each finishes the request it is serving and exits.
    private func drain() {
        connections.withLock { all in
            for socket in all.values { socket.socket.shutdown(.read) }
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
        if registrar.reload("SIGHUP") { ServiceNotifier.send("STATUS=serving (apps reloaded)") }
    }

    // MARK: Protection

    /// Locks after `autoLockSeconds` without a request (status requests do not count), when a
    /// passphrase is set and the keychain is unlocked. Checks four times a second at most.
    private func startAutoLockThread() {
        let seconds = settings.autoLockSeconds
        guard seconds > 0 else { return }
        let thread = Thread { [self] in
            let limit = Int64(seconds) * 1000
            let period: UInt32 = 250_000
            while !self.stopping.load(ordering: .relaxed) {
                sleep(microseconds: period)
                let idle = MonotonicClock.milliseconds() - self.handler.lastActivity.load(ordering: .relaxed)
                if idle >= limit, self.items.lockIfUnlocked() {
                    Log.info("keychain locked", [("by", "auto-lock"), ("idleSeconds", String(idle / 1000))])
                }
            }
        }
        thread.stackSize = 128 * 1024
        thread.start()
    }

    /// systemd credentials (`LoadCredentialEncrypted=keychaind.passphrase:…` or
    /// `ImportCredential=keychaind.passphrase`): when `$CREDENTIALS_DIRECTORY/keychaind.passphrase`
    /// exists, its first line is the passphrase and the daemon unlocks itself before serving. A wrong
    /// one counts as a failed unlock like any other and leaves the keychain locked.
    static let credentialName = "keychaind.passphrase"

    static func unlockFromCredential(_ items: ItemService) {
        guard let dir = CurrentProcess.environment("CREDENTIALS_DIRECTORY"), !dir.isEmpty else { return }
        let path = dir + "/" + credentialName
        let file: FileDescriptor
        do { file = try FileDescriptor.open(path) } catch {
            if error.code != .noEntry { Log.warning("credential not readable", [("name", credentialName), ("errno", String(error.code.rawValue))]) }
            return
        }
        let capacity = PasswordHash.maxPassphraseBytes + 2
        var buffer = [UInt8](repeating: 0, count: capacity)
        defer { Sodium.zero(&buffer) }
        let length = (try? withMutableBytes(&buffer) { (b) throws(Errno) in try file.readFully(into: b) }) ?? 0
        file.close()
        // The first line: a file written with `echo … | systemd-creds encrypt` ends in a newline.
        var end = buffer[0..<length].firstIndex(of: 10) ?? length
        if end > 0 && buffer[end - 1] == 13 { end -= 1 }
        do throws(KeychainError) {
            let passphrase = try withBytes(buffer) { (b) throws(KeychainError) in
                try PasswordHash.passphrase(UnsafeRawBufferPointer(rebasing: b[0..<end]))
            }
            guard let passphrase else {
                Log.warning("credential passphrase is empty; staying locked", [("name", credentialName)])
                return
            }
            try items.unlock(passphrase: passphrase)
            Log.info("keychain unlocked", [("by", "credential")])
        } catch {
            Log.warning("credential did not unlock the keychain; staying locked",
                        [("name", credentialName), ("status", String(error.status.rawValue))])
        }
    }

    /// Key pages are `sodium_malloc`ed, which `mlock`s them when RLIMIT_MEMLOCK allows and silently
    /// does not otherwise; `VmLck` tells which.
    static func checkLockedMemory() {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmLck:") }) else { return }
        let kB = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        if kB == 0 {
            Log.warning("no memory is locked: key pages may be written to swap; raise LimitMEMLOCK (ulimit -l)")
        } else {
            Log.debug("key memory locked", [("VmLck_kB", String(kB))])
        }
    }

    /// Signals arrive through a self-pipe: a C handler (any thread may take the signal) writes the
    /// signal number to a pipe, and this thread acts on it — no work in signal context, no Dispatch.
    private func startSignalThread() {
        guard let pipe = Daemon.signalPipe else { return }
        let thread = Thread { [self] in
            while let signal = SignalPipe.next(from: pipe) {
                switch signal {
                case .hangUp: self.reloadApps()
                case .terminate, .interrupt: self.stop()
                }
            }
        }
        thread.stackSize = 256 * 1024
        thread.start()
    }

    nonisolated(unsafe) static var signalPipe: FileDescriptor?

    /// Call first thing in main: from here on SIGTERM/SIGINT/SIGHUP only write to the signal pipe
    /// (read by the signal thread once the daemon runs), whatever thread they land on.
    public static func installSignalHandlers() {
        signalPipe = SignalPipe.install()
    }
}
