import KeychainSystem

/// Command-line flags of `keychaind`.
public struct Options: Sendable {
    /// `--socket PATH`: the socket to serve, overriding the configuration file.
    public var socketPath: String?
    /// `--data-dir DIR`: the directory of the database and key files.
    public var dataDirectory: String?
    /// `--config FILE`: the settings file to read instead of the default.
    public var configFile: String?
    /// `--log-level LEVEL`, as typed; checked when the settings are resolved (`Settings.logLevel`).
    public var logLevel: String?
    /// Replaces the default system registration directories (repeatable).
    public var systemAppsDirectories: [String] = []
    /// `--check-config`: validate the configuration and apps.d, print the apps, and exit.
    public var checkConfig = false
    /// `--accept-database`: trust the database's rows as they are now, and exit.
    public var acceptDatabase = false
    /// Serve the Secret Service on the session bus too (or `"secretService": true`).
    public var secretService = false
    /// Take org.freedesktop.secrets from the provider that holds it, if it allows that.
    public var replaceBusName = false

    /// The text `keychaind --help` prints: flags, settings, apps and signals.
    public static let help = """
        keychaind — Apple's Keychain Services for Linux: the per-user daemon that owns the encrypted item
        database and serves SecItemAdd / CopyMatching / Update / Delete on a Unix socket.

        Usage: keychaind [--socket PATH] [--data-dir DIR] [--config FILE] [--log-level LEVEL]
                         [--system-apps-dir DIR]… [--secret-service [--replace]]
                         [--check-config | --accept-database]

          --socket PATH      socket to serve (default $XDG_RUNTIME_DIR/keychaind/keychaind.sock; directory
                             0700, socket 0600). Ignored when systemd passes a socket (LISTEN_FDS).
          --data-dir DIR     database and key files (default $XDG_DATA_HOME/keychaind, i.e.
                             ~/.local/share/keychaind; directory 0700, files 0600)
          --config FILE      settings (default $XDG_CONFIG_HOME/keychaind/keychaind.json); registered apps are
                             read from apps.d/*.json beside it, again whenever a file there changes, and
                             on SIGHUP. An empty file, or no file at the default path, means defaults; a
                             file named with --config must exist.
          --log-level LEVEL  error, warning, notice, info (default) or debug; logs go to stderr with
                             journald priority prefixes and never contain secrets or attribute values
          --system-apps-dir DIR
                             read root-owned registrations from DIR instead of /etc/keychaind/apps.d and
                             /usr/share/keychaind/apps.d (repeatable; first wins). A file there counts only
                             when it and every directory above it belong to root and others cannot write them
          --secret-service   also serve the freedesktop Secret Service (org.freedesktop.secrets) on the
                             session bus of $DBUS_SESSION_BUS_ADDRESS, so secret-tool, libsecret, Python
                             secretstorage/keyring and the apps built on them use keychaind; each caller
                             is identified and kept to its own groups as on the socket (see
                             secretServiceUnregistered). Refuses to start while another provider holds the
                             name, saying which
          --replace          with --secret-service: take the name from the provider holding it; one that
                             does not allow replacement (gnome-keyring) is sent SIGTERM through a pidfd
          --check-config     validate the configuration and apps.d, print the apps, and exit
          --accept-database  trust the database's rows as they are now and exit. keychaind refuses to start
                             when rows were removed, added, swapped or restored from an older copy of
                             keychain.db (it keeps a sealed record of every row's version); if you did that
                             yourself, stop the daemon, run this once, then start it again
          --version          print the version and exit
          -h, --help         this text

        Settings in keychaind.json: socket, dataDirectory, maxFrameBytes (1048576), maxConnections (4096),
        idleTimeoutSeconds (900; 0 = never), autoLockSeconds (0 = never), maxUnlockedSeconds (0 = no bound),
        kdfProfile (moderate|interactive), lookupCacheEntries (4096; 0 = off), maxBufferedBytes (67108864),
        logLevel, secretService (false), syncFolder (none: no sync; docs/sync.md),
        secretServiceUnregistered (shared: processes that are not registered apps share one collection, the
        access group secret-service, as on every desktop today; refuse: only registered apps are served),
        secretServiceForeignItems (refuse; confirm: a registered app's bus search also lists other apps' items,
        locked; once the person allows one in a yes/no dialog, that connection may read it until the keychain locks),
        lockWithSession (\(Settings.lockWithSessionDefault) in this build; true in the Debian package: lock when
        logind says a session of the user locked, and before the machine sleeps).

        Apps: registrations in the system directories count when root-owned; those in apps.d beside the
        config file count as they are while no passphrase is set, and afterwards only when approved with
        it (keychainctl approve / register). See keychainctl status for what counts now.

        Signals: SIGTERM/SIGINT stop accepting, finish in-flight requests and exit 0; SIGHUP re-reads apps.d.
        With NOTIFY_SOCKET set it sends READY=1, STATUS=… and STOPPING=1 (systemd Type=notify).
        """

    /// What the command line asks for: run with these options, print help, or print the version.
    public enum Parsed: Sendable {
        case run(Options)
        case help
        case version
    }

    /// Parses `args` (without the program name); throws `OptionError` on an unknown flag or a missing value.
    public static func parse(_ args: [String]) throws(OptionError) -> Parsed {
        var o = Options()
        var i = 0
        func value(_ flag: String) throws(OptionError) -> String {
            i += 1
            guard i < args.count, !args[i].isEmpty else { throw OptionError("\(flag) needs a value") }
            return args[i]
        }
        while i < args.count {
            let a = args[i]
            var flag = a
            var inline: String?
            if a.hasPrefix("--"), let eq = a.firstIndex(of: "=") {
                flag = String(a[..<eq])
                inline = String(a[a.index(after: eq)...])
            }
            func next() throws(OptionError) -> String {
                if let inline { return inline }
                return try value(flag)
            }
            switch flag {
            case "--socket": o.socketPath = try next()
            case "--data-dir": o.dataDirectory = try next()
            case "--config": o.configFile = try next()
            case "--log-level": o.logLevel = try next()
            case "--system-apps-dir": o.systemAppsDirectories.append(try next())
            case "--check-config": o.checkConfig = true
            case "--accept-database": o.acceptDatabase = true
            case "--secret-service": o.secretService = true
            case "--replace": o.replaceBusName = true
            case "-h", "--help": return .help
            case "--version": return .version
            default: throw OptionError("unknown argument \(a) (see keychaind --help)")
            }
            i += 1
        }
        if o.replaceBusName && !o.secretService { throw OptionError("--replace goes with --secret-service") }
        if o.checkConfig && o.acceptDatabase {
            throw OptionError("--check-config and --accept-database are two separate runs: give one of them")
        }
        return .run(o)
    }
}

/// A command-line mistake, with one line saying what is wrong and where to look.
public struct OptionError: Error, CustomStringConvertible {
    /// The message printed before exiting, such as "--socket needs a value".
    public let description: String
    init(_ d: String) { description = d }
}
