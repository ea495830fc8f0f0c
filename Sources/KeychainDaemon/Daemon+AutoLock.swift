import Foundation
import KeychainItems
import KeychainRequests
import KeychainSystem
import Synchronization

/// Auto-lock: the keychain locks itself after a stretch without successful requests
/// (`autoLockSeconds`), and a stretch after it was unlocked whatever the activity
/// (`maxUnlockedSeconds`). docs/security.md §2, "Successful requests keep the keychain unlocked".
extension Daemon {
    /// Locks, when a passphrase is set and the keychain is unlocked, after `autoLockSeconds` without
    /// a request that counts as activity (RequestHandler.lastActivity: successful requests of
    /// identified apps), or `maxUnlockedSeconds` after the unlock (RequestHandler.unlockedAt).
    /// Checks four times a second at most.
    ///
    /// An unlock over the socket stamps `unlockedAt` itself. Any other way into the unlocked state (a
    /// credential at start, the first passphrase set on an open keychain) is stamped here, at the
    /// first check that sees it; a lock and unlock between two checks always went through the socket.
    func startAutoLockThread() {
        let seconds = settings.autoLockSeconds
        let bound = settings.maxUnlockedSeconds
        guard seconds > 0 || bound > 0 else { return }
        let thread = Thread { [self] in
            let limit = Int64(seconds) * 1000
            let boundMs = Int64(bound) * 1000
            let period: UInt32 = 250_000
            var first = true
            // When a check last saw the keychain other than unlocked (locked, or no passphrase).
            var notUnlockedSeen = Int64.min
            while !self.stopping.load(ordering: .relaxed) {
                sleep(microseconds: period)
                let now = MonotonicClock.milliseconds()
                let unlocked = self.items.hasPassphrase && !self.items.isLocked
                if !unlocked {
                    notUnlockedSeen = now
                } else if self.handler.unlockedAt.load(ordering: .relaxed) < notUnlockedSeen {
                    self.handler.unlockedAt.store(now, ordering: .relaxed)
                }
                // Under the unlock gate: an unlock that has checked its passphrase has also restarted
                // both clocks, so it is never followed by a lock counted from before it.
                let (idle, why) = self.core.unlockGate.withLock { () -> (Int64, String?) in
                    let now = MonotonicClock.milliseconds()
                    let idle = now - self.core.lastActivity.load(ordering: .relaxed)
                    let open = now - self.handler.unlockedAt.load(ordering: .relaxed)
                    var why: String?
                    if limit > 0 && idle >= limit {
                        why = "auto-lock"
                    } else if boundMs > 0 && unlocked && open >= boundMs {
                        // `unlocked`: this check has seen the unlock and stamped it when it had to; a
                        // keychain that became unlocked since is stamped by the next check first.
                        why = "max-unlocked"
                    }
                    guard let why, self.items.lockIfUnlocked() else { return (idle, nil) }
                    return (idle, why)
                }
                if let why {
                    Log.info(
                        "keychain locked",
                        why == "auto-lock"
                            ? [("by", why), ("idleSeconds", String(idle / 1000))]
                            : [("by", why), ("maxUnlockedSeconds", String(bound))])
                }
                if first {
                    first = false
                    Log.debug(
                        "auto-lock checking",
                        [
                            ("afterSeconds", String(seconds)), ("maxUnlockedSeconds", String(bound)),
                            ("idleMs", String(idle)),
                        ])
                }
            }
        }
        thread.stackSize = 128 * 1024
        thread.start()
    }
}
