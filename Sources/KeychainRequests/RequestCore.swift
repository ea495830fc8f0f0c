public import KeychainCore
public import KeychainItems
public import KeychainSystem
public import Synchronization

/// Where the core learns who a peer is: the daemon's registry of apps (apps.d, reloaded when it
/// changes). One lookup for every transport, so a process is the same app on the socket and on the bus.
public protocol AppDirectory: Sendable {
    /// The registration `peer` runs, or why it is not a registered app, with the registry
    /// generation it was made under. A change to the registry made before the call is taken first.
    func identify(_ peer: PeerIdentity) -> (result: Result<AppEntry, KeychainIdentityError>, generation: Int)
    /// The registry generation now: an identification made under an older one is looked up again.
    var generation: Int { get }
}

/// The transport-neutral path of every request, below the transports: a peer → its registered app
/// (`identify`, through the `AppDirectory`) → a `Caller` (`caller(for:)`) → the access policy's
/// decision (`AccessPolicy`, with presence where it asks for it) → the item operation on `items`,
/// counted as activity for auto-lock (`noteActivity`). It also holds what the transports share with
/// the daemon's lifecycle: the unlock gate, a place in `status` per transport, and shutdown hooks.
///
/// A transport plugs in as one adapter over this type: it turns its own peer into a `PeerIdentity`
/// (the socket from `SO_PEERCRED` and a pidfd, the Secret Service from the bus's credentials and
/// a pidfd; a sandbox would map its own app id the same way), asks `identify` and `caller(for:)`,
/// decides with `AccessPolicy` under its own rules (`decide` for the socket, `decideOnBus` for the
/// bus), calls `items`, and reports itself with `setStatus(of:_:note:)` and `onShutdown`. The socket
/// (KeychainDaemon's `Connection` and `RequestHandler`) and the Secret Service
/// (KeychainSecretService) are the two adapters; `keychaind`'s main wires them onto one core.
public final class RequestCore: Sendable {
    /// The item service every transport calls (thread-safe).
    public let items: ItemService
    /// Who peers are.
    public let directory: any AppDirectory
    /// Monotonic milliseconds of the last request that counts as activity for auto-lock: a
    /// successful one of an identified app — an item returned, added, updated or deleted, or an
    /// unlock with the right passphrase (never a failing request, never `status`, never an
    /// unidentified peer), on any transport.
    public let lastActivity = Atomic<Int64>(MonotonicClock.milliseconds())
    /// Held by an unlock from its passphrase check until the unlock time and `lastActivity` say so,
    /// and by the auto-lock thread or a lock request while it decides to lock: a right passphrase is
    /// never followed by a lock counted from before it.
    public let unlockGate = Lock()
    /// Held while a passphrase dialog asked for by a request is showing: one dialog at a time, the
    /// other requests that would ask wait for it to end (and are served without a dialog of their
    /// own when it unlocked the keychain).
    public let promptLock = Lock()
    /// What `status` says about each transport other than the socket (its fields under its name)
    /// and the isolation note that goes with it, in the order they were set.
    private let statuses = Locked<[(name: String, fields: [String: Value], note: String)]>([])
    private let shutdownHooks = Locked<[@Sendable () -> Void]>([])

    /// A core over `items`, with peers identified by `directory`.
    public init(items: ItemService, directory: any AppDirectory) {
        self.items = items
        self.directory = directory
    }

    /// The caller a registered app is, before any transport's rules: its identifier, its access
    /// groups, and whether it is an administrator. The one place this step is made.
    public static func caller(for app: AppEntry) -> Caller {
        Caller(applicationIdentifier: app.applicationIdentifier, accessGroups: app.accessGroups, isAdmin: app.admin)
    }

    /// The registration `peer` runs, or why it is not a registered app, with the registry
    /// generation it was made under (`AppDirectory.identify`).
    public func identify(_ peer: PeerIdentity) -> (result: Result<AppEntry, KeychainIdentityError>, generation: Int) {
        directory.identify(peer)
    }

    /// The registry generation now.
    public var registryGeneration: Int { directory.generation }

    /// A successful item call of an identified caller: restarts the auto-lock idle clock. Written
    /// only when the millisecond changed: every connection shares this counter, and a write on each
    /// request would pass its cache line between CPUs for nothing.
    @inlinable @inline(__always) public func noteActivity() {
        let now = MonotonicClock.milliseconds()
        if lastActivity.load(ordering: .relaxed) != now { lastActivity.store(now, ordering: .relaxed) }
    }

    /// Locks now, on an event from outside the daemon (logind: the session locked, the machine is
    /// about to sleep; SessionLock.swift), by the auto-lock's path: under the unlock gate, logged as
    /// `keychain locked` with `by`. Returns whether it locked (false: no passphrase, or locked already).
    public func lockNow(by reason: String) -> Bool {
        let locked = unlockGate.withLock { items.lockIfUnlocked() }
        if locked { Log.info("keychain locked", [("by", reason)]) }
        return locked
    }

    /// Sets (or clears, with nil) what `status` reports about `transport`: `fields` under its
    /// name, and `note` among the isolation notes.
    public func setStatus(of transport: String, _ fields: [String: Value]?, note: String) {
        statuses.withLock { list in
            list.removeAll { $0.name == transport }
            if let fields { list.append((transport, fields, note)) }
        }
    }

    /// What the transports reported for `status`, in the order they were set.
    public var transportStatuses: [(name: String, fields: [String: Value], note: String)] {
        statuses.withLock { $0 }
    }

    /// Runs `hook` when the daemon stops, after it stops accepting and before the store closes.
    public func onShutdown(_ hook: @escaping @Sendable () -> Void) {
        shutdownHooks.withLock { $0.append(hook) }
    }

    /// Runs the shutdown hooks, in the order they were added (the daemon, once, as it stops).
    public func runShutdownHooks() {
        for hook in shutdownHooks.withLock({ $0 }) { hook() }
    }
}
