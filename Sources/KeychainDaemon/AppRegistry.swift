import KeychainCore
import KeychainItems
public import KeychainRequests
import KeychainSystem

/// One registration as the daemon sees it: the entry, where it was read, and whether it counts.
public struct Registration: Sendable {
    /// Where a registration was read from, which decides when it counts.
    public enum Source: String, Sendable {
        /// `/etc/keychaind/apps.d` or `/usr/share/keychaind/apps.d` (root-owned: packages, the admin).
        case system
        /// The user's `apps.d` beside the configuration file.
        case user
        /// The `keychainctl` installed beside `keychaind`, when no registration names it.
        case builtIn = "built-in"
    }

    /// The registration as read from its file.
    public var entry: AppEntry
    /// Where it was read from.
    public var source: Source
    /// Nil when it counts; else why not (shown by `keychainctl status`, and given to its executables).
    public var untrusted: String?
    /// A user registration that may be approved but cannot be checked yet: a passphrase is set and
    /// the keychain has not been unlocked since keychaind started. Its executables are told the
    /// keychain is locked (errSecInteractionNotAllowed, "try again after unlock"), not that they lack
    /// an entitlement, which keychain code treats as a setup error and does not retry.
    public var untilUnlock = false
    /// Executables of a trusted registration that cannot carry its identity, and why.
    public var refusedExecutables: [String: String] = [:]
}

/// What the registry needs to know to decide which registrations count (docs/security.md §2).
public struct RegistryContext: Sendable {
    /// Root-owned directories of registrations, highest precedence first.
    public var systemDirectories: [String]
    /// The user's `apps.d`.
    public var userDirectory: String
    /// The real path of the `keychainctl` beside `keychaind`, when there is one.
    public var bundledCLI: String?
    /// Whether the keychain has a passphrase: then user registrations count only when approved.
    public var passphraseSet: Bool
    /// The approved user registrations; nil while they cannot be read (a passphrase is set and the
    /// keychain has not been unlocked since keychaind started).
    public var approvals: [AppEntry]?

    /// A context from the daemon's settings and the keychain's state; reads nothing itself.
    public init(
        systemDirectories: [String], userDirectory: String, bundledCLI: String?, passphraseSet: Bool,
        approvals: [AppEntry]?
    ) {
        self.systemDirectories = systemDirectories
        self.userDirectory = userDirectory
        self.bundledCLI = bundledCLI
        self.passphraseSet = passphraseSet
        self.approvals = approvals
    }
}

/// Who an executable is: the registrations that count, looked up by the executable's real path,
/// and checked against the file itself (device and inode) at identification time.
public struct AppRegistry: Sendable {
    /// Where root-owned registrations are read from by default, highest precedence first.
    public static let defaultSystemDirectories = ["/etc/keychaind/apps.d", "/usr/share/keychaind/apps.d"]
    /// The access group of the built-in `keychainctl` registration.
    public static let bundledGroup = "keychainctl"

    /// Every registration read, trusted or not, in precedence order (then the built-in one).
    public let registrations: [Registration]
    /// Real path (UTF-8 bytes: compared byte for byte) → the registration that counts for it.
    private let byExecutable: [[UInt8]: AppEntry]
    /// Real path → why a registration naming it does not count.
    private let refused: [[UInt8]: KeychainIdentityError]
    /// How to register `exe`, for the message an unregistered executable gets.
    private let howToRegister: @Sendable (String) -> String
    /// The user whose power over registered executables is judged again at identification (nil:
    /// not judged — keychaind runs as root, or a registry of given entries).
    private let principal: TrustedPaths.Principal?
    /// Real paths judged at identification: every registered one but the built-in keychainctl's
    /// (whose group is everyone's anyway).
    private let judged: Set<[UInt8]>
    /// Paths found unmodifiable at identification, while nothing on the way to them changed.
    private let unmodifiable = TrustedPaths.UnmodifiableCache()

    /// A registry of the given entries, all trusted, on the bus too (tests, and `--check-config`).
    public init(apps: [AppEntry], bundledCLI: String?) {
        self.init(
            registrations: apps.map { app in
                var entry = app
                entry.onBus = true
                return Registration(entry: entry, source: .user)
            }, bundledCLI: bundledCLI,
            howToRegister: { "add an apps.d/*.json entry naming \($0)" }, principal: nil)
    }

