import Foundation
import KeychainItems
import KeychainSystem
import Synchronization

/// Auto-lock: the keychain locks itself after a stretch without requests.
extension Daemon {
    /// Locks after `autoLockSeconds` without a request (status requests do not count), when a
    /// passphrase is set and the keychain is unlocked. Checks four times a second at most.
    func startAutoLockThread() {
        let seconds = settings.autoLockSeconds
        guard seconds > 0 else { return }
        let thread = Thread { [self] in
            let limit = Int64(seconds) * 1000
            let period: UInt32 = 250_000
            var first = true
            while !self.stopping.load(ordering: .relaxed) {
                sleep(microseconds: period)
                let idle = MonotonicClock.milliseconds() - self.handler.lastActivity.load(ordering: .relaxed)
                if idle >= limit, self.items.lockIfUnlocked() {
                    Log.info("keychain locked", [("by", "auto-lock"), ("idleSeconds", String(idle / 1000))])
                }
                if first {
                    first = false
                    Log.debug("auto-lock checking", [("afterSeconds", String(seconds)), ("idleMs", String(idle))])
                }
            }
        }
        thread.stackSize = 128 * 1024
        thread.start()
    }
}
