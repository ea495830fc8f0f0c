import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainRequests
import KeychainSystem
import KeychainWire
import Synchronization

/// The `status` operation's answer: the daemon, the keychain's protection, the caller as
/// identified, the isolation report and each transport's own fields (RequestCore.transportStatuses).
extension RequestHandler {

    func status(app: AppEntry?, identified: Result<AppEntry, KeychainIdentityError>) throws(KeychainError)
        -> Value
    {
        // Only what the caller may see: all items for an admin, its groups' items for an app, and no
        // count at all for an unregistered executable.
        let count =
            try app.map { (a) throws(KeychainError) in
                try items.itemCount(visibleTo: Caller(accessGroups: a.accessGroups, isAdmin: a.admin))
            } ?? 0
        let protection = items.protectionStatus
        let transports = core.transportStatuses
        var result: [String: Value] = [
            "version": .text(Product.version),
            "locked": .bool(protection.locked),
            "passphraseSet": .bool(protection.passphraseSet),
            "failedUnlocks": .int(Int64(protection.failedUnlocks)),
            "unlockDelay": .float(protection.unlockDelay),
            "items": .int(Int64(count)),
            "uptime": .float(MonotonicClock.now() - started),
            // The auto-lock idle clock: seconds since the last request that counts as activity.
            "idleSeconds": .float(
                Double(MonotonicClock.milliseconds() - core.lastActivity.load(ordering: .relaxed)) / 1000),
            "autoLockSeconds": .int(Int64(lockSettings.autoLock)),
            "maxUnlockedSeconds": .int(Int64(lockSettings.maxUnlocked)),
            "connections": .int(Int64(openConnections.load(ordering: .relaxed))),
            "bufferedBytes": .int(Int64(budget.inUse)),
            "classes": .map(protection.classes.mapValues(Value.bool)),
            "caller": app.map { .text($0.applicationIdentifier) } ?? .null,
            "admin": .bool(app?.admin ?? false),
            "pinentryProgram": pinentryProgram.map(Value.text) ?? .null,
            "groups": app.map { .array($0.accessGroups.map(Value.text)) } ?? .null,
            "isolation": Isolation.report(
                registry: registrar.current.registry, passphraseSet: protection.passphraseSet,
                approvalsReadable: (try? items.approvedRegistrations()) != nil,
                withRegistrations: app != nil, userAppsDirectory: registrar.userAppsDirectory,
                extraNotes: transports.map(\.note)),
        ]
        for transport in transports { result[transport.name] = .map(transport.fields) }
        if protection.passphraseSet && !protection.locked {
            // What `maxUnlockedSeconds` counts: seconds since the unlock.
            let since = MonotonicClock.milliseconds() - unlockedAt.load(ordering: .relaxed)
            result["unlockedSeconds"] = .float(Double(max(0, since)) / 1000)
        }
        if case .failure(let why) = identified { result["unidentified"] = .text(why.message) }
        return .map(result)
    }
}
