public import KeychainCore
public import KeychainItems

/// The access policy for callers on the session bus (the Secret Service). A bus caller is
/// identified as a socket caller is — its process pinned with a pidfd, its executable file looked
/// up among the registrations that count — and then decided here, with the same rules.
extension AccessPolicy {
    /// The access group of the shared collection.
    public static let secretServiceSharedGroup = "secret-service"

    /// The caller a bus peer is to the Secret Service: a registered app sees its own groups (an
    /// administrator too: the bus carries no passphrase, so no reach beyond them); an unregistered
    /// peer the shared collection or a refusal. `app` is nil for a peer that is not a registered app
    /// (`unidentified` says why).
    public static func secretServiceCaller(
        app: Caller?, unidentified: String,
        unregistered: UnregisteredBusCallers
    ) -> Result<Caller, KeychainError> {
        if var app {
            guard !app.accessGroups.isEmpty else { return .failure(noGroups) }
            app.isAdmin = false
            app.hasPresence = true
            return .success(app)
        }
        switch unregistered {
        case .shared:
            return .success(Caller(applicationIdentifier: "", accessGroups: [secretServiceSharedGroup]))
        case .refuse:
            return .failure(
                KeychainError(
                    .missingEntitlement,
                    "keychaind serves the Secret Service to registered apps only (secretServiceUnregistered is \"refuse\"): \(unidentified)"
                ))
        }
    }

    /// What a bus caller may ask for: the Secret Service's calls are item calls on the caller's own
    /// groups, plus `lock` (any app may lock, as on the socket). Unlocking goes through a prompt that
    /// completes when the keychain is unlocked with its passphrase (`keychainctl unlock`).
    public static func decideOnBus(_ action: Operation, caller: Caller) -> Decision {
        switch action {
        case .add, .copy, .update, .delete, .lock:
            return decide(action, caller: caller, unidentified: "", passphraseSet: false)
        default:
            return .deny(
                KeychainError(.missingEntitlement, "op \"\(action.rawValue)\" is not offered on the session bus"))
        }
    }
}
