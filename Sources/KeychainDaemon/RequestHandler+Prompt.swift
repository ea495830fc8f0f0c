import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainPrompt
import KeychainRequests
import KeychainSystem
import KeychainWire

/// A SecItem call on a locked keychain asks the person for the passphrase (pinentry), then is
/// served: Apple's behaviour when the caller allows authentication UI. Runs on the requesting
/// connection's own thread, so the dialog keeps no other client waiting; one dialog at a time
/// daemon-wide (`RequestCore.promptLock`): a second caller waits for the first dialog to end and,
/// when it unlocked the keychain, is served without a dialog of its own.
extension RequestHandler {
    /// What the caller said about authentication UI (`u_AuthUI`, `u_NoAuthUI` in its query).
    enum AuthenticationUI {
        /// kSecUseAuthenticationUIAllow, or nothing said (Apple's default).
        case allow
        /// kSecUseAuthenticationUIFail, or kSecUseNoAuthenticationUI true.
        case fail
        /// kSecUseAuthenticationUISkip: no dialog (a locked keychain cannot be searched around).
        case skip
    }

    /// The caller's choice in `query`; errSecParam for a value Apple does not define.
    static func authenticationUI(_ query: [String: Value]) throws(KeychainError) -> AuthenticationUI {
        var choice = AuthenticationUI.allow
        if let value = query["u_AuthUI"] {
            switch value {
            case .text("u_AuthUIA"): choice = .allow
            case .text("u_AuthUIF"): choice = .fail
            case .text("u_AuthUIS"): choice = .skip
            default:
                throw .param(
                    "u_AuthUI (kSecUseAuthenticationUI) must be u_AuthUIA, u_AuthUIF or u_AuthUIS (Allow, Fail, Skip)")
            }
        }
        for key in ["u_NoAuthUI", "u_NoAuth"] {
            guard let value = query[key] else { continue }
            switch value {
            case .bool(let b): if b { choice = .fail }
            case .int(let i) where i == 0 || i == 1: if i == 1 { choice = .fail }
            default: throw .param("\(key) (kSecUseNoAuthenticationUI) must be a boolean")
            }
        }
        return choice
    }

    /// Runs `call`; when it fails because the keychain is locked and the caller allows UI, asks the
    /// person for the passphrase (naming `app` and the item of `query`), then runs it once more.
    /// errSecUserCanceled when the person cancels; errSecAuthFailed after the wrong passphrases
    /// `Prompter.attempts` allows; errSecInteractionNotAllowed (the original error) when the UI is
    /// refused or no dialog can be shown.
    func askingToUnlock(
        _ action: Operation, query: [String: Value]?, app: AppEntry?,
        _ call: () throws(KeychainError) -> Value?
    ) throws(KeychainError) -> Value? {
        do {
            return try call()
        } catch  where error.status == .interactionNotAllowed {
            guard let makePrompter, let app, let query, items.isLocked,
                try Self.authenticationUI(query) == .allow
            else { throw error }
            try core.promptLock.withLock { () throws(KeychainError) in
                guard items.isLocked else { return }
                let prompter = makePrompter()
                var request = PromptRequest(
                    title: "Unlock the keychain",
                    description: Self.promptDescription(action, query: query, app: app.applicationIdentifier))
                request.prompt = "Passphrase:"
                if let why = prompter.unavailable(request) {
                    Log.info(
                        "no passphrase prompt for a locked keychain",
                        [("app", app.applicationIdentifier), ("why", why)])
                    throw error
                }
                Log.info(
                    "asking for the keychain passphrase",
                    [("app", app.applicationIdentifier), ("program", prompter.program ?? "-")])
                do throws(PromptFailure) {
                    try prompter.ask(request) { (pin) throws(KeychainError) -> String? in
                        do throws(KeychainError) {
                            try unlock(typed: pin, by: "passphrase prompt for \(app.applicationIdentifier)")
                            return nil
                        } catch  where error.status == .authFailed {
                            return error.message
                        }
                    }
                } catch {
                    // Unlocked meanwhile by someone else (`keychainctl unlock`, the Secret Service's
                    // dialog): the call is served whatever this dialog's end.
                    if !items.isLocked { return }
                    Log.info(
                        "passphrase prompt ended without unlocking",
                        [("app", app.applicationIdentifier), ("why", error.keychainError.message)])
                    throw error.keychainError
                }
            }
            return try call()
        }
    }

    /// Unlocks with a passphrase a person typed at a prompt shown for `by` (logged, never the
    /// passphrase): errSecAuthFailed when it is wrong, counted towards the wrong-passphrase delays.
    func unlock(typed: SecretBytes, by: String) throws(KeychainError) {
        let passphrase = try typed.withUnsafeBytes { (b) throws(KeychainError) in try PasswordHash.passphrase(b) }
        guard let passphrase else { throw KeychainError(.authFailed, "the passphrase is empty") }
        try unlock(passphrase: passphrase, by: by)
    }

    /// What the dialog says: the app asking (its registration) and the item (service and account,
    /// else label) and what it wants to do with it.
    static func promptDescription(_ action: Operation, query: [String: Value], app: String) -> String {
        func text(_ key: String) -> String? {
            switch query[key] {
            case .text(let t): return t
            case .bytes(let b): return String(validating: b, as: UTF8.self) ?? "\(b.count) bytes"
            default: return nil
            }
        }
        var item: [String] = []
        if let s = text("svce") { item.append("service=\(s)") }
        if let a = text("acct") { item.append("account=\(a)") }
        if let s = text("srvr") { item.append("server=\(s)") }
        if item.isEmpty, let l = text("labl") { item.append("label=\(l)") }
        let what = item.isEmpty ? "items" : "the item " + item.joined(separator: " ")
        let verb: String
        switch action {
        case .add: verb = "add"
        case .update: verb = "change"
        case .delete: verb = "delete"
        default: verb = "read"
        }
        return
            "\(app) wants to \(verb) \(what) in your keychain, which is locked. Enter the keychain passphrase to unlock it."
    }
}
