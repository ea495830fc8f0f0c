import Foundation
import KeychainRequests
import KeychainSystem

/// Reads the registrations again when a file in an `apps.d` changes, as SIGHUP does, so that a
/// registration written by hand or by `keychainctl register` counts (or stops counting) without a
/// signal. A thread waits for changes; and every new connection, and a bus caller's first
/// identification, catch up first (`catchUp`), so a peer that connects after a change — an app
/// started right after its registration was written, or after it was removed — is identified
/// under it: the kernel queued the change before the writer's `close` returned.
final class AppsWatcher: Sendable {
    private let watch: DirectoryWatch
    private let registrar: Registrar
    /// Held while the queued changes are taken and the registrations read again: whoever looks while
    /// the watching thread reloads waits for that reload rather than finding the queue empty.
    private let reloading = Lock()

    /// Watches the user's and the system's `apps.d` (including ones that do not exist yet), before
    /// the registrations are first read so that no change in between is missed; nil, having said
    /// why, when inotify cannot be had (SIGHUP still reloads).
    static func watch(_ directories: [String]) -> DirectoryWatch? {
        for directory in DirectoryWatch.ignored(directories) {
            Log.warning("apps.d not watched: not an absolute path; SIGHUP reloads it", [("directory", directory)])
        }
        do {
            let watch = try DirectoryWatch(directories: directories) { $0.hasSuffix(".json") }
            do throws(Errno) { try watch.rewatch() } catch {
                Log.warning("apps.d not all watched; SIGHUP reloads and watches again", [("error", error.message)])
            }
            return watch
        } catch {
            Log.warning("apps.d not watched: registrations are read again on SIGHUP only", [("error", error.message)])
            return nil
        }
    }

    init(watch: DirectoryWatch, registrar: Registrar) {
        self.watch = watch
        self.registrar = registrar
    }

    /// Reloads if an `apps.d` changed since the last look, or waits for a reload of such a change
    /// already under way; true when the registrations were read again (or a reload refused them).
    @discardableResult
    func catchUp() -> Bool {
        let reloaded = reloading.withLock { () -> Bool? in
            do throws(Errno) {
                guard try watch.hasChanged() else { return nil }
            } catch {
                Log.warning(
                    "apps.d watch could not follow a directory; SIGHUP reloads and watches again",
                    [("error", error.message)])
            }
            return registrar.reload("apps.d changed")
        }
        if reloaded == true { ServiceNotifier.send("STATUS=serving (apps reloaded)") }
        return reloaded != nil
    }

    /// Moves the watches to where the directories are now (SIGHUP: after changes inotify does not
    /// report, such as a directory above apps.d renamed).
    func rewatch() {
        do throws(Errno) { try watch.rewatch() } catch {
            Log.warning("apps.d not all watched", [("error", error.message)])
        }
    }

    /// Starts the thread that reloads on every change, until `stop`.
    func start() {
        let thread = Thread { [self] in
            do throws(Errno) {
                while try watch.waitForEvents() { catchUp() }
            } catch {
                Log.error("apps.d no longer watched: SIGHUP reloads the registrations", [("error", error.message)])
            }
        }
        thread.stackSize = 256 * 1024
        thread.start()
    }

    /// Ends the watching thread.
    func stop() { watch.stop() }
}
