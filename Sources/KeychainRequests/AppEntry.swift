public import KeychainCore

/// One registered application (`apps.d/*.json`, docs/security.md §2).
public struct AppEntry: Sendable, Equatable {
    /// The identity the daemon gives the app's processes (`application-identifier`).
    public var applicationIdentifier: String
    /// The access groups the app may use, in order; the first is the default for adds.
    public var accessGroups: [String]
    /// Absolute paths of the executables whose processes are identified as this app.
    public var executables: [String]
    /// Whether the app may make administrator calls (lock, passphrase, backup, approvals).
    public var admin: Bool
    /// The registration file the entry was read from, for messages.
    public var file: String
    /// `"secretService": true` in the file: the app asks to be identified on the session bus too.
    /// Honoured, while a passphrase is set, only in a root-owned system registration (`onBus`).
    public var secretService = false
    /// Whether a bus caller running this app is identified as it (decided when the registry is
    /// read): always without a passphrase; with one, only for a system registration that asks for it.
    /// On the bus a caller is whatever its connecting process runs when first asked, and any process
    /// of the user can open a connection and then exec a registered app, so an app is reachable
    /// there only when it said so in a file the user's processes cannot write (docs/security.md).
    public var onBus = false
    /// Flatpak app IDs (`flatpak-app-ids`) whose sandboxed processes are identified as this app
    /// (read from their sandbox's `/.flatpak-info`, never their executable; never as an admin).
    public var flatpakAppIDs: [String] = []

    /// An entry from its fields, as read from a registration file; validates nothing.
    public init(applicationIdentifier: String, accessGroups: [String], executables: [String], admin: Bool, file: String)
    {
        self.applicationIdentifier = applicationIdentifier
        self.accessGroups = accessGroups
        self.executables = executables
        self.admin = admin
        self.file = file
    }
}

/// Why a peer is not a registered app: the message an unidentified caller gets with −34018.
public struct KeychainIdentityError: Error, Sendable {
    /// The one line the client gets, saying why the peer is not registered and what to do.
    public let message: String
    /// What the peer's requests get: errSecMissingEntitlement, or errSecInteractionNotAllowed while
    /// its registration cannot be checked before the first unlock (`Registration.untilUnlock`).
    public let status: Status
    package init(_ message: String, status: Status = .missingEntitlement) {
        self.message = message
        self.status = status
    }
}

extension AppEntry {
    /// The same registration: identifier, groups, executables and admin flag, byte for byte (the
    /// file it was read from does not matter). What an approval covers.
    public func sameRegistration(as other: AppEntry) -> Bool {
        func same(_ a: [String], _ b: [String]) -> Bool {
            a.count == b.count && zip(a, b).allSatisfy { $0.utf8.elementsEqual($1.utf8) }
        }
        return applicationIdentifier.utf8.elementsEqual(other.applicationIdentifier.utf8)
            && same(accessGroups, other.accessGroups) && same(executables, other.executables) && admin == other.admin
            && same(flatpakAppIDs, other.flatpakAppIDs)
    }
}
