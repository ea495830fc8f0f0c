import Foundation
import KeychainCore
public import KeychainCrypto
public import KeychainItems
public import KeychainRequests
import KeychainStore
import KeychainSystem

/// Daemon settings: defaults, overridden by `keychaind.json`, overridden by command-line flags.
/// Read and validated once at start; `apps` again on SIGHUP.
public struct Settings: Sendable {
    /// The Unix socket the daemon serves (`--socket`, `socket`); unused when systemd passes one.
    public var socketPath: String
    /// The directory of the database and key files (`--data-dir`, `dataDirectory`).
    public var dataDirectory: String
    /// The `keychaind.json` in use; `apps.d/` is read from beside it.
    public var configFile: String
    /// The largest request frame accepted, in bytes (1 MiB by default).
    public var maxFrameBytes = 1 << 20
    /// The most clients served at once (programs that are not registered apps: a quarter of it).
    public var maxConnections = 4096
    /// Seconds a connection may stay silent before the daemon closes it (0 = never).
    public var idleTimeoutSeconds = 900
    /// Seconds without a successful request of an identified app after which the daemon locks the
    /// keychain (0 = never).
    public var autoLockSeconds = 0
    /// Seconds after an unlock after which the daemon locks the keychain whatever the activity
    /// (0 = no bound, the default: the keychain stays open until locked, as GNOME Keyring's does).
    public var maxUnlockedSeconds = 0
    /// Argon2id costs for new passphrases and backups: `moderate` (default: 3 passes over 256 MiB,
    /// ≈0.35 s per unlock on the 2-core VM) or `interactive` (2 over 64 MiB, ≈65 ms; tests, small machines).
    public var kdfProfile: KDFProfile = .moderate
    /// Point lookups kept as sealed rows so warm copies skip SQLite (0 = off).
    public var lookupCacheEntries = 4096
    /// Bytes of partial frames held across all connections before new ones are refused (errSecAllocate).
    public var maxBufferedBytes = 64 << 20
    /// Root-owned directories of registrations (packages, the administrator), highest precedence first.
    public var systemAppsDirectories = AppRegistry.defaultSystemDirectories
    /// The least severe level logged to stderr (`--log-level`, `logLevel`); logs never carry secrets.
    public var logLevel: Log.Level = .info
    /// Also serve the freedesktop Secret Service on the session bus (`--secret-service`).
    public var secretService = false
    /// What processes that are not registered apps get on the bus: the shared collection or a refusal.
    public var secretServiceUnregistered: AccessPolicy.UnregisteredBusCallers = .shared
    /// What a registered app's bus search does with other groups' items: nothing (`refuse`), or lists
    /// them locked for a per-item confirmation (`confirm`; docs/secret-service.md).
    public var secretServiceForeignItems: AccessPolicy.ForeignBusItems = .refuse
    /// Lock the keychain when logind says one of the user's sessions locked, and before the machine
    /// sleeps (`lockWithSession`; SessionLock.swift in KeychainSecretService). Off in a build from
    /// source; the Debian package builds with `-DKEYCHAIND_LOCK_WITH_SESSION` (debian/rules), so on.
    public var lockWithSession = Settings.lockWithSessionDefault

    /// `lockWithSession` when keychaind.json does not say: the build's choice.
    public static var lockWithSessionDefault: Bool {
        #if KEYCHAIND_LOCK_WITH_SESSION
            return true
        #else
            return false
        #endif
    }

    /// The pinentry that asks for the passphrase (`pinentryProgram`): a path or a name on `PATH`;
    /// nil: `pinentry` on `PATH`, else `/usr/bin/pinentry`.
    public var pinentryProgram: String?
    /// Seconds a passphrase prompt waits for an answer (`pinentryTimeoutSeconds`; 0 = no limit).
    public var pinentryTimeoutSeconds = 120
    /// How reading an item whose access control says `.userPresence` is confirmed
    /// (`presenceConfirmation`): the keychain passphrase (the default), or a yes/no dialog
    /// (`.devicePasscode` always takes the passphrase).
    public var presenceConfirmation = PresenceConfirmation.passphrase
    /// Seconds a person's confirmation lets the same app read the same item again without asking
    /// (`presenceReuseSeconds`; 0 = ask on every read), like Apple's
    /// `LAContext.touchIDAuthenticationAllowableReuseDuration`.
    public var presenceReuseSeconds = 0
    /// The folder synchronizable items travel through (`syncFolder`, an absolute path kept in step
    /// across devices by Syncthing or the like; docs/sync.md); nil: no sync.
    public var syncFolder: String?

