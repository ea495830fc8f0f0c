import KeychainClient
import KeychainCore

/// The verbs of keychainctl (man/keychainctl.1.scd), with the options each accepts and its help text.
enum Verb: String, CaseIterable {
    case add, find, update, delete, list
    case deviceID = "device-id"
    case status, lock, unlock, passwd, backup, restore
    case apps, register, approve, unregister, help
    case sync
    case addInternetPassword = "add-internet-password"
    case findInternetPassword = "find-internet-password"
    case deleteInternetPassword = "delete-internet-password"

    /// The item class the verb reads and writes (KeychainCore/ItemClass.swift).
    var itemClass: ItemClass {
        switch self {
        case .addInternetPassword, .findInternetPassword, .deleteInternetPassword: return .internetPassword
        default: return .genericPassword
        }
    }

    /// The options that name an internet password (macOS `security`'s flags).
    private static let internetFilters: Set<Opt> = [
        .account, .server, .protocolCode, .port, .path, .securityDomain, .authenticationType, .group, .synchronizable,
    ]

    var options: Set<Opt> {
        switch self {
        case .add:
            return [
                .service, .account, .group, .secret, .stdin, .accessible, .label, .comment, .description,
                .updateExisting, .synchronizable, .keychainPassphraseFile,
            ]
        case .find: return [.service, .account, .group, .synchronizable, .printSecret, .all, .keychainPassphraseFile]
        case .update:
            return [
                .service, .account, .group, .synchronizable, .secret, .stdin, .accessible, .label, .comment,
                .description, .keychainPassphraseFile,
            ]
        case .delete: return [.service, .account, .group, .synchronizable, .all, .keychainPassphraseFile]
        case .list, .deviceID: return [.group]
        case .status, .lock, .apps, .help: return []
        case .unlock: return [.passphraseFile, .passphraseFD, .ifLocked, .pinentry]
        case .backup, .restore: return [.passphraseFile, .passphraseFD, .keychainPassphraseFile]
        case .passwd:
            return [
                .passphraseFile, .passphraseFD, .newPassphraseFile, .newPassphraseFD, .ifSet, .approveRegistration,
                .approveNone,
            ]
        case .register: return [.appID, .group, .executable, .admin, .keychainPassphraseFile]
        case .approve, .unregister: return [.keychainPassphraseFile]
        case .addInternetPassword:
            return Self.internetFilters.union([
                .secret, .stdin, .accessible, .label, .comment, .description, .updateExisting, .keychainPassphraseFile,
            ])
        case .findInternetPassword:
            return Self.internetFilters.union([.showPassword, .printSecret, .all, .keychainPassphraseFile])
        case .deleteInternetPassword: return Self.internetFilters.union([.all, .keychainPassphraseFile])
        case .sync: return [.keychainPassphraseFile]
        }
    }

    /// Options that may be given more than once (their values are kept in order).
    var repeatable: Set<Opt> {
        switch self {
        case .register: return [.group, .executable]
        case .passwd: return [.approveRegistration]
        default: return []
        }
    }

    /// How many positional arguments the verb takes (and their names for messages); "[X]" is optional.
    var positionals: [String] {
        switch self {
        case .backup, .restore: return ["FILE"]
        case .approve: return ["NAME"]
        case .unregister: return ["APPLICATION-ID"]
        case .register: return ["[NAME]"]
        case .help: return ["[VERB]"]
        case .sync: return ["ACTION", "[CODE]"]
        default: return []
        }
    }

