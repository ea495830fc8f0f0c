import KeychainCore
import KeychainRequests
import KeychainSystem

/// How strongly apps are kept apart right now, in plain words (`status` → `isolation`, shown by
/// `keychainctl status`; docs/security.md §2).
enum Isolation {
    /// `level`: "none" (no passphrase: every process of the user can read device.key and the database)
    /// or "apps" (a passphrase protects the keys; apps are told apart by their executables).
    /// `notes`: one line per caveat in force. `registrations` (for identified callers): every
    /// registration with its source and whether it counts, and why not.
    static func report(
        registry: AppRegistry, passphraseSet: Bool, approvalsReadable: Bool, withRegistrations: Bool,
        userAppsDirectory: String, extraNotes: [String] = []
    ) -> Value {
        var notes: [String] = []
        if !passphraseSet {
            notes.append(
                "no passphrase is set: any process of this user can read device.key and the database, so apps are kept apart only from programs that ask keychaind; set one with `keychainctl passwd`"
            )
        } else if !approvalsReadable {
            notes.append(
                "apps registered in your apps.d count from the first unlock after keychaind started (their approvals are sealed under the passphrase); until then only system registrations and the bundled keychainctl are recognised"
            )
        }
        let untrusted = registry.untrusted
        let ignored = untrusted.filter { $0.untrusted != nil }.count
        let refused = untrusted.reduce(0) { $0 + $1.refusedExecutables.count }
        if ignored > 0 {
            notes.append(
                "\(ignored) registration\(ignored == 1 ? " does" : "s do") not count (not approved, or not root-owned where that is required)"
            )
        }
        if refused > 0 {
            notes.append(
                "\(refused) registered executable\(refused == 1 ? " is" : "s are") refused (the user can modify \(refused == 1 ? "it" : "them"), or another registration names \(refused == 1 ? "it" : "them") first)"
            )
        }
        let interpreters = registry.registrations.map { Self.interpreters(in: $0.entry.executables) }
        let naming = interpreters.filter { !$0.isEmpty }.count
        if naming > 0 {
            notes.append(
                "\(naming) registration\(naming == 1 ? " names an interpreter" : "s name interpreters") (python, perl, a shell, java, …): such a registration identifies every script that interpreter runs, so any process of this user can act as that app by running a script; register a program of its own instead (keychainctl apps shows which)"
            )
        }
        if let scope = ptraceScope(), scope == 0 {
            notes.append(
                "kernel.yama.ptrace_scope is 0: any process of this user can attach to a running app and read what it reads; set it to 2 (sysctl kernel.yama.ptrace_scope=2)"
            )
        } else if let scope = ptraceScope(), scope == 1 {
            notes.append(
                "kernel.yama.ptrace_scope is 1: a process of this user can start a registered app itself and, as its parent, attach to it and make it ask for the app's items; set it to 2 (sysctl kernel.yama.ptrace_scope=2: only root may attach)"
            )
        } else if ptraceScope() == nil {
            notes.append(
                "the kernel has no Yama ptrace restrictions: any process of this user can attach to a running app and read what it reads"
            )
        }
        if registry.registrations.contains(where: { $0.source == .builtIn }) {
            notes.append(
                "the bundled keychainctl (group keychainctl) can be run by any process of this user: what it stores is theirs too"
            )
        }
        notes += extraNotes
        var report: [String: Value] = [
            "level": .text(passphraseSet ? "apps" : "none"),
            "notes": .array(notes.map(Value.text)),
            "peerPinning": .text(PeerIdentity.pinning),
        ]
        if withRegistrations {
            report["userAppsDirectory"] = .text(userAppsDirectory)
            report["registrations"] = .array(
                zip(registry.registrations, interpreters).map { r, interpreters in
                    var m: [String: Value] = [
                        "file": .text(r.entry.file), "source": .text(r.source.rawValue),
                        "application-identifier": .text(r.entry.applicationIdentifier),
                        "admin": .bool(r.entry.admin), "trusted": .bool(r.untrusted == nil),
                    ]
                    if let why = r.untrusted { m["reason"] = .text(why) }
                    if !interpreters.isEmpty { m["interpreters"] = .array(interpreters.map(Value.text)) }
                    if !r.refusedExecutables.isEmpty {
                        m["refused"] = .map(r.refusedExecutables.mapValues(Value.text))
                    }
                    return .map(m)
                })
        }
        return .map(report)
    }

    /// The executables of a registration that are interpreters (judged by the name of the file each
    /// resolves to: /usr/bin/python3 → python3.11), each as "path" or "path (→ resolved)".
    static func interpreters(in executables: [String]) -> [String] {
        executables.compactMap { exe in
            let resolved = FileSystem.realPath(exe) ?? exe
            guard isInterpreter(String(resolved.split(separator: "/").last ?? "")) else { return nil }
            return resolved == exe ? exe : "\(exe) (→ \(resolved))"
        }
    }

    /// Program names that run scripts given to them (or typed in): the name, optionally followed by a
    /// version (python3, python3.11, perl5.36.0, lua5.4, tclsh8.6, php8.2, ruby3.1, pypy3).
    static let interpreterNames: Set<String> = [
        "python", "pypy", "perl", "ruby", "node", "nodejs", "deno", "bun", "bash", "sh", "dash", "zsh", "ksh",
        "mksh", "ash", "busybox", "fish", "csh", "tcsh", "rc", "java", "jshell", "php", "php-cgi", "lua", "luajit",
        "tclsh", "wish", "expect", "rscript", "r", "guile", "gawk", "awk", "mawk", "nawk", "sed", "osascript",
        "pwsh", "julia", "erl", "escript", "elixir", "racket", "sbcl", "ocaml", "swift", "gjs", "qjs", "irb",
        "scala", "kotlin", "groovy", "env", "gdb", "vim", "emacs",
    ]

    static func isInterpreter(_ basename: String) -> Bool {
        let name = basename.lowercased()
        if interpreterNames.contains(name) { return true }
        // A version after the name: digits, dots, dashes (python3.11, perl5.36.0, php8.2, lua5.4).
        var stem = Substring(name)
        while let last = stem.last, last.isNumber || last == "." || last == "-" { stem = stem.dropLast() }
        return stem.count < name.count && interpreterNames.contains(String(stem))
    }

    /// `kernel.yama.ptrace_scope`, or nil when the kernel has no Yama.
    static func ptraceScope() -> Int? {
        guard let bytes = FileSystem.contents(of: "/proc/sys/kernel/yama/ptrace_scope"), !bytes.isEmpty else {
            return nil
        }
        return Int(String(decoding: bytes, as: UTF8.self).filter(\.isNumber))
    }
}
