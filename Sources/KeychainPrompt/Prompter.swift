public import KeychainCore
public import KeychainSystem

/// What one passphrase prompt shows and where: the words a person reads (the only thing they see,
/// so they name who asks and for what) and the place it appears on.
public struct PromptRequest: Sendable {
    /// The window title.
    public var title: String
    /// What is asked and why: the app asking (its registration's application-identifier) and the
    /// item or collection it wants.
    public var description: String
    /// The label beside the entry.
    public var prompt = "Passphrase:"
    /// The X11 window the dialog belongs to (a Secret Service `Prompt(window-id)`), when given.
    public var parentWindow: String?
    /// The terminal to ask on (a terminal client's own tty, `OPTION ttyname`).
    public var ttyName: String?
    /// That terminal's `TERM` (`OPTION ttytype`).
    public var ttyType: String?

    /// A prompt with this title and description, the default label, and no window or terminal.
    public init(title: String, description: String) {
        self.title = title
        self.description = description
    }
}

/// Why a prompt ended without a right passphrase.
public enum PromptFailure: Error, Sendable {
    /// The person cancelled (pinentry's GPG_ERR_CANCELED).
    case canceled
    /// Nobody answered within the timeout (GPG_ERR_TIMEOUT).
    case timedOut(seconds: Int)
    /// Every attempt was wrong; the last reason.
    case wrongPassphrase(String)
    /// No prompt could be shown (no pinentry, no display and no terminal, pinentry failed).
    case unavailable(String)
    /// The check of a typed passphrase failed otherwise.
    case failed(KeychainError)

    /// As an OSStatus and one line: errSecUserCanceled (−128) for a cancel, else
    /// errSecInteractionNotAllowed saying why (or the check's own error).
    public var keychainError: KeychainError {
        switch self {
        case .canceled: return KeychainError(.userCanceled, "the passphrase prompt was cancelled")
        case .timedOut(let seconds):
            return KeychainError(.interactionNotAllowed, "nobody answered the passphrase prompt within \(seconds) s")
        case .wrongPassphrase(let reason): return KeychainError(.authFailed, reason)
        case .unavailable(let why): return KeychainError(.interactionNotAllowed, why)
        case .failed(let error): return error
        }
    }
}

/// Asks a person for the keychain passphrase through pinentry (the GnuPG family: gnome3, qt, gtk2,
/// curses, tty), spoken over Assuan with libassuan. The passphrase comes back in `SecretBytes`
/// (zeroed when dropped) and goes nowhere else; libassuan's own buffers are zeroed as they are freed.
/// Nothing secret is ever in pinentry's arguments or environment. Blocking: run it off any thread
/// that serves others.
public struct Prompter: Sendable {
    /// The pinentry to run: `pinentryProgram` from the config, else `pinentry` on `PATH`, else
    /// `/usr/bin/pinentry` (Debian's alternative); nil when none of them is an executable.
    public let program: String?
    /// Seconds pinentry waits for an answer before giving up (`SETTIMEOUT`; 0 = no limit).
    public let timeoutSeconds: Int
    /// What the program was looked for as (for messages).
    private let configured: String?
    /// The X display the dialog goes to: `DISPLAY` of this process (`OPTION display`).
    public var display = CurrentProcess.environment("DISPLAY").flatMap { $0.isEmpty ? nil : $0 }
    /// `WAYLAND_DISPLAY` of this process (pinentry inherits it).
    public var waylandDisplay = CurrentProcess.environment("WAYLAND_DISPLAY").flatMap { $0.isEmpty ? nil : $0 }

    /// How many passphrases one prompt takes before it gives up (each wrong one says so and asks again).
    public static let attempts = 3

    /// A prompter running `configured` (a path, or a name on `PATH`; nil: the defaults above).
    public init(configured: String?, timeoutSeconds: Int) {
        self.configured = configured
        self.timeoutSeconds = timeoutSeconds
        program = Self.find(configured)
    }

    static func find(_ configured: String?) -> String? {
        if let configured, !configured.isEmpty {
            if configured.contains("/") { return FileSystem.isExecutable(configured) ? configured : nil }
            return onPath(configured)
        }
        return onPath("pinentry") ?? (FileSystem.isExecutable("/usr/bin/pinentry") ? "/usr/bin/pinentry" : nil)
    }

    private static func onPath(_ name: String) -> String? {
        let path = CurrentProcess.environment("PATH") ?? "/usr/local/bin:/usr/bin:/bin"
        for dir in path.split(separator: ":") where dir.hasPrefix("/") {
            let candidate = dir + "/" + name
            if FileSystem.isExecutable(candidate) { return candidate }
        }
        return nil
    }

    /// Why no prompt can be shown for `request`, or nil when one can.
    public func unavailable(_ request: PromptRequest) -> String? {
        guard program != nil else {
            let what =
                configured.map { "the pinentryProgram \"\($0)\" is not an executable" }
                ?? "no pinentry program: none on PATH and no /usr/bin/pinentry"
            return
                "\(what); install pinentry (pinentry-gnome3, -qt, -gtk2, -curses or -tty) or set pinentryProgram in keychaind.json"
        }
        if display == nil && waylandDisplay == nil && request.ttyName == nil {
            return "nowhere to show a passphrase prompt: DISPLAY and WAYLAND_DISPLAY are unset and there is no terminal"
        }
        return nil
    }

