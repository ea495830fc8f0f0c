import Foundation
import KeychainSystem

/// Reads the registrations again when a file in an `apps.d` changes, as SIGHUP does, so that a
/// registration written by hand or by `keychainctl register` counts (or stops counting) without a
/// signal. A thread waits for changes; and a connection from a program that is not a registered app
/// catches up first (`catchUp`), so an app started right after its registration was written is
/// identified: the kernel queued the change before the writer's `close` returned.
final class AppsWatcher: Sendable {
    private let watch: DirectoryWatch
    private let registrar: Registrar
    /// Held while the queued changes are taken and the registrations read again: whoever looks while
    /// the watching thread reloads waits for that reload rather than finding the queue empty.
    private let reloading = Lock()

    /// Watches the user's and the system's `apps.d` (including ones that do not exist yet); throws
    /// the inotify errno (the user's watch limit reached, say).
    init(directories: [String], registrar: Registrar) throws(Errno) {
        watch = try DirectoryWatch(directories: directories) { $0.hasSuffix(".json") }
        self.registrar = registrar
    }

    /// Reloads if an `apps.d` changed since the last look, or waits for a reload of such a change
    /// already under way; true when the registrations were read again (or a reload refused them).
    @discardableResult
    func catchUp() -> Bool {
        reloading.withLock {
            do throws(Errno) {
                guard try watch.hasChanged() else { return false }
            } catch {
                Log.warning(
                    "apps.d watch could not follow a directory; SIGHUP reloads if a change is missed",
                    [("error", error.message)])
            }
            if registrar.reload("apps.d changed") { ServiceNotifier.send("STATUS=serving (apps reloaded)") }
            return true
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
