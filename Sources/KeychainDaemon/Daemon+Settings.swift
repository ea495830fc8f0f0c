import Foundation
import KeychainRequests
import KeychainSystem
import KeychainWire

/// Where the daemon's settings come from, and the keychainctl it bundles.
extension Daemon {
    /// Resolves settings from defaults, the config file and the flags, in that order.
    public static func settings(for options: Options, environment env: [String: String]) throws(ConfigurationError)
        -> Settings
    {
        let home = env["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? "/"
        let configHome = env["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.config"
        let dataHome = env["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.local/share"
        var s = Settings(
            socketPath: SocketLocation.resolve(environment: env.filter { $0.key == "XDG_RUNTIME_DIR" }),
            dataDirectory: dataHome + "/keychaind",
            configFile: options.configFile.map(Self.absolute) ?? configHome + "/keychaind/keychaind.json")
        if options.configFile != nil && !FileSystem.exists(s.configFile) {
            throw ConfigurationError(file: s.configFile, reason: "does not exist (given with --config)")
        }
        try s.apply(configFile: s.configFile)
        if let p = options.socketPath { s.socketPath = p }
        if let d = options.dataDirectory { s.dataDirectory = d }
        if !options.systemAppsDirectories.isEmpty {
            s.systemAppsDirectories = options.systemAppsDirectories.map(Self.absolute)
        }
        if options.secretService { s.secretService = true }
        if let l = options.logLevel {
            guard let level = Log.Level(name: l) else {
                throw ConfigurationError(file: "--log-level", reason: "must be error, warning, notice, info or debug")
            }
            s.logLevel = level
        }
        return s
    }

    /// The `keychainctl` beside this executable: an app with the group `keychainctl` unless a
    /// registration that counts names it (docs/security.md §2).
    public static func bundledCLIPath() -> String? {
        guard let exe = TrustedPaths.realPath("/proc/self/exe") else { return nil }
        let cli = FileSystem.parentDirectory(of: exe) + "/keychainctl"
        return FileSystem.isExecutable(cli) ? (TrustedPaths.realPath(cli) ?? cli) : nil
    }

    /// `path` resolved against the working directory when relative: `--config keychaind.json` once
    /// put apps.d at `/apps.d`, and a relative directory cannot be watched.
    static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : (CurrentProcess.workingDirectory() ?? ".") + "/" + path
    }
}
