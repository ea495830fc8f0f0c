import Foundation
import KeychainCore
import KeychainDaemon
import KeychainItems
import KeychainRequests
import KeychainSecretService
import KeychainStore
import KeychainSystem

// Swift's crash reporter prints memory next to registers; a secrets daemon must not. The setting is
// read at process start, so when it is missing we set it and exec ourselves once.
if CurrentProcess.environment("SWIFT_BACKTRACE") != "enable=no" {
    CurrentProcess.setEnvironment("SWIFT_BACKTRACE", "enable=no")
    CurrentProcess.reexecute()
    // exec failed: carry on; the unit file sets the variable anyway.
}

do { try Daemon.installSignalHandlers() } catch {
    fail("cannot install the signal handlers, so SIGTERM could not stop the daemon in order (\(error))")
}
CurrentProcess.makeUmaskPrivate()
// One descriptor per client: take the hard limit so a thousand clients fit.
CurrentProcess.raiseOpenFileLimit()
// Large buffers (an answer of a large item, its sealed row) are mapped for themselves and unmapped
// when freed: the memory of answers is returned once they are written or their peers close.
HeapMemory.returnLargeAllocations(above: 128 * 1024)
// Non-dumpable: no core files, and no /proc/<pid>/mem or ptrace for other processes of this user.
// Debug builds (never a release or a package) can stay dumpable for the heap-scan test, which reads
// the daemon's memory to prove secrets are wiped (docs/security.md §1).
/// Whether this is a debug build asked to stay dumpable (always false in a release build). A
/// function rather than a constant, so a release build does not warn that the branch below never runs.
func staysDumpableForHeapScan() -> Bool {
    #if DEBUG
        return CurrentProcess.environment("KEYCHAIND_TEST_DUMPABLE") == "1"
    #else
        return false
    #endif
}
if staysDumpableForHeapScan() {
    Log.warning("debug build: staying dumpable for a memory-scanning test (KEYCHAIND_TEST_DUMPABLE=1)")
} else {
    do { try CurrentProcess.makeUndumpable() } catch {
        Log.warning("could not make the process non-dumpable", [("error", error.message)])
    }
}

/// The executable that may call the Secret portal's backend: Debian's xdg-desktop-portal. Debug builds
/// (never a release or a package) take another from `KEYCHAIND_TEST_PORTAL_FRONTEND`, for tests that
/// call the backend with input xdg-desktop-portal never sends.
func portalFrontend() -> String {
    #if DEBUG
        if let path = CurrentProcess.environment("KEYCHAIND_TEST_PORTAL_FRONTEND"), !path.isEmpty {
            Log.warning("debug build: the Secret portal backend takes calls from a test's program", [("path", path)])
            return path
        }
    #endif
    return SecretService.portalFrontendPath
}

func fail(_ message: String) -> Never {
    FileDescriptor.standard(2).writeAll(Array("keychaind: \(message)\n".utf8))
    CurrentProcess.exit(1)
}

let parsed: Options.Parsed
do { parsed = try Options.parse(Array(CommandLine.arguments.dropFirst())) } catch { fail(error.description) }

switch parsed {
case .help:
    print(Options.help)
    CurrentProcess.exit(0)
case .version:
    print("keychaind \(Product.version)")
    CurrentProcess.exit(0)
case .run(let options):
    let settings: Settings
    do {
        settings = try Daemon.settings(for: options, environment: ProcessInfo.processInfo.environment)
    } catch {
        fail("configuration error: \(error)")
    }
    Log.threshold = settings.logLevel
    if options.checkConfig {
        do {
            print("configuration ok: \(settings.configFile)")
            for directory in settings.systemAppsDirectories + [settings.appsDirectory] {
                let system = directory != settings.appsDirectory
                let dirProblem = system ? TrustedPaths.rootOwnedProblem(directory) : nil
                for app in try AppFiles.load(directory: directory) {
                    let problem = system ? (dirProblem ?? TrustedPaths.rootOwnedProblem(app.file)) : nil
                    let trust =
                        problem.map { "not trusted (\($0))" }
                        ?? (system ? "trusted" : "trusted while no passphrase is set, else when approved")
                    print(
                        "app \(app.applicationIdentifier) groups=\(app.accessGroups.joined(separator: ",")) admin=\(app.admin) executables=\(app.executables.joined(separator: ",")) file=\(app.file): \(trust)"
                    )
                }
            }
            CurrentProcess.exit(0)
        } catch {
            fail("configuration error: \(error)")
        }
    }
    if options.acceptDatabase {
        func itemCount(_ n: Int64) -> String { n == 1 ? "1 item" : "\(n) items" }
        // A running daemon holds the database lock, so opening the store below refuses while it runs.
        let database = settings.dataDirectory + "/" + ItemService.databaseName
        guard FileSystem.exists(database) else {
            fail("there is no keychain database at \(database): nothing to accept (check --data-dir)")
        }
        do {
            try DataDirectoryGuard.check(directory: settings.dataDirectory)
            let items = try ItemService(
                directory: settings.dataDirectory, kdfProfile: settings.kdfProfile,
                lookupCacheEntries: 0, acceptCurrentRows: true)
            let check = items.rowCheck
            items.close()
            if check.resealed {
                Log.write(
                    .warning, "database accepted as it is: row-state record rewritten", [("rows", String(check.rows))])
                print("accepted \(database) as it is now (\(itemCount(check.rows))); start keychaind normally")
            } else {
                print("\(database) (\(itemCount(check.rows))) already matches its row-state record; nothing to accept")
            }
            CurrentProcess.exit(0)
        } catch {
            fail("cannot accept the database: \(error)")
        }
    }
    let daemon: Daemon
    do {
        try DataDirectoryGuard.check(directory: settings.dataDirectory)
        daemon = try Daemon(settings: settings)
    } catch {
        fail("cannot start: \(error)")
    }
    // The Secret Service on the session bus, inside this process: it takes its bus name
    // before the daemon reports ready, and stops before the store closes.
    if settings.secretService {
        let secretService: SecretService
        do {
            let prompts = PassphrasePrompts(
                prompter: { daemon.prompter },
                unlock: { (pin, by) throws(KeychainError) in try daemon.unlock(typed: pin, by: by) })
            secretService = try SecretService(
                core: daemon.core, prompts: prompts, unregistered: settings.secretServiceUnregistered,
                foreignItems: settings.secretServiceForeignItems,
                maxFrameBytes: settings.maxFrameBytes, replace: options.replaceBusName,
                portalFrontend: portalFrontend())
        } catch {
            daemon.abandon()
            fail("cannot serve the Secret Service: \(error)")
        }
        daemon.core.onShutdown { secretService.stop() }
        secretService.start()
    }
    // Locking with the session (logind on the system bus): watching before the daemon reports ready;
    // without a system bus or logind, a log line and nothing else.
    if settings.lockWithSession { _ = SessionLock.start(core: daemon.core) }
    CurrentProcess.exit(daemon.run())
}
