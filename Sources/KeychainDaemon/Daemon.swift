import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainPrompt
public import KeychainRequests
import KeychainStore
import KeychainSystem
import KeychainWire
import Synchronization

/// The daemon's lifecycle: configuration, the item service, the listener, one thread per
/// connection, signals (SIGTERM/SIGINT graceful stop, SIGHUP reload of apps.d), apps.d watched for
/// changes, sd_notify.
public final class Daemon: Sendable {
    let settings: Settings
    let bundledCLI: String?
    /// The transport-neutral request path the socket and the Secret Service both adapt.
    public let core: RequestCore
    let handler: RequestHandler
    let items: ItemService
    let listener: Listener
    let registrar: Registrar
    /// Reloads the registrations when an apps.d changes; nil when inotify is not available.
    let appsWatcher: AppsWatcher?
    private let connections = Locked<[ObjectIdentifier: UnixSocket]>([:])
    let stopping = Atomic<Bool>(false)
    private let drained = NSCondition()

    /// Opens the item store, loads the registrations and binds (or inherits) the socket; throws on failure.
    public init(settings: Settings) throws {
        self.settings = settings
        self.bundledCLI = Self.bundledCLIPath()
        if CurrentProcess.environment("LISTEN_FDS") == nil {
            try Listener.refuseIfServed(path: settings.socketPath)  // before a keychain is opened or made
        }
        items = try ItemService(
            directory: settings.dataDirectory, kdfProfile: settings.kdfProfile,
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
        // Watched before the registrations are first read, so that a change in between is seen.
        let watch = AppsWatcher.watch(settings.systemAppsDirectories + [settings.appsDirectory])
        do {
            registrar = try Registrar(
                systemDirectories: settings.systemAppsDirectories, userDirectory: settings.appsDirectory,
                bundledCLI: bundledCLI, items: items)
        } catch {
            items.close()
            throw error
        }
        let registrar = self.registrar
        appsWatcher = watch.map { AppsWatcher(watch: $0, registrar: registrar) }
        core = RequestCore(items: items, directory: RegistryDirectory(registrar: registrar, watcher: appsWatcher))
        handler = RequestHandler(
            core: core, registrar: registrar, maxFrameBytes: settings.maxFrameBytes,
            maxBufferedBytes: settings.maxBufferedBytes,
            lockSettings: (settings.autoLockSeconds, settings.maxUnlockedSeconds),
            pinentryProgram: settings.pinentryProgram,
            prompter: { [program = settings.pinentryProgram, timeout = settings.pinentryTimeoutSeconds] in
                Prompter(configured: program, timeoutSeconds: timeout)
            },
            presence: PresenceSettings(
                confirmation: settings.presenceConfirmation, reuseSeconds: settings.presenceReuseSeconds))
        if let inherited = try Listener.inherited() {
            listener = inherited
        } else {
            listener = try Listener.bind(path: settings.socketPath)
        }
        Log.info(
            "keychaind started",
            [
                ("version", Product.version), ("apps", String(registrar.current.registry.registrations.count)),
                ("activated", String(listener.activated)), ("pid", String(CurrentProcess.pid)),
                ("peer-pinning", Socket.kernelPinsPeers ? "SO_PEERPIDFD" : "pidfd_open after accept"),
            ])
    }

    /// Gives up before serving (a part that must start with the daemon could not): closes the store
    /// and removes the socket file it bound.
    public func abandon() {
        items.close()
        listener.removeSocketFile()
    }

    /// Accepts until stopped, then drains in-flight requests. Returns the exit status.
    public func run() -> Int32 {
        startSignalThread()
        if let appsWatcher {
            appsWatcher.start()
            core.onShutdown { appsWatcher.stop() }
        }
        startAutoLockThread()
        startSync()
        ServiceNotifier.send("READY=1\nSTATUS=serving\nMAINPID=\(CurrentProcess.pid)")
        while let accepted = listener.accept() {
            if stopping.load(ordering: .acquiring) {
                accepted.close()
                break
            }
            admit(accepted)
        }
        // Run once the listener stops accepting, before in-flight requests are drained and the
        // store closes (the Secret Service's thread stops there).
        core.runShutdownHooks()
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
            Log.warning("connection refused: peer credentials unavailable", [("error", error.message)])
            return
        }
        if let refusal = AccessPolicy.admit(peerUID: peer.uid, daemonUID: CurrentProcess.uid) {
            Log.warning("connection refused: other uid", [("uid", String(peer.uid)), ("pid", String(peer.pid))])
            return refuse(socket, refusal)
        }
        // Programs that are not registered apps may hold only a quarter of the connections, so one
        // that opens them all (any process of the user can) leaves the rest to the apps.
        // A connection made after a change to apps.d sees it (an app started right after its
        // registration was written, or after it was removed), even before the watching thread has
        // read it: the change is taken here (one read of the inotify queue when there is none).
        appsWatcher?.catchUp()
        let (registry, generation) = handler.registrar.current
        let known = (generation: generation, result: registry.identify(peer))
        let unregistered = (try? known.result.get()) == nil
        if unregistered {
            let limit = max(1, settings.maxConnections / 4)
            let held = handler.unregisteredConnections.load(ordering: .relaxed)
            if held >= limit {
                Log.warning("connection refused: unregistered programs' share used", [("limit", String(limit))])
                return refuse(
                    socket,
                    KeychainError(
                        .allocate,
                        "too many connections from programs that are not registered apps (\(held)); try again later"))
            }
            handler.unregisteredConnections.add(1, ordering: .relaxed)
        }
        // Without its timeouts one idle or unread peer could hold a thread for ever: not served.
        do throws(Errno) { try accepted.setTimeouts(receive: Double(settings.idleTimeoutSeconds), send: 30) } catch {
            if unregistered { handler.unregisteredConnections.subtract(1, ordering: .relaxed) }
            Log.warning("connection refused: socket timeouts not set", [("error", error.message)])
            return
        }
        handler.openConnections.add(1, ordering: .relaxed)
        let key = ObjectIdentifier(socket)
        connections.withLock { $0[key] = socket }
        let maxFrameBytes = settings.maxFrameBytes
        let thread = Thread { [self] in
            // Made on the thread that serves it: a connection and what it caches about its peer
            // belong to this one thread, so they need no lock and no Sendable claim.
            let connection = Connection(
                socket: socket, peer: ConnectionPeer(peer, known: known), handler: self.handler,
                maxFrameBytes: maxFrameBytes, budget: self.handler.budget)
            connection.run()
            // Forget the socket before closing it, so `drain` never shuts down a closed descriptor.
            self.connections.withLock { _ = $0.removeValue(forKey: key) }
            socket.close()
            if unregistered { self.handler.unregisteredConnections.subtract(1, ordering: .relaxed) }
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

    /// Starts a graceful stop: tells systemd, stops accepting, lets in-flight requests finish; repeats do nothing.
    public func stop() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        ServiceNotifier.send("STOPPING=1\nSTATUS=stopping")
        Log.info("stopping: finishing in-flight requests")
        listener.shutdown()
    }

    func reloadApps() {
        appsWatcher?.rewatch()
        if registrar.reload("SIGHUP") { ServiceNotifier.send("STATUS=serving (apps reloaded)") }
    }

}