    var usage: String {
        switch self {
        case .add:
            return
                "keychainctl add -s SERVICE -a ACCOUNT [-g GROUP] [-w SECRET | --stdin] [--accessible CLASS] [-l LABEL] [-j COMMENT] [-D DESCRIPTION] [-U] [--synchronizable]"
        case .find: return "keychainctl find [-s SERVICE] [-a ACCOUNT] [-g GROUP] [--synchronizable] [-w] [--all]"
        case .update:
            return
                "keychainctl update -s SERVICE -a ACCOUNT [-g GROUP] [--synchronizable] [-w NEW_SECRET | --stdin] [--accessible CLASS] [-l LABEL] [-j COMMENT] [-D DESCRIPTION]"
        case .delete: return "keychainctl delete [-s SERVICE] [-a ACCOUNT] [-g GROUP] [--synchronizable] [--all]"
        case .list: return "keychainctl list [-g GROUP]"
        case .deviceID: return "keychainctl device-id [-g GROUP]"
        case .status: return "keychainctl status"
        case .lock: return "keychainctl lock"
        case .unlock:
            return "keychainctl unlock [--passphrase-file FILE | --passphrase-fd N | --pinentry] [--if-locked]"
        case .passwd:
            return
                "keychainctl passwd [--passphrase-file OLD_FILE | --passphrase-fd N] [--new-passphrase-file NEW_FILE | --new-passphrase-fd N] [--if-set] [--approve NAME]… [--approve-none]"
        case .backup:
            return
                "keychainctl backup FILE [--passphrase-file FILE | --passphrase-fd N] [--keychain-passphrase-file FILE]"
        case .restore:
            return
                "keychainctl restore FILE [--passphrase-file FILE | --passphrase-fd N] [--keychain-passphrase-file FILE]"
        case .apps: return "keychainctl apps"
        case .register:
            return
                "keychainctl register -i APPLICATION-ID -g GROUP [-g GROUP]… -e EXECUTABLE [-e EXECUTABLE]… [--admin] [NAME]"
        case .approve: return "keychainctl approve NAME [--keychain-passphrase-file FILE]"
        case .unregister: return "keychainctl unregister APPLICATION-ID [--keychain-passphrase-file FILE]"
        case .help: return "keychainctl help [VERB]"
        case .addInternetPassword:
            return
                "keychainctl add-internet-password -a ACCOUNT -s SERVER [-r PROTOCOL] [-P PORT] [-p PATH] [-d DOMAIN] [-t AUTHTYPE] [--group GROUP] [-w PASSWORD | --stdin] [--accessible CLASS] [-l LABEL] [-j COMMENT] [-D DESCRIPTION] [-U] [--synchronizable]"
        case .findInternetPassword:
            return
                "keychainctl find-internet-password [-a ACCOUNT] [-s SERVER] [-r PROTOCOL] [-P PORT] [-p PATH] [-d DOMAIN] [-t AUTHTYPE] [--group GROUP] [--synchronizable] [-g | -w] [--all]"
        case .deleteInternetPassword:
            return
                "keychainctl delete-internet-password [-a ACCOUNT] [-s SERVER] [-r PROTOCOL] [-P PORT] [-p PATH] [-d DOMAIN] [-t AUTHTYPE] [--group GROUP] [--synchronizable] [--all]"
        case .sync: return SyncVerb.usage
        }
    }

    var summary: String {
        switch self {
        case .add: return "add a generic password"
        case .find: return "show an item's attributes, or with -w only its secret"
        case .update: return "change an item's secret or attributes"
        case .delete: return "delete an item (or, with --all, every matching item)"
        case .list: return "list generic passwords (service, account, group, accessibility, modification time)"
        case .deviceID: return "print the device UUID of an access group, creating it on first use"
        case .status: return "show the daemon's state (locked, passphrase, items, classes available)"
        case .lock: return "lock the keychain (drop the class keys)"
        case .unlock: return "unlock the keychain with the passphrase"
        case .passwd: return "set or change the keychain passphrase"
        case .backup: return "write an encrypted backup of the items to FILE"
        case .restore: return "restore the items of a backup FILE"
        case .apps: return "list the registered apps and whether each one counts"
        case .register: return "register an app in your apps.d (and approve it)"
        case .approve: return "approve a registration file in your apps.d with the passphrase"
        case .unregister: return "remove an app's registration and its approval"
        case .help: return "show help for keychainctl or a verb"
        case .addInternetPassword: return "add an internet password (kSecClassInternetPassword)"
        case .findInternetPassword:
            return "show an internet password's attributes, with -g its password, with -w only it"
        case .deleteInternetPassword: return "delete an internet password (or, with --all, every matching one)"
        case .sync: return SyncVerb.summary
        }
    }

