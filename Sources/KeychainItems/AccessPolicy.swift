public import KeychainCore

/// Who is asking, once the daemon has identified the calling process (docs/security.md §2): a registered app with
/// its keychain access groups, whether it is an administrator, and whether this request proved the
/// user's presence (carried the keychain passphrase, or none is set).
public struct Caller: Sendable, Hashable {
    /// The app's `application-identifier` (empty in unit tests that do not care).
    public var applicationIdentifier: String
    /// Ordered; the first is where an add without `agrp` goes. Empty means no entitlement at all.
    public var accessGroups: [String]
    /// May act on every group; secrets and writes outside its own groups need `hasPresence`.
    public var isAdmin: Bool
    /// The keychain passphrase was verified in this request, or no passphrase is set (there is
    /// nothing to prove then: docs/security.md §2, "What each caller may do").
    public var hasPresence: Bool

    /// A caller with these groups; by default not an admin, with presence proved (as when no passphrase is set).
    public init(
        applicationIdentifier: String = "", accessGroups: [String], isAdmin: Bool = false, hasPresence: Bool = true
    ) {
        self.applicationIdentifier = applicationIdentifier
        self.accessGroups = accessGroups
        self.isAdmin = isAdmin
        self.hasPresence = hasPresence
    }

    /// Whether `group` is one of the caller's own groups, compared byte for byte (the blind indexes
    /// hash raw UTF-8, so two spellings Swift calls equal — NFC and NFD — are two groups).
    public func owns(_ group: String) -> Bool {
        accessGroups.contains { AccessPolicy.sameGroup($0, group) }
    }
}

/// The access policy in one place: which requests a caller may make, which groups a query sees,
/// and when an administrator must prove presence. The daemon turns a peer into a `Caller` (or an
/// unidentified peer with a reason) and asks `decide`; the item service asks the item-level rules
/// (`scope`, `checkEntitlement`, `checkAdminReach`) while it matches items. Every refusal carries the
/// status and the one-line reason the client gets.
public enum AccessPolicy {
    /// The policy's answer.
    public enum Decision: Sendable, Equatable {
        /// Serve it.
        case allow
        /// Serve it once the keychain passphrase in the request has been verified (an admin op on the
        /// whole keychain while a passphrase is set).
        case allowWithPresence
        /// Refuse with this error.
        case deny(KeychainError)
    }

    /// Only the daemon's own user is served (SO_PEERCRED).
    public static func admit(peerUID: UInt32, daemonUID: UInt32) -> KeychainError? {
        guard peerUID == daemonUID else {
            return KeychainError(
                .missingEntitlement, "keychaind serves only uid \(daemonUID); caller is uid \(peerUID)")
        }
        return nil
    }

    /// Every frame must come from the process identified at accept (SCM_CREDENTIALS of each read):
    /// a frame written by another process through an inherited or passed socket is refused and the
    /// connection closed. `writerPID` 0 means the kernel attached no credentials.
    public static func checkWriter(writerPID: Int32, identifiedPID: Int32, identifiedIsRunning: Bool) -> KeychainError?
    {
        if writerPID == 0 {
            return KeychainError(
                .missingEntitlement,
                "this connection's data carries no sender credentials (the listening socket was created without SO_PASSCRED; systemd: PassCredentials=yes); connect again"
            )
        }
        guard writerPID == identifiedPID, identifiedIsRunning else {
            return KeychainError(
                .missingEntitlement,
                "a frame on this connection was written by pid \(writerPID), not by pid \(identifiedPID), the process that connected; each process must open its own connection"
            )
        }
        return nil
    }

    /// A connection's first bytes arrived before the daemon could pin the connecting process (a kernel
    /// without `SO_PEERPIDFD`), and did not come with a pidfd showing that their writer is the
    /// process that has the connecting pid now: they may be an exited process's, whose pid another
    /// process (perhaps a registered app) has since been given.
    public static func unprovenFirstWrite(identifiedPID: Int32) -> KeychainError {
        KeychainError(
            .missingEntitlement,
            "this connection's first request arrived before keychaind could pin pid \(identifiedPID) (this kernel has no SO_PEERPIDFD) and did not carry a pidfd of the process that wrote it, so it may come from an exited process whose pid was reused; send the connection's first bytes with a pidfd of the sending process (SCM_RIGHTS; docs/protocol.md), as keychaind's own clients do"
        )
    }

