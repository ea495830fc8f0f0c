import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainRequests
import KeychainSync
import KeychainSystem

/// What the `sync` request asks of the daemon's sync service (set when `syncFolder` is configured).
protocol SyncRequests: Sendable {
    func handle(_ args: [String: Value]) throws(KeychainError) -> Value?
}

/// Sync (docs/sync.md) in the daemon: one thread runs the engine's cycles when a file in the sync
/// folder changes, when a write transaction finished (a local write; the store's write count,
/// looked at once a second), and after an unlock; the `sync` request pairs devices, rotates the key
/// and reports status.
final class SyncService: SyncRequests, @unchecked Sendable {
    // Safety: every mutable field below is read and written with `lock` held.
    private let lock = Lock()
    private let engine: SyncEngine
    private let items: ItemService
    private let dataDirectory: String
    let folder: String
    private let watch: DirectoryWatch
    private var invites: [(code: Pairing.Code, expires: Double)] = []
    private var lastError: String?
    private var lastCycle: Double?
    private var pending = true
    /// The store's write count when the last successful cycle began.
    private var databaseMark: UInt64?
    /// Pairing joins waiting for their answer: stopped with the service.
    private var waiters: [ObjectIdentifier: DirectoryWatch] = [:]
    private var stopped = false
    /// Signalled when the cycle thread has ended.
    private let finished = DispatchSemaphore(value: 0)

    /// Pairing invitations last this long (seconds).
    static let inviteLifetime = 600.0

    init(items: ItemService, folder: String, dataDirectory: String) throws(KeychainError) {
        self.items = items
        self.folder = folder
        self.dataDirectory = dataDirectory
        engine = try SyncEngine(service: items, folder: folder, stateDirectory: dataDirectory + "/sync")
        do {
            watch = try DirectoryWatch(directories: [folder]) { !$0.hasPrefix(".") }
        } catch {
            throw KeychainError(.io, "cannot watch the sync folder \(folder)", error)
        }
    }

    /// Starts the thread that runs cycles, until `stop`.
    func start() {
        let thread = Thread { [self] in
            defer { finished.signal() }
            while true {
                let woke: Bool?
                do throws(Errno) { woke = try watch.waitForEvents(timeoutMilliseconds: 1000) } catch {
                    Log.error("sync folder no longer watched", [("error", error.message)])
                    return
                }
                if woke == false { return }
                lock.withLock {
                    if woke == true {
                        _ = try? watch.hasChanged()
                        pending = true
                    }
                    if items.writeGeneration != databaseMark { pending = true }
                    if !invites.isEmpty { answerInvites() }
                    if pending && items.synchronizedClassesAvailable { pending = !runCycle() }
                }
            }
        }
        thread.stackSize = 512 * 1024
        thread.start()
    }

    /// Ends the cycle thread (waiting up to 10 s for a cycle under way) and any join waiting: the
    /// store closes after this.
    func stop() {
        let joins = lock.withLock { () -> [DirectoryWatch] in
            stopped = true
            return Array(waiters.values)
        }
        for w in joins { w.stop() }
        watch.stop()
        _ = finished.wait(timeout: .now() + 10)
    }

    /// One cycle, with the lock held; true when done (or nothing to do), false to try again later.
    private func runCycle() -> Bool {
        // Taken before the cycle: a write made while it runs (its own included) makes another.
        let mark = items.writeGeneration
        do {
            let r = try engine.cycle()
            lastCycle = WallClock.now()
            lastError = nil
            if r.exported > 0 || r.imported > 0 {
                Log.info("sync", [("exported", String(r.exported)), ("imported", String(r.imported))])
            }
            for p in engine.problems {
                Log.warning("sync file not read", [("file", p.name), ("reason", p.reason)])
            }
            databaseMark = mark
            return true
        } catch {
            if error.status == .notAvailable {  // not paired: nothing to do until pairing
                if engine.earlierFormat && lastError != error.message {
                    lastError = error.message
                    Log.warning("sync is paused", [("error", error.message)])
                }
                databaseMark = mark
                return true
            }
            // Tried again each second until it works: said once per different error.
            if error.status != .interactionNotAllowed && lastError != error.message {
                lastError = error.message
                Log.warning("sync cycle failed", [("error", error.message)])
            }
            return false
        }
    }

