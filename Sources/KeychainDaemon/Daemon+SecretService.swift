public import KeychainCore
public import KeychainItems
import KeychainSystem
import Synchronization

/// What the Secret Service (KeychainSecretService, served inside this process on its own thread)
/// needs from the daemon: the item service, the registry that decides who a peer is, the auto-lock
/// clock, and a place in `status`. The bus side asks; the decisions stay here and in AccessPolicy.
extension Daemon {
    /// The item service (thread-safe).
    public var itemService: ItemService { items }

    /// The settings the daemon runs with.
    public var runningSettings: Settings { settings }

    /// The registry generation now: an identification made under an older one is looked up again.
    public var registryGeneration: Int { registrar.current.generation }

    /// The registration `peer` runs, or why it is not a registered app — the very lookup socket
    /// connections use (AppRegistry.identify) — with the registry generation it was made under. As
    /// for a socket connection, a change to apps.d made before the call is taken first.
    public func identify(_ peer: PeerIdentity) -> (result: Result<AppEntry, KeychainIdentityError>, generation: Int) {
        appsWatcher?.catchUp()
        let (registry, generation) = registrar.current
        return (registry.identify(peer), generation)
    }

    /// A successful item call of an identified caller: restarts the auto-lock idle clock, as
    /// successful socket requests do.
    public func noteActivity() {
        handler.lastActivity.store(MonotonicClock.milliseconds(), ordering: .relaxed)
    }

    /// Sets (or clears, with nil) what `status` reports about the Secret Service: `fields` under
    /// `secretService`, and `note` among the isolation notes.
    public func setSecretServiceStatus(_ fields: [String: Value]?, note: String) {
        handler.secretServiceStatus.withLock { $0 = fields.map { ($0, note) } }
    }

    /// Runs `hook` when the daemon stops, after it stops accepting and before the store closes.
    public func onShutdown(_ hook: @escaping @Sendable () -> Void) {
        shutdownHooks.withLock { $0.append(hook) }
    }

    /// Gives up before serving (a part that must start with the daemon could not): closes the store
    /// and removes the socket file it bound.
    public func abandon() {
        items.close()
        listener.removeSocketFile()
    }
}