    /// Who may ask for what. `caller` is nil for a peer that could not be identified as a registered
    /// app (`unidentified` says why, and how to register; `unidentifiedStatus` is what it gets:
    /// errSecMissingEntitlement, or errSecInteractionNotAllowed when its registration can be checked
    /// only after the first unlock). `passphraseSet`: whether the keychain has one.
    public static func decide(
        _ action: Operation, caller: Caller?, unidentified: String,
        unidentifiedStatus: Status = .missingEntitlement, passphraseSet: Bool
    ) -> Decision {
        if action == .status { return .allow }
        guard let caller else { return .deny(KeychainError(unidentifiedStatus, unidentified)) }
        switch action {
        case .add, .copy, .update, .delete, .status, .lock, .unlock:
            // Item requests: group rules are applied item by item (`scope`, `checkAdminReach`).
            // lock/unlock: the passphrase itself is the proof; any identified app may offer it.
            return .allow
        case .passwd:
            // The current passphrase is required in the request itself ("old"), so no separate proof.
            guard caller.isAdmin else { return .deny(adminOnly(action, caller)) }
            return .allow
        case .sync:
            // Presence (the passphrase) is checked by the sync request for everything but status.
            guard caller.isAdmin else { return .deny(adminOnly(action, caller)) }
            return .allow
        case .backup, .restore, .approve, .revoke:
            guard caller.isAdmin else { return .deny(adminOnly(action, caller)) }
            return passphraseSet ? .allowWithPresence : .allow
        }
    }

    private static func adminOnly(_ action: Operation, _ caller: Caller) -> KeychainError {
        KeychainError(
            .missingEntitlement,
            "op \"\(action.rawValue)\" is for admin apps (a trusted registration with \"admin\": true); \(caller.applicationIdentifier.isEmpty ? "this caller" : caller.applicationIdentifier) is not one"
        )
    }

    // MARK: Item-level rules

    package static let noGroups = KeychainError(
        .missingEntitlement,
        "the caller has no keychain access groups; register the application with keychain-access-groups")

    /// The groups a query may see: the one it names (if the caller may name it), else all of the
    /// caller's (nil: every group, for administrators). Duplicates removed, byte-exact.
    public static func scope(naming named: String?, _ caller: Caller) throws(KeychainError) -> [String]? {
        if let named {
            try checkEntitlement(named, caller)
            return [named]
        }
        if caller.isAdmin { return nil }
        guard !caller.accessGroups.isEmpty else { throw noGroups }
        var groups: [String] = []
        groups.reserveCapacity(caller.accessGroups.count)
        for g in caller.accessGroups where !groups.contains(where: { sameGroup($0, g) }) { groups.append(g) }
        return groups
    }

    /// An app may name only its own groups (errSecMissingEntitlement); an administrator any group.
    public static func checkEntitlement(_ group: String, _ caller: Caller) throws(KeychainError) {
        if caller.isAdmin { return }
        guard !caller.accessGroups.isEmpty else { throw noGroups }
        guard caller.owns(group) else {
            throw KeychainError(.missingEntitlement, "the caller is not entitled to the access group named in agrp")
        }
    }

    /// What an administrator does outside its own groups: reading secrets, or writing (add, update,
    /// delete). Both need presence while a passphrase is set; attributes and listing do not.
    public enum Reach: Sendable {
        case readSecrets, write

        var verb: String { self == .readSecrets ? "reading secrets of" : "changing items of" }
    }

    /// Called with the groups of the items a request is about to return (with secrets) or change:
    /// an administrator without presence may touch only its own groups (errSecAuthFailed with
    /// `needsPassphrase`, so the client can ask for the passphrase and try again).
    public static func checkAdminReach(_ groups: some Sequence<String>, _ reach: Reach, _ caller: Caller)
        throws(KeychainError)
    {
        guard caller.isAdmin, !caller.hasPresence else { return }
        for group in groups where !caller.owns(group) {
            throw KeychainError.passphraseNeeded(
                "\(reach.verb) access group \(printable(group)) needs the keychain passphrase (keychainPassphrase): an administrator proves the user's presence outside its own groups"
            )
        }
    }

    /// Byte-exact comparison of access-group names.
    public static func sameGroup(_ a: String, _ b: String) -> Bool {
        a.utf8.elementsEqual(b.utf8)
    }

    /// A group name for a message: printable ASCII, at most 64 characters.
    static func printable(_ s: String) -> String {
        String(
            s.unicodeScalars.prefix(64).map { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?" })
    }
}

extension AccessPolicy {
    /// What unregistered bus callers get (`secretServiceUnregistered` in keychaind.json).
    public enum UnregisteredBusCallers: String, Sendable, CaseIterable {
        /// One shared collection (the access group `secret-service`), as every desktop provider
        /// gives every process of the session today.
        case shared
        /// Nothing: errors naming the reason and how to register.
        case refuse
    }

    /// What a registered app's bus search does with matching items of groups that are not its own
    /// (`secretServiceForeignItems` in keychaind.json).
    public enum ForeignBusItems: String, Sendable, CaseIterable {
        /// It never sees them: a search, a path, a read of another group's item finds nothing.
        case refuse
        /// A search also lists them, locked; `Unlock` of one asks the person (a yes/no dialog naming
        /// the app and the item), and a yes lets that bus connection read it until the keychain locks.
        case confirm
    }
}