    /// Answers pairing requests for the invitations still open (lock held).
    private func answerInvites() {
        let now = WallClock.now()
        invites.removeAll { $0.expires < now }
        guard let key = engine.key else { return }
        invites.removeAll { invite in
            let path = folder + "/" + invite.code.requestName
            guard FileSystem.exists(path), case .success(let data) = SyncFolder.readFile(path) else { return false }
            do throws(KeychainError) {
                let (publicKey, device, signingKey) = try Pairing.openRequest(data, code: invite.code)
                try engine.admit(device: device, publicKey: signingKey)
                pending = true
                let reply = try Pairing.reply(
                    invite.code, to: publicKey, key: key, device: engine.device, devices: engine.state.keys)
                try SyncFolder.writeAtomically(reply, to: folder + "/" + invite.code.replyName)
                Log.write(.notice, "sync: device paired", [("device", SyncHex.encode(device))])
                return true
            } catch {
                Log.warning("sync: pairing request refused", [("error", error.message)])
                return false
            }
        }
    }

    // MARK: The `sync` request

    func handle(_ args: [String: Value]) throws(KeychainError) -> Value? {
        let action = args["action"]?.text ?? "status"
        switch action {
        case "status":
            return lock.withLock { () -> Value in
                var m = engine.status
                m["invitations"] = .int(Int64(invites.count))
                if let lastError { m["lastError"] = .text(lastError) }
                if let lastCycle { m["lastCycle"] = .date(lastCycle) }
                m["locked"] = .bool(!items.synchronizedClassesAvailable)
                return .map(m)
            }
        case "invite":
            return try lock.withLock { () throws(KeychainError) -> Value in
                try engine.loadKey()
                if engine.key == nil {
                    try engine.makeKey()
                    Log.write(.notice, "sync: new set of devices started")
                }
                let (text, code) = try Pairing.newCode()
                invites.append((code, WallClock.now() + Self.inviteLifetime))
                pending = true
                return .map(["code": .text(text), "expiresIn": .int(Int64(Self.inviteLifetime))])
            }
        case "join":
            guard let typed = args["code"]?.text else { throw .param("sync join needs \"code\" (text)") }
            let seconds = args["timeoutSeconds"]?.int ?? 120
            guard seconds > 0 && seconds <= 3600 else { throw .param("\"timeoutSeconds\" must be 1 to 3600") }
            return try join(Pairing.code(typed), timeout: Double(seconds))
        case "rotate":
            return try lock.withLock { () throws(KeychainError) -> Value in
                try engine.loadKey()
                guard engine.key != nil else {
                    throw KeychainError(.notAvailable, "this device is not paired for sync")
                }
                try engine.makeKey()
                invites.removeAll()
                pending = true
                _ = runCycle()
                Log.write(.notice, "sync: key rotated", [("epoch", String(engine.key!.epoch))])
                return .map(["keyEpoch": .int(Int64(engine.key!.epoch))])
            }
        case "leave":
            return try lock.withLock { () throws(KeychainError) -> Value? in
                try engine.leave()
                invites.removeAll()
                Log.write(.notice, "sync: left the set of devices")
                return nil
            }
        default:
            throw .param("unknown sync action \"\(action)\" (known: status, invite, join, rotate, leave)")
        }
    }

