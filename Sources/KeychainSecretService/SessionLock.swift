import CSystemd
import Foundation
public import KeychainRequests
import KeychainSystem
import Synchronization

/// Locking with the session (`"lockWithSession": true`): keychaind locks the keychain when logind
/// says a session of this user locked — the session's `Lock` signal (`loginctl lock-session`,
/// an idle timeout, a locker that asks logind) or its `LockedHint` turning true (what GNOME Shell and
/// other lockers set once the screen is locked) — and before the machine sleeps, on the Manager's
/// `PrepareForSleep(true)`, holding a "delay" sleep inhibitor until then so the lock happens first.
/// The inhibitor is closed once locked and taken again on `PrepareForSleep(false)` (the resume).
///
/// Which sessions: every session of this uid. keychaind runs under `systemd --user`, outside any
/// session (`GetSessionByPID` fails for it and `XDG_SESSION_ID` is unset), and one keychain serves
/// all the user's sessions: a screen locked anywhere is a seat someone walked away from. A signal
/// counts when it comes from logind's current unique name on the bus (any connection may send any
/// signal to keychaind directly, other users' processes included) and, for a session, when logind
/// says the session's `User` is this uid.
///
/// Its own thread and its own system-bus connection; nothing else in keychaind depends on it. No
/// system bus, or no logind on it, is one log line and the daemon carries on.
public final class SessionLock: @unchecked Sendable {
    static let logind = "org.freedesktop.login1"
    static let managerPath = "/org/freedesktop/login1"
    static let manager = "org.freedesktop.login1.Manager"
    static let session = "org.freedesktop.login1.Session"
    static let properties = "org.freedesktop.DBus.Properties"

    let core: RequestCore
    let bus: BusConnection
    let uid = SystemLayer.uid
    private let wake: WakePipe
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    // Bus-thread state.
    /// logind's unique name on the bus, or nil while it is not there.
    var logindOwner: String?
    /// The "delay" sleep inhibitor: held while awake, closed once locked before sleep.
    var inhibitor: FileDescriptor?

    /// Starts watching logind on the system bus; nil (after one log line saying why) when there is no
    /// system bus. Stops with the daemon.
    public static func start(core: RequestCore) -> SessionLock? {
        let watcher: SessionLock
        do throws(BusError) { watcher = try SessionLock(core: core) } catch {
            Log.warning(
                "session lock: not locking with the session or before sleep", [("reason", error.message)])
            return nil
        }
        core.onShutdown { watcher.stop() }
        let thread = Thread { [watcher] in
            watcher.loop()
            watcher.finished.signal()
        }
        thread.stackSize = 256 * 1024
        thread.name = "session-lock"
        thread.start()
        return watcher
    }

    private init(core: RequestCore) throws(BusError) {
        self.core = core
        do throws(Errno) { wake = try WakePipe() } catch { throw .failed("cannot create a pipe: \(error.message)") }
        bus = try BusConnection(.system)
        let me = Unmanaged.passUnretained(self).toOpaque()
        // No sender in the rules: sd-bus compares it with the message's unique sender, and a signal
        // sent to keychaind directly arrives whatever the rule says; `fromLogind` checks every one.
        for rule in [
            "type='signal',interface='\(Self.session)',member='Lock'",
            "type='signal',interface='\(Self.properties)',member='PropertiesChanged',arg0='\(Self.session)'",
            "type='signal',path='\(Self.managerPath)',interface='\(Self.manager)',member='PrepareForSleep'",
            "type='signal',sender='\(SecretService.busDriver)',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(Self.logind)'",
        ] {
            try bus.addMatch(
                rule,
                handler: { m, userdata, _ in
                    guard let m, let userdata else { return 0 }
                    Unmanaged<SessionLock>.fromOpaque(userdata).takeUnretainedValue().signal(BusMessage(retaining: m))
                    return 0
                }, userdata: me)
        }
        logindOwner = nameOwner()
        guard logindOwner != nil else {
            Log.warning("session lock: logind (org.freedesktop.login1) is not on the system bus; waiting for it")
            return
        }
        takeInhibitor()
        Log.info(
            "session lock: locking when a session of this user locks, and before sleep",
            [("uid", String(uid)), ("sleepInhibitor", inhibitor == nil ? "no" : "yes")])
    }

