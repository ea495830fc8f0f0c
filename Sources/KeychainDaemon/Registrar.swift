import KeychainCore
import KeychainItems
import KeychainRequests
import KeychainSystem
import Synchronization

/// Keeps the app registry current: loads it at start, and again on SIGHUP and whenever something
/// that decides which registrations count changes (an unlock makes approvals readable, a passphrase
/// is set or removed, a registration is approved or revoked). Each load gets a new generation, so a
/// connection re-identifies its peer only when the registry changed.
final class Registrar: Sendable {
    private let systemDirectories: [String]
    private let userDirectory: String
    private let bundledCLI: String?
    private let items: ItemService
    private let state: Locked<(registry: AppRegistry, generation: Int)>
    /// The generation of `state`, readable without the lock (stored after the registry it counts).
    private let latestGeneration = Atomic<Int>(Registrar.initialGeneration)
    /// Held from the read of the files to the publication of what was read.
    private let reloading = Lock()
    /// The generation of the registry read at start-up; every reload adds one.
    private static let initialGeneration = 1

    init(systemDirectories: [String], userDirectory: String, bundledCLI: String?, items: ItemService)
        throws(ConfigurationError)
    {
        self.systemDirectories = systemDirectories
        self.userDirectory = userDirectory
        self.bundledCLI = bundledCLI
        self.items = items
        let registry = try Self.load(
            systemDirectories: systemDirectories, userDirectory: userDirectory,
            bundledCLI: bundledCLI, items: items)
        state = Locked((registry, Self.initialGeneration))
        Self.logUntrusted(registry)
    }

    /// The registry for tests and tools that build one by hand.
    init(registry: AppRegistry, items: ItemService) {
        systemDirectories = []
        userDirectory = ""
        bundledCLI = nil
        self.items = items
        state = Locked((registry, Self.initialGeneration))
    }

    var current: (registry: AppRegistry, generation: Int) { state.withLock { $0 } }

    /// The current generation alone, without taking the lock or copying the registry: a connection
    /// asks it before every request. A reload is seen by every request that starts after the reload
    /// returned (approve, revoke and passwd answer their caller only then).
    var generation: Int { latestGeneration.load(ordering: .acquiring) }

    /// The user's `apps.d`, where `approve` reads files.
    var userAppsDirectory: String { userDirectory }

    /// Reads the registrations again; on a malformed file keeps the previous registry and says why.
    /// One reload at a time, so a read made before a change (an approval revoked, the first
    /// passphrase set) is never published after a read made since.
    @discardableResult
    func reload(_ why: String) -> Bool {
        guard !userDirectory.isEmpty else { return true }
        return reloading.withLock { readAndPublish(why) }
    }

    private func readAndPublish(_ why: String) -> Bool {
        do {
            let registry = try Self.load(
                systemDirectories: systemDirectories, userDirectory: userDirectory,
                bundledCLI: bundledCLI, items: items)
            state.withLock {
                $0 = (registry, $0.generation + 1)
                latestGeneration.store($0.generation, ordering: .releasing)
            }
            Log.info(
                "apps reloaded",
                [
                    ("why", why), ("apps", String(registry.registrations.count)),
                    ("untrusted", String(registry.untrusted.count)),
                ])
            Self.logUntrusted(registry)
            return true
        } catch {
            Log.error(
                "apps not reloaded; keeping the previous ones", [("why", why), ("reason", String(describing: error))])
            return false
        }
    }

    static func approval(_ entry: AppEntry) -> ApprovedRegistration {
        ApprovedRegistration(
            applicationIdentifier: entry.applicationIdentifier, accessGroups: entry.accessGroups,
            executables: entry.executables, admin: entry.admin)
    }

