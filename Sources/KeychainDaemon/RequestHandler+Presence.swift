import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainPrompt
import KeychainRequests
import KeychainSystem
import Synchronization

/// How reading an item whose access control says `.userPresence` is confirmed (`presenceConfirmation`).
public enum PresenceConfirmation: String, Sendable {
    /// The keychain passphrase, typed into pinentry (the default).
    case passphrase
    /// A yes/no dialog (pinentry's CONFIRM). `.devicePasscode` still takes the passphrase.
    case confirm
}

/// The config's word on items that need the person (`presenceConfirmation`, `presenceReuseSeconds`).
public struct PresenceSettings: Sendable {
    /// Passphrase or yes/no for `.userPresence`.
    public var confirmation: PresenceConfirmation
    /// Seconds a confirmation lets the same app read the same item again (0: never).
    public var reuseSeconds: Int

    /// The settings as given (the defaults: passphrase, no reuse).
    public init(confirmation: PresenceConfirmation = .passphrase, reuseSeconds: Int = 0) {
        self.confirmation = confirmation
        self.reuseSeconds = reuseSeconds
    }
}

/// The reuse window: which app may read which item again without asking, until when (monotonic
/// milliseconds). Per app and per item: a confirmation for one app lets no other app read, and one
/// for one item no other item. A lock of the keychain ends the window.
final class PresenceWindow: Sendable {
    /// Per app, per item: the keychain's lock count when the person allowed it, and until when it counts.
    private let until = Locked<[String: [[UInt8]: (locks: Int, until: Int64)]]>([:])

    /// Whether `app` was allowed `ref` within the window, with no lock since (`locks`: the lock count now).
    func allows(app: String, ref: [UInt8], locks: Int) -> Bool {
        let now = MonotonicClock.milliseconds()
        return until.withLock { windows in
            guard let entry = windows[app]?[ref] else { return false }
            return entry.until > now && entry.locks == locks
        }
    }

    /// Remembers that the person allowed `app` to read `ref`, for `seconds` (nothing when 0).
    func note(app: String, ref: [UInt8], seconds: Int, locks: Int) {
        guard seconds > 0 else { return }
        let now = MonotonicClock.milliseconds()
        until.withLock { windows in
            // Expired entries go as new ones come: the map holds at most what was allowed lately.
            for (name, refs) in windows {
                let live = refs.filter { $0.value.until > now }
                windows[name] = live.isEmpty ? nil : live
            }
            windows[app, default: [:]][ref] = (locks, now + Int64(seconds) * 1000)
        }
    }
}

/// Items whose access control (`kSecAttrAccessControl` with `.userPresence` / `.devicePasscode`)
/// needs the person: a `copy` that returns their data, or an `update` of them, runs first without a
/// grant; when the item service says an item needs presence, the person is asked through pinentry
/// (naming the app and the item), one dialog per item, and the request runs again with what they
/// allowed. Attribute-only reads and deletes never ask (Apple's rule).
extension RequestHandler {
    /// Runs `call` without a grant; when an item needs the person, asks (or, within the reuse
    /// window, does not) and runs it again with the grant. errSecInteractionNotAllowed when the
    /// caller refuses UI (kSecUseAuthenticationUIFail, kSecUseNoAuthenticationUI) or no dialog can
    /// be shown; kSecUseAuthenticationUISkip leaves such items out. errSecUserCanceled when the
    /// person says no or cancels; errSecAuthFailed after `Prompter.attempts` wrong passphrases.
    func askingForPresence(
        _ action: Operation, query: [String: Value]?, app: AppEntry?, caller: Caller?,
        _ call: (PresenceGrant?) throws(KeychainError) -> Value?
    ) throws(KeychainError) -> Value? {
        do {
            return try call(nil)
        } catch  where error.needsPresence {
            guard let query, let caller, let app, action == .copy || action == .update else { throw error }
            let ui = try Self.authenticationUI(query)
            let appID = app.applicationIdentifier
            var grant = PresenceGrant()
            for item in try items.itemsNeedingPresence(query, for: action, caller: caller) {
                if caller.isAdmin && caller.hasPresence {
                    // An administrator's request that carried the keychain passphrase has proved it.
                    grant.refs.insert(item.ref)
                    continue
                }
                if presenceWindow.allows(app: appID, ref: item.ref, locks: items.lockCount) {
                    grant.refs.insert(item.ref)
                    continue
                }
                switch ui {
                case .allow: break
                case .skip:
                    grant.skipOthers = true
                    continue
                case .fail:
                    throw KeychainError(
                        .interactionNotAllowed,
                        "the item's access control needs the person's confirmation, and the query does not allow authentication UI"
                    )
                }
                let locks = items.lockCount
                try confirmPresence(item, action: action, app: appID)
                grant.refs.insert(item.ref)
                presenceWindow.note(app: appID, ref: item.ref, seconds: presence.reuseSeconds, locks: locks)
            }
            do {
                return try call(grant)
            } catch  where error.needsPresence {
                // Changed between the question and the answer: not asked about, not served.
                throw KeychainError(.interactionNotAllowed, error.message)
            }
        }
    }

    /// Asks the person about one item: the passphrase, or yes/no where the config and the item's
    /// access control allow it. One dialog at a time daemon-wide (`RequestCore.promptLock`).
    private func confirmPresence(_ item: PresenceItem, action: Operation, app: String) throws(KeychainError) {
        guard let makePrompter else {
            throw KeychainError(
                .interactionNotAllowed, "the item's access control needs a prompt, and none can be shown")
        }
        let yesNo = presence.confirmation == .confirm && item.confirmable
        if !yesNo && !items.hasPassphrase {
            throw KeychainError(.authFailed, "the item's access control needs the keychain passphrase, and none is set")
        }
        try core.promptLock.withLock { () throws(KeychainError) in
            let prompter = makePrompter()
            let verb = action == .update ? "change" : "read"
            let ending =
                yesNo ? "Allow it?" : "Enter the keychain passphrase to allow it."
            var request = PromptRequest(
                title: "Allow access to a keychain item",
                description: "\(app) wants to \(verb) the item \(item.description) in your keychain. \(ending)")
            request.prompt = "Passphrase:"
            if let why = prompter.unavailable(request) {
                Log.info("no prompt for an item that needs presence", [("app", app), ("why", why)])
                throw KeychainError(.interactionNotAllowed, why)
            }
            Log.info(
                "asking to allow access to an item",
                [("app", app), ("how", yesNo ? "confirm" : "passphrase"), ("program", prompter.program ?? "-")])
            do throws(PromptFailure) {
                if yesNo {
                    try prompter.confirm(request, okLabel: "Allow", cancelLabel: "Deny")
                } else {
                    try prompter.ask(request) { (pin) throws(KeychainError) -> String? in
                        let passphrase = try pin.withUnsafeBytes { (b) throws(KeychainError) in
                            try PasswordHash.passphrase(b)
                        }
                        guard let passphrase else { return "the passphrase is empty" }
                        do throws(KeychainError) {
                            try items.verifyPresence(passphrase: passphrase)
                            return nil
                        } catch  where error.status == .authFailed {
                            return error.message
                        }
                    }
                }
            } catch {
                Log.info(
                    "access to an item was not allowed", [("app", app), ("why", error.keychainError.message)])
                if case .canceled = error {
                    throw KeychainError(.userCanceled, "the person did not allow access to the item")
                }
                throw error.keychainError
            }
            Log.info("access to an item allowed", [("app", app)])
        }
    }
}