    private init(
        registrations input: [Registration], bundledCLI: String?, howToRegister: @escaping @Sendable (String) -> String,
        principal: TrustedPaths.Principal?
    ) {
        var registrations = input
        var map: [[UInt8]: AppEntry] = [:]
        var refused: [[UInt8]: KeychainIdentityError] = [:]
        for i in registrations.indices where registrations[i].untrusted == nil {
            let r = registrations[i]
            for exe in r.entry.executables {
                let real = TrustedPaths.realPath(exe) ?? exe
                if let reason = r.refusedExecutables[exe] {
                    // Refused here because an earlier registration owns it: the owner keeps it.
                    if map[Array(real.utf8)] == nil { refused[Array(real.utf8)] = KeychainIdentityError(reason) }
                    continue
                }
                if map[Array(real.utf8)] != nil { continue }
                map[Array(real.utf8)] = r.entry
            }
        }
        for r in registrations where r.untrusted != nil {
            for exe in r.entry.executables {
                let key = Array((TrustedPaths.realPath(exe) ?? exe).utf8)
                if map[key] == nil && refused[key] == nil {
                    refused[key] = KeychainIdentityError(
                        r.untrusted!, status: r.untilUnlock ? .interactionNotAllowed : .missingEntitlement)
                }
            }
        }
        let judged = Set(map.keys)
        if let cli = bundledCLI, map[Array(cli.utf8)] == nil {
            let entry = AppEntry(
                applicationIdentifier: "keychainctl", accessGroups: [Self.bundledGroup],
                executables: [cli], admin: false, file: "(built-in: the keychainctl beside keychaind)")
            map[Array(cli.utf8)] = entry
            refused[Array(cli.utf8)] = nil
            registrations.append(Registration(entry: entry, source: .builtIn))
        }
        self.registrations = registrations
        self.byExecutable = map
        self.refused = refused
        self.howToRegister = howToRegister
        self.principal = principal
        self.judged = judged
    }

    /// Reads every registration and decides which count (docs/security.md §2): system files when they and every
    /// directory above them are root's and not writable by others; the user's files as they are while
    /// no passphrase is set, afterwards only those approved with it; an executable the user can
    /// modify carries no identity (unless the user is root). Malformed files are errors.
    public static func load(_ context: RegistryContext) throws(ConfigurationError) -> AppRegistry {
        var registrations: [Registration] = []
        var seenNames = Set<String>()
        for directory in context.systemDirectories {
            let dirProblem = TrustedPaths.rootOwnedProblem(directory)
            for app in try AppFiles.load(directory: directory) {
                let name = String(app.file.split(separator: "/").last ?? "")
                // A file in /etc overrides the package's file of the same name in /usr/share.
                guard seenNames.insert(name).inserted else { continue }
                let problem = dirProblem ?? TrustedPaths.rootOwnedProblem(app.file)
                registrations.append(
                    Registration(
                        entry: app, source: .system,
                        untrusted: problem.map { "\(app.file) is not a trusted registration: \($0)" }))
            }
        }
        for app in try AppFiles.load(directory: context.userDirectory) {
            var untrusted: String?
            var untilUnlock = false
            if context.passphraseSet {
                if let approvals = context.approvals {
                    if !approvals.contains(where: { $0.sameRegistration(as: app) }) {
                        untrusted =
                            "\(app.file) is not approved with the keychain passphrase (run `keychainctl approve \(String(app.file.split(separator: "/").last ?? ""))`)"
                    }
                } else {
                    untrusted =
                        "the keychain is locked: \(app.file) counts once the keychain has been unlocked since keychaind started (approved registrations are sealed under the passphrase): unlock with a program that needs no registration of yours, such as the keychainctl beside keychaind"
                    untilUnlock = true
                }
            }
            registrations.append(
                Registration(entry: app, source: .user, untrusted: untrusted, untilUnlock: untilUnlock))
        }
        // One executable, one app: the first trusted registration naming it wins. A registration
        // that names one file twice (the same path, or two paths to it) names it once.
        var owners: [[UInt8]: Int] = [:]
        let principal = TrustedPaths.Principal.current()
        for i in registrations.indices where registrations[i].untrusted == nil {
            for exe in registrations[i].entry.executables {
                let key = Array((TrustedPaths.realPath(exe) ?? exe).utf8)
                if let other = owners[key] {
                    if other != i {
                        registrations[i].refusedExecutables[exe] =
                            "\(exe) is already registered by \(registrations[other].entry.file)"
                    }
                    continue
                }
                if principal.uid != 0, let problem = TrustedPaths.modifiableProblem(exe, by: principal) {
                    registrations[i].refusedExecutables[exe] = Self.modifiable(exe, problem)
                    continue
                }
                owners[key] = i
            }
        }
        // Who is identified on the session bus too (AppEntry.onBus).
        for i in registrations.indices {
            registrations[i].entry.onBus =
                !context.passphraseSet || (registrations[i].source == .system && registrations[i].entry.secretService)
        }
        let passphraseSet = context.passphraseSet
        let userDirectory = context.userDirectory
        let how: @Sendable (String) -> String = { exe in
            passphraseSet
                ? "register it root-owned in /etc/keychaind/apps.d/, or with `keychainctl register` (an admin, with the keychain passphrase)"
                : "add an apps.d/*.json entry in \(userDirectory) with \"application-identifier\", \"keychain-access-groups\" and \"executables\": [\"\(exe)\"] (keychaind reads it as soon as it is written)"
        }
        return AppRegistry(
            registrations: registrations, bundledCLI: context.bundledCLI, howToRegister: how,
            principal: principal.uid != 0 ? principal : nil)
    }