    var details: String {
        switch self {
        case .add:
            return """
                The secret comes from -w SECRET, --stdin (all of standard input, one trailing newline dropped),
                or is asked for on the terminal without echo. Without -g the item goes to keychainctl's default
                access group. -U updates the item (secret and given attributes) when it already exists, as
                macOS `security add-generic-password -U`. CLASS is one of ak (when unlocked, the default),
                ck (after first unlock), dk (always), akpu, aku, cku, dku (this device only).
                """
        case .find:
            return """
                Without -w prints the first matching item's attributes; with -w prints only its secret and a
                newline. --all prints every match. Matching is exact; no filter matches any item. Exit 44 when
                nothing matches. An admin reading secrets of another app's group needs the keychain passphrase
                while one is set: it is asked for (or read from --keychain-passphrase-file).
                """
        case .update:
            return """
                Updates every item matching SERVICE and ACCOUNT (and GROUP). The new secret comes from -w,
                --stdin, or the terminal when no attribute option is given.
                """
        case .delete:
            return """
                Without --all, deletes the one matching item and fails (errSecParam) when several match;
                with --all, deletes every matching item (with no filter: every item keychainctl can see).
                """
        case .list:
            return
                "Lists every generic password (synchronizable ones too), or those of GROUP, sorted by group, service and account; `find-internet-password --all` lists internet passwords."
        case .deviceID: return "Every app of the group gets the same UUID, also when many start at once."
        case .status: return "Also says plainly when no passphrase is set (keys protected by the device key only)."
        case .lock: return "WhenUnlocked items become unreadable (errSecInteractionNotAllowed) until `unlock`."
        case .unlock:
            return """
                The passphrase is read from the terminal without echo, from --passphrase-file, or from the
                first line of descriptor N (--passphrase-fd), never from the command line. Without a terminal
                (and with nothing piped in), or with --pinentry, pinentry asks: keychaind's pinentryProgram,
                else pinentry on PATH, on $DISPLAY / $WAYLAND_DISPLAY or this terminal. --if-locked does
                nothing (exit 0, without trying the passphrase) when the keychain is not locked, so a
                passphrase that may be wrong is not counted as a failed unlock (used by pam_keychaind).
                """
        case .passwd:
            return """
                Asks for the current passphrase (when one is set) and the new one twice, or reads them from
                --passphrase-file / --passphrase-fd and --new-passphrase-file / --new-passphrase-fd. When both
                descriptors are the same, its first line is the current passphrase and its second the new one.
                --if-set changes only a passphrase that is already set and does nothing (exit 0) when none
                is. Once a passphrase is set the daemon starts locked.

                Setting the first passphrase approves no registration of your apps.d by itself: until then
                any process of yours could write one. On a terminal each registration is shown in full
                (application-identifier, groups, executables, whether it is an admin) and approved only
                when you answer y; --approve NAME approves apps.d/NAME(.json) without asking (repeatable,
                showing what it approves), and --approve-none approves none. Without a terminal only the
                registrations named with --approve are approved. A file changed between being shown and
                the passphrase being set is refused and nothing is changed. Those not approved stop
                counting (approve them later with `keychainctl approve NAME`); if this keychainctl is an
                admin only through one of them, it is no longer one afterwards.
                """
        case .backup:
            return """
                The backup is encrypted under a passphrase (asked twice, or --passphrase-file / --passphrase-fd); FILE is written
                with mode 0600. ThisDeviceOnly items are not included. Needs an admin caller and, while a
                passphrase is set, the keychain passphrase (asked, or --keychain-passphrase-file).
                """
        case .restore:
            return """
                The passphrase is the one the backup was made with. Like backup, needs an admin caller and,
                while a passphrase is set, the keychain passphrase (asked, or --keychain-passphrase-file).
                """
        case .apps:
            return """
                Every registration keychaind read: the system ones (/etc/keychaind/apps.d,
                /usr/share/keychaind/apps.d: root-owned, from packages or the administrator), yours (apps.d
                beside keychaind.json) and the built-in keychainctl, with whether each counts and why not.
                Your registrations count as they are while no passphrase is set; afterwards only those made
                or approved with it (register, approve), and only from the first unlock after keychaind started.
                """
        case .register:
            return """
                Writes NAME.json (default: the APPLICATION-ID) into your apps.d with the given access groups
                (the first is where adds without a group go) and executables (absolute paths of files you
                cannot modify: install them root-owned, e.g. under /usr/local/bin), then approves it, which
                needs an admin caller and, while a passphrase is set, the keychain passphrase. Without a
                passphrase no approval is needed: keychaind reads the file as soon as it is written, and
                this says whether it counts. --admin makes the app an administrator (every group; secrets
                of other groups need the passphrase).
                """
        case .approve:
            return """
                Approves apps.d/NAME(.json) as it is now, so it counts while a passphrase is set. Needs an
                admin caller and the keychain passphrase. Prints what the file says (groups, executables,
                whether it is an admin) before asking for the passphrase, and approves exactly that: a file
                changed in between is refused, not approved. Changing the file afterwards makes it stop
                counting until it is approved again.
                """
        case .unregister:
            return
                "Revokes the approval of APPLICATION-ID (admin, keychain passphrase) and deletes the files in your apps.d that register it."
        case .help: return ""
        case .addInternetPassword:
            return """
                The flags are macOS `security add-internet-password`'s. PROTOCOL is Apple's four-letter code
                (htps, http, ftp, ssh, imap, …; a shorter one is padded with spaces, as Apple's "ftp ") or its
                name (https); AUTHTYPE likewise (form, dflt, http, httd, ntlm, msna, dpaa, rpaa; or htmlform,
                default, httpbasic, …). The item is unique by account, server, protocol, authentication type,
                port, path, security domain, access group and synchronizable value: the same server and
                account on another port or protocol is another item. The password comes from -w, --stdin or
                the terminal. -U updates the item when it already exists.
                """
        case .findInternetPassword:
            return """
                The flags are macOS `security find-internet-password`'s: without -g or -w prints the first
                matching item's attributes; -g prints them and then the password; -w prints only the
                password and a newline. --all prints every match. Exit 44 when nothing matches.
                """
        case .deleteInternetPassword:
            return """
                Without --all, deletes the one matching internet password and fails (errSecParam) when
                several match; with --all, deletes every match.
                """
        case .sync: return SyncVerb.details
        }
    }

