#if canImport(Glibc)
import Glibc
#endif

/// Who an executable is: the registered apps of `apps.d/`, looked up by the executable's real path.
///
/// When no entry names the `keychainctl` installed beside `keychaind`, that binary is an admin app
/// with the single group `keychainctl` (SPEC §5), so the defaults work without configuration.
public struct AppRegistry: Sendable {
    public let apps: [AppEntry]
    private let byExecutable: [String: AppEntry]

    public static let defaultAdminGroup = "keychainctl"

    public init(apps: [AppEntry], bundledCLI: String?) {
        var map: [String: AppEntry] = [:]
        for app in apps {
            for exe in app.executables {
                map[exe] = app
                if let real = Self.realPath(exe), map[real] == nil { map[real] = app }
            }
        }
        if let cli = bundledCLI, map[cli] == nil {
            let entry = AppEntry(applicationIdentifier: "keychainctl", accessGroups: [Self.defaultAdminGroup],
                                 executables: [cli], admin: true, file: "(built-in default for \(cli))")
            map[cli] = entry
        }
        self.apps = apps
        self.byExecutable = map
    }

    public func app(forExecutable path: String) -> AppEntry? {
        byExecutable[path]
    }

    static func realPath(_ path: String) -> String? {
        guard let p = realpath(path, nil) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }
}