    /// The new device's half of pairing: posts its public key, waits for the sealed sync key.
    private func join(_ code: Pairing.Code, timeout: Double) throws(KeychainError) -> Value? {
        guard items.synchronizedClassesAvailable else {
            throw KeychainError(.interactionNotAllowed, "the keychain is locked: unlock it before pairing")
        }
        let (publicKey, secretKey) = try SealedBox.keyPair()
        let signingKey = try lock.withLock { () throws(KeychainError) in try engine.signingPublicKey() }
        let requestPath = folder + "/" + code.requestName
        let replyPath = folder + "/" + code.replyName
        let waiter: DirectoryWatch
        do { waiter = try DirectoryWatch(directories: [folder]) { $0 == code.replyName } } catch {
            throw KeychainError(.io, "cannot watch the sync folder", error)
        }
        let registered = lock.withLock { () -> Bool in
            guard !stopped else { return false }
            waiters[ObjectIdentifier(waiter)] = waiter
            return true
        }
        guard registered else { throw KeychainError(.notAvailable, "keychaind is stopping") }
        defer {
            lock.withLock { _ = waiters.removeValue(forKey: ObjectIdentifier(waiter)) }
            waiter.stop()
        }
        try SyncFolder.writeAtomically(
            Pairing.request(code, publicKey: publicKey, device: engine.device, signingKey: signingKey), to: requestPath)
        defer { FileSystem.removeIfPresent(requestPath) }
        let deadline = MonotonicClock.now() + timeout
        while true {
            if FileSystem.exists(replyPath), case .success(let data) = SyncFolder.readFile(replyPath) {
                let (key, from, devices) = try Pairing.openReply(
                    data, code: code, publicKey: publicKey, secretKey: secretKey)
                FileSystem.removeIfPresent(replyPath)
                try lock.withLock { () throws(KeychainError) in
                    try engine.adopt(key, devices: devices)
                    pending = true
                    _ = runCycle()
                }
                Log.write(.notice, "sync: paired", [("with", SyncHex.encode(from))])
                return .map(["pairedWith": .text(SyncHex.encode(from)), "keyEpoch": .int(Int64(key.epoch))])
            }
            let left = deadline - MonotonicClock.now()
            guard left > 0 else {
                throw KeychainError(
                    .notAvailable,
                    "no answer in the sync folder within \(Int(timeout)) s: is the other device's keychaind running with the same syncFolder, and has the folder been copied here?"
                )
            }
            let woke: Bool?
            do { woke = try waiter.waitForEvents(timeoutMilliseconds: Int32(min(left, 1) * 1000)) } catch {
                throw KeychainError(.io, "cannot watch the sync folder", error)
            }
            if woke == false { throw KeychainError(.notAvailable, "keychaind is stopping") }
            _ = try? waiter.hasChanged()
        }
    }
}

extension Daemon {
    /// Starts sync when `syncFolder` is set; a folder that cannot be used is logged and sync stays off.
    func startSync() {
        guard let folder = settings.syncFolder else { return }
        do {
            let service = try SyncService(items: items, folder: folder, dataDirectory: settings.dataDirectory)
            handler.sync.withLock { $0 = service }
            service.start()
            core.onShutdown { service.stop() }
            Log.info("sync folder watched", [("folder", folder)])
        } catch {
            Log.error("sync is off: the sync folder cannot be used", [("folder", folder), ("error", error.message)])
        }
    }
}

extension RequestHandler {
    /// The `sync` request: admins only; anything but `status` needs the keychain passphrase while
    /// one is set (pairing hands out, or takes in, the key to every synchronizable item).
    func sync(_ args: [String: Value]) throws(KeychainError) -> Value? {
        guard let service = sync.withLock({ $0 }) else {
            throw KeychainError(
                .notAvailable, "sync is off: set \"syncFolder\" in keychaind.json and restart keychaind (docs/sync.md)")
        }
        var rest = args
        let presence = rest.removeValue(forKey: "keychainPassphrase")
        if (rest["action"]?.text ?? "status") != "status" {
            var offered: SecureBytes?
            switch presence {
            case .bytes(let b)?: offered = try PasswordHash.passphrase(b)
            case .secret(let s)?:
                offered = try s.withUnsafeBytes { (b) throws(KeychainError) in try PasswordHash.passphrase(b) }
            default: offered = nil
            }
            try itemService.verifyPresence(passphrase: offered)
        }
        for key in rest.keys where !["action", "code", "timeoutSeconds"].contains(key) {
            throw .param("unknown request key \"\(key)\" for op \"sync\" (known: action, code, timeoutSeconds)")
        }
        return try service.handle(rest)
    }
}