    var helpText: String {
        var s = "usage: \(usage)\n\n\(summary.prefix(1).uppercased() + summary.dropFirst()).\n"
        if !details.isEmpty { s += "\n" + details + "\n" }
        let opts = Opt.allCases.filter { options.contains($0) }
        if !opts.isEmpty || self != .help {
            s += "\noptions:\n"
            for o in opts { s += "  " + o.helpLine(for: self) + "\n" }
            s += "  " + pad("--json") + "machine-readable output (secrets base64 under \"v_Data\")\n"
            s +=
                "  " + pad("--socket PATH")
                + "the daemon's socket (default: $KEYCHAIND_SOCKET, else $XDG_RUNTIME_DIR/keychaind/keychaind.sock)\n"
            s += "  " + pad("-h, --help") + "this help\n"
        }
        return s
    }
}

func pad(_ s: String) -> String { s + String(repeating: " ", count: max(1, 30 - s.count)) }

enum Opt: CaseIterable {
    // `-g` is find-internet-password's "show the password" (as macOS security), everywhere else the
    // group: `showPassword` comes first, so a verb that takes both reads `-g` as it.
    case showPassword
    case server, protocolCode, port, path, securityDomain, authenticationType
    case service, account, group, secret, printSecret, stdin, accessible, label, comment, description
    case updateExisting, synchronizable, all, passphraseFile, newPassphraseFile, passphraseFD, newPassphraseFD,
        ifLocked, ifSet,
        pinentry
    case keychainPassphraseFile, appID, executable, admin, approveRegistration, approveNone