    /// The folder of app drop-ins: `apps.d/` beside the configuration file in use.
    public var appsDirectory: String {
        (configFile as NSString).deletingLastPathComponent + "/apps.d"
    }
}

/// A configuration problem: which file, and why. The daemon refuses to start on one.
public struct ConfigurationError: Error, CustomStringConvertible {
    /// The file with the problem.
    public let file: String
    /// One line saying what is wrong in it.
    public let reason: String
    /// `file: reason`, as the daemon prints it before refusing to start.
    public var description: String { "\(file): \(reason)" }
}

enum JSONFile {
    /// The largest settings or registration file read (a registration is a few hundred bytes): a
    /// larger one, which any process of the user can put in apps.d, is refused unread instead of
    /// being read whole into memory at every start and reload.
    static let maxBytes = 64 << 10

    /// The top-level object of a JSON file; an empty file counts as `{}`.
    static func object(at path: String) throws(ConfigurationError) -> [String: Any] {
        // Opening and closing the open keychain database (through a link in apps.d, say) would drop
        // SQLite's lock on it: refused before it is opened for reading. The file is pinned first
        // with a handle that reads nothing (closing it drops no lock) and the check and the read
        // are made on that very file, so a link swapped in between changes nothing.
        let handle: FileDescriptor
        let st: FileStatus
        do {
            handle = try FileDescriptor.open(path, .pathOnly)
            st = try handle.status()
        } catch {
            throw ConfigurationError(file: path, reason: "cannot be read (\(error.message))")
        }
        if ItemStore.isOpenDatabase(device: st.device, inode: st.inode) {
            throw ConfigurationError(file: path, reason: "is the keychain database, not a JSON file")
        }
        // A FIFO or a device would block the read, and with it every reload.
        guard st.kind == .regular else {
            throw ConfigurationError(file: path, reason: "is not a regular file")
        }
        let tooLarge = ConfigurationError(file: path, reason: "is larger than \(maxBytes >> 10) KiB")
        guard st.size <= maxBytes else { throw tooLarge }
        // At most one byte more than allowed is read, also when the file grows after the check.
        var buffer = [UInt8](repeating: 0, count: maxBytes + 1)
        let count: Int
        do {
            // The handle stays open until the file is: its number alone does not keep it so, and a
            // number closed early could be another thread's file (or the database) by then.
            let file = try withExtendedLifetime(handle) { () throws(Errno) in
                try FileDescriptor.open("/proc/self/fd/\(handle.rawValue)", .noControllingTerminal)
            }
            count = try withMutableBytes(&buffer) { (b) throws(Errno) in try file.readFully(into: b) }
        } catch {
            throw ConfigurationError(file: path, reason: "cannot be read (\(error.message))")
        }
        guard count <= maxBytes else { throw tooLarge }
        let data = Data(buffer[0..<count])
        if data.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) { return [:] }
        let parsed: Any
        do { parsed = try JSONSerialization.jsonObject(with: data) } catch {
            throw ConfigurationError(file: path, reason: "is not valid JSON")
        }
        guard let object = parsed as? [String: Any] else {
            throw ConfigurationError(file: path, reason: "must hold a JSON object")
        }
        return object
    }

    static func isBool(_ v: Any) -> Bool {
        guard let n = v as? NSNumber else { return false }
        return String(cString: n.objCType) == "c"
    }

    static func int(_ v: Any, key: String, file: String, range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
        guard let n = v as? NSNumber, !isBool(v), let i = Int(exactly: n.doubleValue), range.contains(i) else {
            throw ConfigurationError(
                file: file, reason: "\"\(key)\" must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return i
    }

    static func string(_ v: Any, key: String, file: String) throws(ConfigurationError) -> String {
        guard let s = v as? String, !s.isEmpty else {
            throw ConfigurationError(file: file, reason: "\"\(key)\" must be a non-empty string")
        }
        return s
    }

    static func strings(_ v: Any, key: String, file: String) throws(ConfigurationError) -> [String] {
        guard let a = v as? [Any], !a.isEmpty else {
            throw ConfigurationError(file: file, reason: "\"\(key)\" must be a non-empty array of strings")
        }
        var out: [String] = []
        for e in a {
            guard let s = e as? String, !s.isEmpty else {
                throw ConfigurationError(file: file, reason: "\"\(key)\" must be a non-empty array of strings")
            }
            out.append(s)
        }
        return out
    }
}

extension Settings {
    static let knownKeys = [
        "socket", "dataDirectory", "maxFrameBytes", "maxConnections",
        "idleTimeoutSeconds", "autoLockSeconds", "maxUnlockedSeconds", "kdfProfile", "lookupCacheEntries",
        "maxBufferedBytes", "logLevel",
        "secretService", "secretServiceUnregistered", "secretServiceForeignItems", "lockWithSession", "pinentryProgram",
        "pinentryTimeoutSeconds", "syncFolder", "presenceConfirmation", "presenceReuseSeconds",
    ]

    /// Applies `keychaind.json` when it exists. Unknown keys and wrong types are errors.
    mutating func apply(configFile path: String) throws(ConfigurationError) {
        guard FileSystem.exists(path) else { return }
        let object = try JSONFile.object(at: path)
        for (key, value) in object {
            switch key {
            case "socket": socketPath = try JSONFile.string(value, key: key, file: path)
            case "dataDirectory": dataDirectory = try JSONFile.string(value, key: key, file: path)
            case "maxFrameBytes":
                maxFrameBytes = try JSONFile.int(value, key: key, file: path, range: 1024...(64 << 20))
            case "maxConnections": maxConnections = try JSONFile.int(value, key: key, file: path, range: 1...65536)
            case "idleTimeoutSeconds":
                idleTimeoutSeconds = try JSONFile.int(value, key: key, file: path, range: 0...86400 * 7)
            case "autoLockSeconds":
                autoLockSeconds = try JSONFile.int(value, key: key, file: path, range: 0...86400 * 365)
            case "maxUnlockedSeconds":
                maxUnlockedSeconds = try JSONFile.int(value, key: key, file: path, range: 0...86400 * 365)
            case "lookupCacheEntries":
                lookupCacheEntries = try JSONFile.int(value, key: key, file: path, range: 0...1_000_000)
            case "maxBufferedBytes":
                maxBufferedBytes = try JSONFile.int(value, key: key, file: path, range: (1 << 20)...(1 << 30))
            case "kdfProfile":
                let name = try JSONFile.string(value, key: key, file: path)
                guard let profile = KDFProfile(rawValue: name) else {
                    throw ConfigurationError(file: path, reason: "\"kdfProfile\" must be interactive or moderate")
                }
                kdfProfile = profile
            case "logLevel":
                let name = try JSONFile.string(value, key: key, file: path)
                guard let level = Log.Level(name: name) else {
                    throw ConfigurationError(
                        file: path, reason: "\"logLevel\" must be error, warning, notice, info or debug")
                }
                logLevel = level
            case "secretService":
                guard JSONFile.isBool(value), let b = value as? Bool else {
                    throw ConfigurationError(file: path, reason: "\"secretService\" must be true or false")
                }
                secretService = b
            case "secretServiceUnregistered":
                let name = try JSONFile.string(value, key: key, file: path)
                guard let mode = AccessPolicy.UnregisteredBusCallers(rawValue: name) else {
                    throw ConfigurationError(
                        file: path, reason: "\"secretServiceUnregistered\" must be shared or refuse")
                }
                secretServiceUnregistered = mode
            case "secretServiceForeignItems":
                let name = try JSONFile.string(value, key: key, file: path)
                guard let mode = AccessPolicy.ForeignBusItems(rawValue: name) else {
                    throw ConfigurationError(
                        file: path, reason: "\"secretServiceForeignItems\" must be refuse or confirm")
                }
                secretServiceForeignItems = mode
            case "lockWithSession":
                guard JSONFile.isBool(value), let b = value as? Bool else {
                    throw ConfigurationError(file: path, reason: "\"lockWithSession\" must be true or false")
                }
                lockWithSession = b
            case "pinentryProgram":
                let program = try JSONFile.string(value, key: key, file: path)
                guard !program.isEmpty, !program.contains("/") || program.hasPrefix("/") else {
                    throw ConfigurationError(
                        file: path, reason: "\"pinentryProgram\" must be an absolute path or a program name on PATH")
                }
                pinentryProgram = program
            case "pinentryTimeoutSeconds":
                pinentryTimeoutSeconds = try JSONFile.int(value, key: key, file: path, range: 0...86400)
            case "presenceConfirmation":
                let name = try JSONFile.string(value, key: key, file: path)
                guard let mode = PresenceConfirmation(rawValue: name) else {
                    throw ConfigurationError(
                        file: path, reason: "\"presenceConfirmation\" must be passphrase or confirm")
                }
                presenceConfirmation = mode
            case "presenceReuseSeconds":
                presenceReuseSeconds = try JSONFile.int(value, key: key, file: path, range: 0...3600)
            case "syncFolder":
                let folder = try JSONFile.string(value, key: key, file: path)
                guard folder.hasPrefix("/") else {
                    throw ConfigurationError(file: path, reason: "\"syncFolder\" must be an absolute path")
                }
                syncFolder = folder
            default:
                throw ConfigurationError(
                    file: path, reason: "unknown key \"\(key)\" (known: \(Self.knownKeys.joined(separator: ", ")))")
            }
        }
    }
}

/// Reading the registration files (`apps.d/*.json`) into `AppEntry` values.
public enum AppFiles {
    static let knownKeys = [
        "application-identifier", "keychain-access-groups", "executables", "admin", "secretService",
        "flatpak-app-ids",
    ]

    /// Every `*.json` in `directory`, sorted by name; a missing directory means no apps.
    public static func load(directory: String) throws(ConfigurationError) -> [AppEntry] {
        let names: [String]
        do { names = try FileSystem.listDirectory(directory) } catch {
            if error.code == .noEntry { return [] }
            throw ConfigurationError(file: directory, reason: "cannot be listed (\(error.message))")
        }
        // Two files naming one executable are not an error here: the registry keeps the first that
        // counts and says why the other does not (AppRegistry.load).
        var apps: [AppEntry] = []
        for name in names.sorted() where name.hasSuffix(".json") {
            apps.append(try parse(file: directory + "/" + name))
        }
        return apps
    }

    static func parse(file: String) throws(ConfigurationError) -> AppEntry {
        let o = try JSONFile.object(at: file)
        for key in o.keys where !knownKeys.contains(key) {
            throw ConfigurationError(
                file: file, reason: "unknown key \"\(key)\" (known: \(knownKeys.joined(separator: ", ")))")
        }
        guard let id = o["application-identifier"] else {
            throw ConfigurationError(file: file, reason: "missing \"application-identifier\"")
        }
        let identifier = try JSONFile.string(id, key: "application-identifier", file: file)
        guard let g = o["keychain-access-groups"] else {
            throw ConfigurationError(file: file, reason: "missing \"keychain-access-groups\"")
        }
        let groups = try JSONFile.strings(g, key: "keychain-access-groups", file: file)
        var flatpakAppIDs: [String] = []
        if let f = o["flatpak-app-ids"] {
            flatpakAppIDs = try JSONFile.strings(f, key: "flatpak-app-ids", file: file)
            for id in flatpakAppIDs where !FlatpakInfo.isValidAppID(id) {
                throw ConfigurationError(
                    file: file, reason: "\(id) in \"flatpak-app-ids\" is not a Flatpak app ID (such as org.example.App)"
                )
            }
        }
        let exes: [String]
        if let e = o["executables"] {
            exes = try JSONFile.strings(e, key: "executables", file: file)
        } else if !flatpakAppIDs.isEmpty {
            exes = []
        } else {
            throw ConfigurationError(file: file, reason: "missing \"executables\" (or \"flatpak-app-ids\")")
        }
        for exe in exes where !exe.hasPrefix("/") {
            throw ConfigurationError(file: file, reason: "executable \(exe) must be an absolute path")
        }
        var admin = false
        if let a = o["admin"] {
            guard JSONFile.isBool(a), let b = a as? Bool else {
                throw ConfigurationError(file: file, reason: "\"admin\" must be true or false")
            }
            admin = b
        }
        var entry = AppEntry(
            applicationIdentifier: identifier, accessGroups: groups, executables: exes, admin: admin, file: file)
        if let b = o["secretService"] {
            guard JSONFile.isBool(b), let on = b as? Bool else {
                throw ConfigurationError(file: file, reason: "\"secretService\" must be true or false")
            }
            entry.secretService = on
        }
        entry.flatpakAppIDs = flatpakAppIDs
        return entry
    }
}