    /// Stops watching (any thread); safe to call twice.
    func stop() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wake.wake()
        finished.wait()
    }

    private func loop() {
        while !stopping.load(ordering: .acquiring) {
            var r = bus.process()
            while r > 0 && !stopping.load(ordering: .relaxed) { r = bus.process() }
            if r < 0 {
                Log.error(
                    "session lock: the system bus connection was lost; no longer locking with the session",
                    [("errno", String(-r))])
                return
            }
            if Poll.wait(
                bus.fd, events: Int16(truncatingIfNeeded: bus.events), or: wake,
                timeoutMilliseconds: bus.timeoutMilliseconds)
            {
                wake.drain()
            }
        }
        inhibitor?.close()
    }

    // MARK: Signals

    func signal(_ m: BusMessage) {
        guard m.isSignal else { return }
        switch (m.interface, m.member) {
        case ("org.freedesktop.DBus", "NameOwnerChanged"): logindMoved(m)
        case (Self.session, "Lock"):
            guard fromLogind(m), let path = m.path, isOurs(session: path) else { return }
            lock(by: "session-lock", [("session", path), ("signal", "Lock")])
        case (Self.properties, "PropertiesChanged"):
            guard lockedHintSet(m), fromLogind(m), let path = m.path, isOurs(session: path) else { return }
            lock(by: "session-lock", [("session", path), ("signal", "LockedHint")])
        case (Self.manager, "PrepareForSleep"):
            guard m.path == Self.managerPath, fromLogind(m), (try? m.expect("b")) != nil,
                let sleeping = try? m.readBool()
            else { return }
            if sleeping {
                lock(by: "sleep", [])
                // Locked (or nothing to lock): the machine may sleep now.
                inhibitor?.close()
                inhibitor = nil
            } else {
                takeInhibitor()
            }
        default: return
        }
    }

    private func lock(by reason: String, _ fields: [(String, String)]) {
        if !core.lockNow(by: reason) {
            Log.debug("session lock: nothing to lock", [("by", reason)] + fields)
        } else if !fields.isEmpty {
            Log.debug("session lock: locked on logind's word", fields)
        }
    }

    /// Whether the signal's sender is logind as the bus names it now (asked again once on a mismatch,
    /// in case logind restarted and the NameOwnerChanged has not been read yet).
    private func fromLogind(_ m: BusMessage) -> Bool {
        guard let sender = m.sender else { return false }
        if sender == logindOwner { return true }
        logindOwner = nameOwner()
        guard sender == logindOwner else {
            Log.debug("session lock: a logind signal not sent by logind ignored", [("sender", sender)])
            return false
        }
        return true
    }

    /// logind came, went or restarted: a new logind knows nothing of the old one's inhibitor.
    private func logindMoved(_ m: BusMessage) {
        guard m.sender == SecretService.busDriver, (try? m.expect("sss")) != nil,
            (try? m.readString()) == Self.logind, (try? m.readString()) != nil, let owner = try? m.readString()
        else { return }
        inhibitor?.close()
        inhibitor = nil
        logindOwner = owner.isEmpty ? nil : owner
        if logindOwner != nil {
            takeInhibitor()
            Log.info("session lock: logind is on the system bus", [("sleepInhibitor", inhibitor == nil ? "no" : "yes")])
        }
    }

    /// `PropertiesChanged` of a session with `LockedHint` true.
    private func lockedHintSet(_ m: BusMessage) -> Bool {
        guard m.signature == "sa{sv}as", (try? m.readString()) == Self.session else { return false }
        do throws(BusError) {
            _ = try m.enter("a", "{sv}")
            var changes = 0
            while try m.enter("e", "sv") {
                changes += 1
                guard changes <= 256 else { return false }
                if try m.readString() == "LockedHint", try m.peek()?.contents == "b" {
                    _ = try m.enter("v", "b")
                    let locked = try m.readBool()
                    try m.exit()
                    if locked { return true }
                } else {
                    try m.skip("v")
                }
                try m.exit()
            }
        } catch { return false }
        return false
    }

    // MARK: Calls to logind

    /// The unique name owning `org.freedesktop.login1`, from the bus.
    private func nameOwner() -> String? {
        guard
            let call = try? bus.newCall(
                destination: SecretService.busDriver, path: "/org/freedesktop/DBus",
                interface: "org.freedesktop.DBus", member: "GetNameOwner"),
            (try? call.append(string: Self.logind)) != nil,
            let reply = try? bus.call(call), (try? reply.expect("s")) != nil, let owner = try? reply.readString()
        else { return nil }
        return owner
    }

    /// Whether logind says the session at `path` is this uid's (its `User` property, `(uo)`).
    private func isOurs(session path: String) -> Bool {
        guard let owner = logindOwner,
            let call = try? bus.newCall(
                destination: owner, path: path, interface: Self.properties, member: "Get"),
            (try? call.append(string: Self.session)) != nil, (try? call.append(string: "User")) != nil,
            let reply = try? bus.call(call), (try? reply.expect("v")) != nil,
            (try? reply.enter("v", "(uo)")) == true, (try? reply.enter("r", "uo")) == true,
            let user = try? reply.readUInt32()
        else {
            Log.debug(
                "session lock: cannot tell whose session this is; ignored", [("session", BusPath.printable(path))])
            return false
        }
        if user != uid {
            Log.debug("session lock: a session of another user locked; ignored", [("session", BusPath.printable(path))])
        }
        return user == uid
    }

    /// Takes the "delay" sleep inhibitor: logind then waits (up to its InhibitDelayMaxSec, 5 s by
    /// default) for keychaind to lock before the machine sleeps. Without it keychaind still locks on
    /// `PrepareForSleep(true)`, but the machine may be asleep first.
    private func takeInhibitor() {
        guard inhibitor == nil, let owner = logindOwner else { return }
        do throws(BusError) {
            let call = try bus.newCall(
                destination: owner, path: Self.managerPath, interface: Self.manager, member: "Inhibit")
            for s in ["sleep", "keychaind", "lock the keychain before sleep", "delay"] { try call.append(string: s) }
            let reply = try bus.call(call)
            try reply.expect("h")
            let fd = try reply.readFD()
            do throws(Errno) { inhibitor = try FileDescriptor.duplicate(fd) } catch {
                throw .failed("cannot keep the inhibitor: \(error.message)")
            }
        } catch {
            Log.warning(
                "session lock: no sleep inhibitor; the machine may sleep before the keychain is locked",
                [("error", error.name), ("reason", error.message)])
        }
    }
}