    var spellings: [String] {
        switch self {
        case .showPassword: return ["-g", "--show-password"]
        case .server: return ["-s", "--server"]
        case .protocolCode: return ["-r", "--protocol"]
        case .port: return ["-P", "--port"]
        case .path: return ["-p", "--path"]
        case .securityDomain: return ["-d", "--security-domain"]
        case .authenticationType: return ["-t", "--auth-type"]
        case .service: return ["-s", "--service"]
        case .account: return ["-a", "--account"]
        case .group: return ["-g", "--group", "--access-group"]
        case .secret, .printSecret: return ["-w", "--secret"]
        case .stdin: return ["--stdin"]
        case .accessible: return ["--accessible"]
        case .label: return ["-l", "--label"]
        case .comment: return ["-j", "--comment"]
        case .description: return ["-D", "--description"]
        case .updateExisting: return ["-U", "--update-existing"]
        case .synchronizable: return ["--synchronizable"]
        case .all: return ["--all"]
        case .passphraseFile: return ["--passphrase-file"]
        case .newPassphraseFile: return ["--new-passphrase-file"]
        case .passphraseFD: return ["--passphrase-fd"]
        case .newPassphraseFD: return ["--new-passphrase-fd"]
        case .ifLocked: return ["--if-locked"]
        case .pinentry: return ["--pinentry"]
        case .ifSet: return ["--if-set"]
        case .keychainPassphraseFile: return ["--keychain-passphrase-file"]
        case .appID: return ["-i", "--id"]
        case .executable: return ["-e", "--executable"]
        case .admin: return ["--admin"]
        case .approveRegistration: return ["--approve"]
        case .approveNone: return ["--approve-none"]
        }
    }

    var takesValue: Bool {
        switch self {
        case .showPassword, .printSecret, .stdin, .updateExisting, .synchronizable, .all, .ifLocked, .ifSet, .admin,
            .approveNone,
            .pinentry:
            return false
        default: return true
        }
    }

