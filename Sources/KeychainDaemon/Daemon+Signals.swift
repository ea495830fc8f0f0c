import Foundation
public import KeychainCore
import KeychainSystem

/// SIGTERM, SIGINT and SIGHUP, through the self-pipe.
extension Daemon {
    /// Signals arrive through a self-pipe: a C handler (any thread may take the signal) writes the
    /// signal number to a pipe, and this thread acts on it — no work in signal context, no Dispatch.
    func startSignalThread() {
        guard let pipe = Daemon.signalPipe else { return }
        let thread = Thread { [self] in
            while let signal = SignalPipe.next(from: pipe) {
                switch signal {
                case .hangUp: self.reloadApps()
                case .terminate, .interrupt: self.stop()
                }
            }
        }
        thread.stackSize = 256 * 1024
        thread.start()
    }

    nonisolated(unsafe) static var signalPipe: FileDescriptor?

    /// Call first thing in main: from here on SIGTERM/SIGINT/SIGHUP only write to the signal pipe
    /// (read by the signal thread once the daemon runs), whatever thread they land on. Throws when
    /// they cannot be installed: SIGTERM would then end the daemon without its orderly stop.
    public static func installSignalHandlers() throws(KeychainError) {
        do { signalPipe = try SignalPipe.install() } catch { throw KeychainError(.io, error) }
    }
}