    private static func load(
        systemDirectories: [String], userDirectory: String, bundledCLI: String?,
        items: ItemService
    ) throws(ConfigurationError) -> AppRegistry {
        let approvals: [AppEntry]?
        do {
            approvals = try items.approvedRegistrations()?.map {
                AppEntry(
                    applicationIdentifier: $0.applicationIdentifier, accessGroups: $0.accessGroups,
                    executables: $0.executables, admin: $0.admin, file: "(approved)")
            }
        } catch {
            // A damaged approvals record must not make every user app an unknown: it makes them untrusted.
            Log.error(
                "approved registrations cannot be read; user registrations do not count", [("reason", error.message)])
            approvals = []
        }
        return try AppRegistry.load(
            RegistryContext(
                systemDirectories: systemDirectories, userDirectory: userDirectory,
                bundledCLI: bundledCLI, passphraseSet: items.hasPassphrase,
                approvals: approvals))
    }

    private static func logUntrusted(_ registry: AppRegistry) {
        for r in registry.untrusted {
            if let reason = r.untrusted {
                Log.warning("registration ignored", [("file", r.entry.file), ("reason", reason)])
            }
            for (exe, reason) in r.refusedExecutables.sorted(by: { $0.key < $1.key }) {
                Log.warning(
                    "registered executable refused", [("file", r.entry.file), ("executable", exe), ("reason", reason)])
            }
        }
    }
}

/// What one connection knows about its peer: the facts read at accept, and the app they map to in a
/// given registry generation (looked up again only when the registry changed).
///
/// Not Sendable: made and used by its connection's own thread only.
final class ConnectionPeer {
    let identity: PeerIdentity
    /// What answers of many items on this connection hold of the daemon's buffer budget until the
    /// connection has written them (nil: not counted, as for requests not served by a connection).
    @exclusivity(unchecked) var answers: AnswerLedger?
    // Used by its connection's thread only: no runtime exclusivity checks (asked on every request).
    @exclusivity(unchecked) private var cached: (generation: Int, result: Result<AppEntry, KeychainIdentityError>)?
    /// The registry generation of the last `app(in:)` answer (0 before the first).
    @exclusivity(unchecked) private(set) var generation = 0
    /// Whether that answer was an app. Kept apart from `cached` so that the check before every
    /// request reads two words, not a copy of the app's entry.
    @exclusivity(unchecked) private var identified = false

    /// `known`: the answer already looked up at accept (Daemon.admit) and the generation it was
    /// looked up in, so the connection does not look it up again.
    init(_ identity: PeerIdentity, known: (generation: Int, result: Result<AppEntry, KeychainIdentityError>)? = nil) {
        self.identity = identity
        if let known { remember(known.result, generation: known.generation) }
    }

    func app(in registrar: Registrar) -> Result<AppEntry, KeychainIdentityError> {
        if let cached, cached.generation == registrar.generation { return cached.result }
        let (registry, generation) = registrar.current
        let result = registry.identify(identity)
        remember(result, generation: generation)
        return result
    }

    private func remember(_ result: Result<AppEntry, KeychainIdentityError>, generation: Int) {
        cached = (generation, result)
        self.generation = generation
        switch result {
        case .success: identified = true
        case .failure: identified = false
        }
    }

    /// Whether the peer is an identified app in the current registry (what `app(in:)` says, without
    /// copying the app's entry out: asked before every request of a connection).
    func isIdentified(in registrar: Registrar) -> Bool {
        // (Generations start at 1: 0, before the first answer, is never current.)
        if generation != registrar.generation { _ = app(in: registrar) }
        return identified
    }
}

/// The registry as the request core asks it (`AppDirectory`): a change to an apps.d made before
/// the call is taken first (`AppsWatcher.catchUp`), as for a new socket connection.
struct RegistryDirectory: AppDirectory {
    let registrar: Registrar
    let watcher: AppsWatcher?

    func identify(_ peer: PeerIdentity) -> (result: Result<AppEntry, KeychainIdentityError>, generation: Int) {
        _ = watcher?.catchUp()
        let (registry, generation) = registrar.current
        return (registry.identify(peer), generation)
    }

    var generation: Int { registrar.current.generation }
}