    func helpLine(for verb: Verb) -> String {
        var names = spellings.prefix(2).joined(separator: ", ")
        // Where `-g` shows the password, the group is --group alone.
        if self == .group && verb.options.contains(.showPassword) { names = "--group" }
        switch self {
        case .showPassword: return pad(names) + "print the attributes and then the password"
        case .server: return pad(names + " SERVER") + "the server (kSecAttrServer)"
        case .protocolCode: return pad(names + " PROTOCOL") + "the protocol: htps, http, ftp, ssh, … (kSecAttrProtocol)"
        case .port: return pad(names + " PORT") + "the port (kSecAttrPort)"
        case .path: return pad(names + " PATH") + "the path (kSecAttrPath)"
        case .securityDomain: return pad(names + " DOMAIN") + "the security domain (kSecAttrSecurityDomain)"
        case .authenticationType:
            return pad(names + " AUTHTYPE") + "form, dflt, http, … (kSecAttrAuthenticationType)"
        case .service: return pad(names + " SERVICE") + "the item's service (kSecAttrService)"
        case .account: return pad(names + " ACCOUNT") + "the item's account (kSecAttrAccount)"
        case .group:
            return pad(names + " GROUP")
                + (verb == .register
                    ? "an access group of the app (repeatable; the first is its default)"
                    : "the access group (kSecAttrAccessGroup)")
        case .secret:
            return pad(names + " SECRET")
                + (verb == .update
                    ? "the new secret" : "the secret (visible to other users in ps; prefer --stdin or the prompt)")
        case .printSecret:
            return pad(names)
                + (verb.itemClass == .internetPassword
                    ? "print only the password, followed by a newline" : "print only the secret, followed by a newline")
        case .stdin: return pad(names) + "read the secret from standard input"
        case .accessible: return pad(names + " CLASS") + "ak | ck | dk | akpu | aku | cku | dku (kSecAttrAccessible)"
        case .label: return pad(names + " LABEL") + "the item's label (kSecAttrLabel)"
        case .comment: return pad(names + " COMMENT") + "the item's comment (kSecAttrComment)"
        case .description: return pad(names + " DESCRIPTION") + "the item's description (kSecAttrDescription)"
        case .updateExisting: return pad(names) + "update the item if it already exists"
        case .synchronizable:
            return pad(names)
                + (verb == .add || verb == .addInternetPassword
                    ? "the item travels to your other devices (kSecAttrSynchronizable; needs syncFolder)"
                    : "match synchronizable items instead of local ones (kSecAttrSynchronizable)")
        case .all:
            return pad(names)
                + (verb == .find || verb == .findInternetPassword
                    ? "show every matching item" : "delete every matching item")
        case .passphraseFile:
            return pad(names + " FILE")
                + (verb == .passwd
                    ? "read the current passphrase from FILE" : "read the passphrase from FILE (first line)")
        case .newPassphraseFile: return pad(names + " FILE") + "read the new passphrase from FILE"
        case .passphraseFD:
            return pad(names + " N")
                + (verb == .passwd
                    ? "read the current passphrase from descriptor N (first line)"
                    : "read the passphrase from descriptor N (first line)")
        case .newPassphraseFD: return pad(names + " N") + "read the new passphrase from descriptor N (next line)"
        case .ifLocked: return pad(names) + "do nothing unless the keychain is locked"
        case .pinentry: return pad(names) + "ask through pinentry (on this terminal, or the desktop's dialog)"
        case .ifSet: return pad(names) + "change only a passphrase already set; never set a first one"
        case .keychainPassphraseFile:
            return pad(names + " FILE") + "the keychain passphrase (an admin proving presence) from FILE"
        case .appID: return pad(names + " ID") + "the app's application-identifier (TEAMID.bundle.id)"
        case .executable: return pad(names + " PATH") + "an absolute path of the app's executable (repeatable)"
        case .admin: return pad(names) + "make the app an administrator"
        case .approveRegistration:
            return pad(names + " NAME") + "setting the first passphrase: approve apps.d/NAME(.json) (repeatable)"
        case .approveNone: return pad(names) + "setting the first passphrase: approve no registration, ask nothing"
        }
    }
}

/// A parsed command line.
struct Invocation {
    var verb: Verb?
    var json = false
    var help = false
    var socket: String?
    var values: [Opt: String] = [:]
    /// Every value of a repeatable option, in order.
    var repeated: [Opt: [String]] = [:]
    var flags: Set<Opt> = []
    var positional: [String] = []
    /// `-w` given without a value (add/update at the end of the line): ask on the terminal.
    var promptForSecret = false

    func value(_ o: Opt) -> String? { values[o] }
    func has(_ o: Opt) -> Bool { flags.contains(o) }

    static let accessibilityClasses: Set<String> = ["ak", "ck", "dk", "akpu", "aku", "cku", "dku"]

    /// A `-r` value as Apple's wire code: the code itself, a shorter one padded with spaces (`ftp`
    /// is "ftp "), or the constant's name in any case (`https`); nil for none of these.
    static func protocolCode(_ given: String) -> String? { code(given, InternetProtocol.all) }

    /// A `-t` value as Apple's wire code, read as `protocolCode` reads `-r`.
    static func authenticationCode(_ given: String) -> String? { code(given, AuthenticationType.all) }