    /// Shows one prompt and hands each passphrase typed to `check`, which returns nil when it is
    /// right or the one-line reason it is not (shown with `SETERROR` as the prompt asks again), up to
    /// `attempts` times. Throws why it ended otherwise (`PromptFailure.keychainError` as an OSStatus).
    public func ask(
        _ request: PromptRequest, attempts: Int = Prompter.attempts,
        check: (SecretBytes) throws(KeychainError) -> String?
    ) throws(PromptFailure) {
        let (pinentry, program) = try start(request)
        do throws(AssuanError) {
            try pinentry.transact(Array("SETPROMPT".utf8) + [0x20] + Self.escape(request.prompt))
        } catch {
            throw failure(error, program)
        }
        var reason: String?
        for attempt in 1...max(1, attempts) {
            if let reason {
                do throws(AssuanError) {
                    try pinentry.transact(
                        Array("SETERROR".utf8) + [0x20] + Self.escape("\(reason) (try \(attempt) of \(attempts))"))
                } catch {
                    throw failure(error, program)
                }
            }
            var pin = SecretBytes(capacity: 256)
            do throws(AssuanError) {
                try pinentry.transact(Array("GETPIN".utf8)) { chunk in pin.append(contentsOf: chunk) }
            } catch {
                pin.removeAll()
                throw failure(error, program)
            }
            do throws(KeychainError) { reason = try check(pin) } catch {
                pin.removeAll()
                throw .failed(error)
            }
            pin.removeAll()
            if reason == nil {
                try? pinentry.transact(Array("BYE".utf8))
                return
            }
        }
        try? pinentry.transact(Array("BYE".utf8))
        throw .wrongPassphrase("\(reason ?? "wrong passphrase") (\(attempts) attempts)")
    }

    /// Asks the person a yes/no question (pinentry's `CONFIRM`): returns when they answer yes (the
    /// `okLabel` button); `.canceled` when they say no or close it, `.timedOut` when nobody answers.
    public func confirm(_ request: PromptRequest, okLabel: String, cancelLabel: String) throws(PromptFailure) {
        let (pinentry, program) = try start(request)
        do throws(AssuanError) {
            try pinentry.transact(Array("SETOK".utf8) + [0x20] + Self.escape(okLabel))
            try pinentry.transact(Array("SETCANCEL".utf8) + [0x20] + Self.escape(cancelLabel))
            try pinentry.transact(Array("CONFIRM".utf8))
        } catch {
            try? pinentry.transact(Array("BYE".utf8))
            throw failure(error, program)
        }
        try? pinentry.transact(Array("BYE".utf8))
    }

    /// Starts pinentry for `request`: its display or terminal, title, description and timeout set.
    private func start(_ request: PromptRequest) throws(PromptFailure) -> (AssuanPipe, String) {
        if let why = unavailable(request) { throw .unavailable(why) }
        let program = self.program!
        let pinentry: AssuanPipe
        do throws(AssuanError) {
            pinentry = try AssuanPipe(program: program, arguments: [program])
        } catch {
            throw .unavailable("cannot start \(program): \(error)")
        }
        func send(_ command: String, _ argument: String? = nil, optional: Bool = false) throws(PromptFailure) {
            var line = Array(command.utf8)
            if let argument { line += [0x20] + Self.escape(argument) }
            do throws(AssuanError) { try pinentry.transact(line) } catch {
                if optional { return }
                throw failure(error, program)
            }
        }
        if let display { try send("OPTION", "display=\(display)", optional: true) }
        if let tty = request.ttyName {
            try send("OPTION", "ttyname=\(tty)", optional: true)
            try send("OPTION", "ttytype=\(request.ttyType ?? "dumb")", optional: true)
        }
        if let lcCtype = CurrentProcess.environment("LC_ALL") ?? CurrentProcess.environment("LC_CTYPE")
            ?? CurrentProcess.environment("LANG")
        {
            try send("OPTION", "lc-ctype=\(lcCtype)", optional: true)
        }
        if let parent = request.parentWindow, !parent.isEmpty {
            try send("OPTION", "parent-wid=\(parent)", optional: true)
        }
        try send("SETTITLE", request.title)
        try send("SETDESC", request.description)
        if timeoutSeconds > 0 { try send("SETTIMEOUT", String(timeoutSeconds)) }
        return (pinentry, program)
    }

    private func failure(_ error: AssuanError, _ program: String) -> PromptFailure {
        if error.isCanceled { return .canceled }
        if error.isTimeout { return .timedOut(seconds: timeoutSeconds) }
        return .unavailable("\(program) failed: \(error)")
    }

    /// Assuan's escaping of a text argument: `%`, CR, LF and other control bytes as `%XX`; cut to
    /// what fits on one Assuan line (1000 bytes with the command).
    static func escape(_ text: String) -> [UInt8] {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        for b in text.utf8 {
            if out.count > 900 && b & 0xC0 != 0x80 { break }
            if b == 0x25 || b < 0x20 || b == 0x7F {
                out += [0x25, hex[Int(b >> 4)], hex[Int(b & 15)]]
            } else {
                out.append(b)
            }
        }
        return out
    }
}
