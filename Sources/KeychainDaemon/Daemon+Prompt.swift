public import KeychainCore
public import KeychainPrompt
public import KeychainSystem

/// Asking a person for the keychain passphrase: the pinentry the config names, and the
/// unlock a typed passphrase makes — the same unlock as `keychainctl unlock`'s request.
extension Daemon {
    /// The prompter the settings describe (`pinentryProgram`, `pinentryTimeoutSeconds`), looked up now.
    public var prompter: Prompter {
        Prompter(configured: settings.pinentryProgram, timeoutSeconds: settings.pinentryTimeoutSeconds)
    }

    /// Unlocks with a passphrase a person typed at a prompt shown for `by` (logged, never the
    /// passphrase): errSecAuthFailed when it is wrong, counted towards the wrong-passphrase delays.
    public func unlock(typed: SecretBytes, by: String) throws(KeychainError) {
        try handler.unlock(typed: typed, by: by)
    }
}