    private static func code(_ given: String, _ table: [(name: String, code: String)]) -> String? {
        let padded = given.count < 4 ? given + String(repeating: " ", count: 4 - given.count) : given
        if let hit = table.first(where: { $0.code == padded }) { return hit.code }
        return table.first(where: { $0.name.lowercased() == given.lowercased() })?.code
    }

    /// Parses `args` (without the program name). Usage errors are `errSecParam` with a one-line reason.
    static func parse(_ args: [String]) throws(KeychainError) -> Invocation {
        var inv = Invocation()
        var i = 0
        var optionsEnded = false
        func usageError(_ msg: String) -> KeychainError {
            let hint = inv.verb.map { "keychainctl \($0.rawValue) --help" } ?? "keychainctl --help"
            return .param("\(msg) (see \(hint))")
        }
        while i < args.count {
            let arg = args[i]
            i += 1
            if optionsEnded || !arg.hasPrefix("-") || arg == "-" {
                if inv.verb == nil {
                    guard let v = Verb(rawValue: arg) else { throw usageError("unknown verb \"\(arg)\"") }
                    inv.verb = v
                } else {
                    inv.positional.append(arg)
                }
                continue
            }
            if arg == "--" {
                optionsEnded = true
                continue
            }
            var name = arg
            var inlineValue: String?
            if arg.hasPrefix("--"), let eq = arg.firstIndex(of: "=") {
                name = String(arg[..<eq])
                inlineValue = String(arg[arg.index(after: eq)...])
            }
            switch name {
            case "--json":
                inv.json = true
                continue
            case "-h", "--help":
                inv.help = true
                continue
            case "--socket":
                if let v = inlineValue {
                    inv.socket = v
                } else if i < args.count {
                    inv.socket = args[i]
                    i += 1
                } else {
                    throw usageError("--socket needs a PATH")
                }
                continue
            default: break
            }
            guard let verb = inv.verb else { throw usageError("unknown option \(name) before the verb") }
            let candidates = Opt.allCases.filter { $0.spellings.contains(name) && verb.options.contains($0) }
            guard let opt = candidates.first else {
                if Opt.allCases.contains(where: { $0.spellings.contains(name) }) {
                    // The keychain passphrase of admin verbs has its own flag: say so.
                    let hint =
                        Opt.passphraseFile.spellings.contains(name) && verb.options.contains(.keychainPassphraseFile)
                        ? "; the keychain passphrase is given with --keychain-passphrase-file" : ""
                    throw usageError("\(verb.rawValue) does not take \(name)\(hint)")
                }
                throw usageError("unknown option \(name)")
            }
            if opt.takesValue {
                if let v = inlineValue {
                    inv.values[opt] = v
                    inv.repeated[opt, default: []].append(v)
                } else if i < args.count {
                    inv.values[opt] = args[i]
                    inv.repeated[opt, default: []].append(args[i])
                    i += 1
                } else if opt == .secret {
                    inv.promptForSecret = true  // `-w` last, as macOS security: ask
                } else {
                    throw usageError("\(name) needs a value")
                }
            } else {
                if inlineValue != nil { throw usageError("\(name) takes no value") }
                inv.flags.insert(opt)
            }
        }
        if inv.help { return inv }
        guard let verb = inv.verb else { throw usageError("no verb given") }
        for (opt, values) in inv.repeated where values.count > 1 && !verb.repeatable.contains(opt) {
            throw usageError("\(opt.spellings[0]) may be given once")
        }
        let maxPositionals = verb.positionals.count
        let optional = verb.positionals.filter { $0.hasPrefix("[") }.count
        if verb == .help || verb == .register {
            if inv.positional.count > 1 { throw usageError("\(verb.rawValue) takes at most one argument") }
        } else if inv.positional.count < maxPositionals - optional || inv.positional.count > maxPositionals {
            if inv.positional.count > maxPositionals {
                // Not echoed: it is often a secret typed without its -w.
                let extra = inv.positional.count - maxPositionals
                throw usageError(
                    "\(verb.rawValue) takes \(maxPositionals == 0 ? "no" : String(maxPositionals)) argument\(maxPositionals == 1 ? "" : "s") besides options; \(extra) more given (not shown, in case it is a secret: a secret goes after -w, or on --stdin)"
                )
            }
            throw usageError("\(verb.rawValue) needs \(verb.positionals.joined(separator: " "))")
        }
        switch verb {
        case .add, .update:
            guard inv.value(.service) != nil, inv.value(.account) != nil else {
                throw usageError("\(verb.rawValue) needs -s SERVICE and -a ACCOUNT")
            }
            if inv.value(.secret) != nil && inv.has(.stdin) { throw usageError("-w and --stdin exclude each other") }
        case .addInternetPassword:
            guard inv.value(.server) != nil, inv.value(.account) != nil else {
                throw usageError("\(verb.rawValue) needs -a ACCOUNT and -s SERVER")
            }
            if inv.value(.secret) != nil && inv.has(.stdin) { throw usageError("-w and --stdin exclude each other") }
        case .findInternetPassword:
            if inv.has(.showPassword) && inv.has(.printSecret) { throw usageError("-g and -w exclude each other") }
        case .register:
            guard inv.value(.appID) != nil, inv.repeated[.group] != nil, inv.repeated[.executable] != nil else {
                throw usageError("register needs -i APPLICATION-ID, -g GROUP and -e EXECUTABLE")
            }
            for exe in inv.repeated[.executable] ?? [] where !exe.hasPrefix("/") {
                throw usageError("executable \(exe) must be an absolute path")
            }
        default: break
        }
        if inv.repeated[.approveRegistration] != nil && inv.has(.approveNone) {
            throw usageError("--approve and --approve-none exclude each other")
        }
        if inv.value(.passphraseFile) != nil && inv.value(.passphraseFD) != nil {
            throw usageError("--passphrase-file and --passphrase-fd exclude each other")
        }
        if inv.value(.newPassphraseFile) != nil && inv.value(.newPassphraseFD) != nil {
            throw usageError("--new-passphrase-file and --new-passphrase-fd exclude each other")
        }
        for o in [Opt.passphraseFD, .newPassphraseFD] {
            if let v = inv.value(o), Int32(v).map({ $0 < 0 }) ?? true {
                throw usageError("\(o.spellings[0]) needs a descriptor number, not \"\(v)\"")
            }
        }
        if let v = inv.value(.protocolCode), Self.protocolCode(v) == nil {
            throw usageError(
                "-r must be a protocol such as htps, http, ftp, ssh (Apple's four-letter codes), not \"\(v)\"")
        }
        if let v = inv.value(.authenticationType), Self.authenticationCode(v) == nil {
            throw usageError("-t must be an authentication type: form, dflt, http, httd, ntlm, msna, dpaa, rpaa")
        }
        if let v = inv.value(.port), UInt16(v) == nil {
            throw usageError("-P must be a port number (0…65535), not \"\(v)\"")
        }
        if let c = inv.value(.accessible), !accessibilityClasses.contains(c) {
            throw usageError("--accessible must be one of ak, ck, dk, akpu, aku, cku, dku, not \"\(c)\"")
        }
        return inv
    }
}

let toolHelp: String = {
    var s = """
        usage: keychainctl [--json] [--socket PATH] VERB [options]

        Manage generic and internet passwords in keychaind, the Keychain Services daemon.

        verbs:

        """
    for v in Verb.allCases {
        s += "  " + v.rawValue + String(repeating: " ", count: max(1, 26 - v.rawValue.count)) + v.summary + "\n"
    }
    s += """

        `keychainctl VERB --help` shows a verb's options. --json on any verb prints JSON on stdout.
        Exit status: 0 success, otherwise the low byte of the OSStatus (44 item not found, 45 duplicate
        item, 206 errSecParam, 30 errSecMissingEntitlement, 36 locked, 53 no daemon, …); errors go to
        stderr as one line.

        """
    return s
}()
