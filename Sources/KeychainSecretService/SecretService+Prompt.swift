import Foundation
public import KeychainCore
import KeychainItems
public import KeychainPrompt
import KeychainRequests
public import KeychainSystem
import Synchronization

/// How a pinentry thread's prompt ended, handed to the bus thread.
enum PromptOutcome: Sendable {
    case unlocked
    /// A yes in the yes/no dialog about other apps' items.
    case confirmed
    case ended(PromptFailure)
}

/// Secret Service prompts with a window: `Prompt(window-id)` of an `Unlock` shows the passphrase
/// dialog through pinentry (KeychainPrompt), one at a time, on a thread of its own so the bus thread
/// keeps serving. A right passphrase unlocks (the same unlock as `keychainctl unlock`) and every
/// waiting prompt completes; a cancel, a timeout or three wrong passphrases dismiss that prompt.
/// Where no dialog can be shown (no pinentry, no display), the prompt waits for an unlock from
/// elsewhere, as it always could.
extension SecretService {
    /// What the dialog says: the app asking (its registration's application-identifier, or the
    /// executable of a program that is none) and what it wants unlocked.
    func request(_ known: BusCaller, _ caller: Caller, _ objects: [String], foreign: Int = 0) -> PromptRequest {
        let app =
            known.registered
            ? "The app \(caller.applicationIdentifier)"
            : "The program \(known.identity.executable ?? "pid \(known.identity.pid)") (not a registered app)"
        var items = 0
        var collections: [String] = []
        for path in objects {
            switch try? resolve(path, known) {
            case .item?: items += 1
            case .collection(let c)?: collections.append(c.group)
            default: break
            }
        }
        var wants: [String] = []
        if items > 0 {
            wants.append(items == 1 ? "read an item" : "read \(items) items")
        }
        if foreign > 0 {
            wants.append(
                "then ask you about \(foreign == 1 ? "an item" : "\(foreign) items") of other apps")
        }
        if !collections.isEmpty {
            wants.append(
                "open its collection\(collections.count == 1 ? "" : "s") \(collections.joined(separator: ", "))")
        }
        var description = "\(app) asks to unlock the keychain to \(wants.joined(separator: " and "))"
        if let search = known.lastSearch, items > 0 { description += " (it searched for \(search))" }
        description += ".\n\nType the keychain passphrase to unlock the keychain for it."
        return PromptRequest(title: "Unlock the keychain", description: description)
    }

    /// A search's attributes as a prompt shows them: `name=value, …`, sorted, control bytes left
    /// out, cut short.
    static func describe(_ query: SecretServiceAttributes) -> String {
        var text = query.sorted.map {
            String(decoding: $0.name, as: UTF8.self) + "=" + String(decoding: $0.value, as: UTF8.self)
        }.joined(separator: ", ")
        text = String(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(300))
        return text.isEmpty ? "any item" : text
    }

    /// Shows the next waiting prompt's dialog, unless one is showing or the keychain is unlocked.
    func askNext() {
        while asking == nil,
            let (path, p) = prompts.first(where: {
                $0.value.waiting && !$0.value.asked && ($0.value.confirming || !items.secretServiceUnlocked)
            })
        {
            prompts[path]?.asked = true
            if p.confirming {
                _ = confirmForeign(path, p)  // shows its dialog, or dismisses the prompt
                continue
            }
            let prompter = passphrasePrompts.prompter()
            if let why = prompter.unavailable(p.request) {
                waitForUnlock(why)
                continue
            }
            asking = path
            Log.info(
                "secret service: asking for the keychain passphrase",
                [("prompt", path), ("program", prompter.program ?? "-")])
            let passphrasePrompts = self.passphrasePrompts
            let request = p.request
            showDialog(for: path) { () throws(PromptFailure) -> PromptOutcome in
                try prompter.ask(request) { (pin) throws(KeychainError) -> String? in
                    do throws(KeychainError) {
                        try passphrasePrompts.unlock(pin, "passphrase prompt")
                        return nil
                    } catch  where error.status == .authFailed {
                        return error.message
                    }
                }
                return .unlocked
            }
        }
    }

    /// Runs one pinentry dialog of prompt `path` on a thread of its own (it may wait minutes for
    /// the person); its outcome, or how it ended, goes to `answers` and wakes the bus thread, which
    /// takes it in `takeAnswers`.
    func showDialog(for path: String, _ dialog: @escaping @Sendable () throws(PromptFailure) -> PromptOutcome) {
        let thread = Thread { [self] in
            let outcome: PromptOutcome
            do throws(PromptFailure) {
                outcome = try dialog()
            } catch {
                outcome = .ended(error)
            }
            self.answers.withLock { $0.append((path, outcome)) }
            self.wake.wake()
        }
        thread.stackSize = 1 << 20
        thread.name = "pinentry"
        thread.start()
    }

    /// The answers of finished dialogs (bus thread): completes or dismisses their prompts, then
    /// shows the next one.
    func takeAnswers() {
        let taken = answers.withLock { (a) -> [(path: String, outcome: PromptOutcome)] in
            defer { a.removeAll() }
            return a
        }
        guard !taken.isEmpty else { return }
        for (path, outcome) in taken {
            if asking == path { asking = nil }
            switch outcome {
            case .unlocked:
                checkPrompts()
            case .confirmed:
                foreignAllowed(path)
            case .ended(.unavailable(let why)) where prompts[path]?.confirming != true:
                waitForUnlock(why)
            case .ended(let failure):
                Log.info(
                    "secret service: a passphrase prompt was dismissed",
                    [("prompt", path), ("why", failure.keychainError.message)])
                if let p = prompts.removeValue(forKey: path) { complete(path, p, dismissed: true) }
            }
        }
        checkPrompts()
        askNext()
    }

    /// No dialog can be shown: the prompt waits for `keychainctl unlock` (said once until the unlock).
    private func waitForUnlock(_ why: String) {
        guard !waitingLogged else { return }
        Log.write(
            .notice, "secret service: a client waits for the keychain to be unlocked (keychainctl unlock)",
            [("why", why)])
        waitingLogged = true
    }
}

/// What a Secret Service passphrase prompt needs from the daemon: the pinentry the settings name,
/// and the unlock a typed passphrase makes (the same as `keychainctl unlock`'s request).
public struct PassphrasePrompts: Sendable {
    /// The prompter the settings describe, looked up when a prompt is shown.
    public let prompter: @Sendable () -> Prompter
    /// Unlocks with a typed passphrase, for the reason given (logged, never the passphrase):
    /// errSecAuthFailed when it is wrong.
    public let unlock: @Sendable (SecretBytes, String) throws(KeychainError) -> Void

    /// The two, as the daemon provides them.
    public init(
        prompter: @escaping @Sendable () -> Prompter,
        unlock: @escaping @Sendable (SecretBytes, String) throws(KeychainError) -> Void
    ) {
        self.prompter = prompter
        self.unlock = unlock
    }
}