    /// The registration an identified peer runs, or why the peer is not one.
    public func identify(_ peer: PeerIdentity) -> Result<AppEntry, KeychainIdentityError> {
        if let appID = peer.flatpakAppID { return .success(flatpakApp(appID)) }
        guard let exe = peer.executable, let file = peer.executableFile else {
            return .failure(KeychainIdentityError("caller not identified: \(peer.problem ?? "unknown executable")"))
        }
        let key = Array(exe.utf8)
        if let reason = refused[key] { return .failure(reason) }
        guard let entry = byExecutable[key] else {
            return .failure(
                KeychainIdentityError("executable \(exe) is not registered with keychaind; \(howToRegister(exe))"))
        }
        // The file at the registered path, now, in keychaind's mount namespace, must be the very file
        // the peer runs: not a copy, not another file mounted over that path, not a replaced one.
        guard FileIdentity.of(path: exe) == file else {
            return .failure(
                KeychainIdentityError(
                    "pid \(peer.pid) does not run the file registered at \(exe) (it was replaced, or another file is mounted over that path)"
                ))
        }
        // And that file, and every directory above it, must still be beyond the user's reach now: a
        // directory that became writable (an ACL added after the registry was read) lets the user
        // rename any file over the registered path, and the test above passes for it.
        if let principal, judged.contains(key),
            let problem = TrustedPaths.modifiableProblemNow(exe, by: principal, cache: unmodifiable)
        {
            return .failure(KeychainIdentityError(Self.modifiable(exe, problem)))
        }
        return .success(entry)
    }

    /// The app a sandboxed peer with Flatpak app ID `appID` is: the first trusted registration that
    /// names the ID in `flatpak-app-ids`, else an app of its own, `flatpak.<app id>` with the one
    /// group of that name — so that every sandboxed app is walled off from every other without any
    /// set-up. Never an admin (anything of the user can make a sandbox naming any app ID), and
    /// identified on the bus too: a sandboxed process cannot exec its way out of its sandbox.
    func flatpakApp(_ appID: String) -> AppEntry {
        var entry: AppEntry
        if let registered = registrations.first(where: {
            $0.untrusted == nil && $0.entry.flatpakAppIDs.contains { $0.utf8.elementsEqual(appID.utf8) }
        }) {
            entry = registered.entry
        } else {
            entry = AppEntry(
                applicationIdentifier: Self.flatpakPrefix + appID, accessGroups: [Self.flatpakPrefix + appID],
                executables: [], admin: false, file: "(the Flatpak sandbox of \(appID), unregistered)")
            entry.flatpakAppIDs = [appID]
        }
        entry.admin = false
        entry.onBus = true
        return entry
    }

    /// The prefix of the identifier and group of an unregistered Flatpak app.
    public static let flatpakPrefix = "flatpak."

    /// Why `exe`, which the user can change (`problem` says how), carries no identity.
    static func modifiable(_ exe: String, _ problem: String) -> String {
        "registered executable \(exe) can be modified by this user (\(problem)), so it cannot carry an identity; install it root-owned (for example under /usr/local/bin) and register that path"
    }

    /// Registrations that do not count, for logs and status.
    public var untrusted: [Registration] {
        registrations.filter { $0.untrusted != nil || !$0.refusedExecutables.isEmpty }
    }
}
