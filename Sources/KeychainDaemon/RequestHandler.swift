#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import KeychainCore
import KeychainWire
import KeychainItems
import KeychainCrypto

/// Turns one frame body into one response: decodes the request, finds who is calling, applies the
/// access policy, and calls the item service. Knows no sockets.
public final class RequestHandler: Sendable {
    public static let version = "0.1.0"

    private let items: ItemService
    private let registry: Locked<AppRegistry>
    private let started = MonotonicClock.now()
    let openConnections = Atomic<Int>(0)
    /// Monotonic milliseconds of the last request other than `status` (the auto-lock idle clock).
    let lastActivity = Atomic<Int64>(MonotonicClock.milliseconds())

    /// The largest request frame accepted (`maxFrameBytes`): a backup must fit in a restore request.
    private let maxFrameBytes: Int

    public init(items: ItemService, registry: AppRegistry, maxFrameBytes: Int = Frame.defaultMaxBytes) {
        self.items = items
        self.registry = Locked(registry)
        self.maxFrameBytes = maxFrameBytes
    }

    public func replaceRegistry(_ new: AppRegistry) {
        registry.withLock { $0 = new }
    }

    /// What to send back, and whether the connection must close after it (the bytes were not a
    /// CBOR map, so the stream can no longer be trusted).
    public struct Outcome {
        public var response: Response
        public var closeAfter: Bool
    }

    public func handle(frame body: [UInt8], peer: PeerIdentity) -> Outcome {
        let value: Value
        do { value = try CBOR.decode(body) } catch {
            return Outcome(response: Response(id: 0, error: KeychainError(.param, "request is not valid CBOR: \(error.message)")),
                           closeAfter: true)
        }
        guard case .map = value else {
            return Outcome(response: Response(id: 0, error: .param("request is not a CBOR map")), closeAfter: true)
        }
        let request: Request
        do { request = try Request(value) } catch {
            return Outcome(response: Response(id: Request.id(of: value) ?? 0, error: error), closeAfter: false)
        }
        // The idle clock of auto-lock counts from the end of a request too, so a slow one (an unlock
        // spends most of a second in Argon2id) is not followed by an immediate lock.
        defer { if request.op != Operation.status.rawValue { lastActivity.store(MonotonicClock.milliseconds(), ordering: .relaxed) } }
        do {
            let result = try serve(request, peer: peer)
            return Outcome(response: Response(id: request.id, result: result), closeAfter: false)
        } catch {
            return Outcome(response: Response(id: request.id, error: error), closeAfter: false)
        }
    }

    private func serve(_ request: Request, peer: PeerIdentity) throws(KeychainError) -> Value? {
        guard let op = Operation(rawValue: request.op) else {
            throw .param("unknown op \"\(request.op)\" (known: \(Operation.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        let app = registry.withLock { reg in peer.executable.flatMap { reg.app(forExecutable: $0) } }
        if op != .status { lastActivity.store(MonotonicClock.milliseconds(), ordering: .relaxed) }
        switch op {
        case .add, .copy, .delete, .update:
            for key in request.arguments.keys {
                throw .param("unknown request key \"\(key)\" for op \"\(op.rawValue)\"")
            }
            guard let query = request.query else { throw .param("op \"\(op.rawValue)\" needs a \"query\" map") }
            let caller = try self.caller(app, peer: peer)
            switch op {
            case .add:
                guard request.attributes == nil else { throw .param("op \"add\" takes no \"attributes\"; put them in \"query\"") }
                return try items.add(query, caller: caller)
            case .copy:
                guard request.attributes == nil else { throw .param("op \"copy\" takes no \"attributes\"") }
                return try items.copyMatching(query, caller: caller)
            case .delete:
                guard request.attributes == nil else { throw .param("op \"delete\" takes no \"attributes\"") }
                try items.delete(query, caller: caller)
                return nil
            default:
                guard let attributes = request.attributes else { throw .param("op \"update\" needs an \"attributes\" map") }
                try items.update(query, attributes: attributes, caller: caller)
                return nil
            }
        case .status:
            return try status(app: app)
        case .lock, .unlock, .passwd, .backup, .restore:
            guard let app, app.admin else {
                throw KeychainError(.missingEntitlement, "op \"\(op.rawValue)\" is for admin apps (keychainctl); this caller is not one")
            }
            return try admin(op, request.arguments)
        }
    }

    // MARK: Admin operations (docs/protocol.md §11)

    private func admin(_ op: Operation, _ arguments: [String: Value]) throws(KeychainError) -> Value? {
        // Secrets are copied into guarded memory at once and the decoded request's copies wiped,
        // whatever happens next (wrong type, unknown key, wrong passphrase).
        let args = Arguments(arguments)
        defer { args.wipe() }
        switch op {
        case .lock:
            try args.expect([])
            try items.lock()
            Log.info("keychain locked", [("by", "request")])
            return nil
        case .unlock:
            try args.expect(["passphrase"])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                if !items.hasPassphrase { return nil }
                throw KeychainError(.authFailed, "the passphrase is empty")
            }
            do {
                try items.unlock(passphrase: passphrase)
            } catch {
                Log.warning("unlock refused", [("failures", String(items.protectionStatus.failedUnlocks))])
                throw error
            }
            Log.info("keychain unlocked")
            return nil
        case .passwd:
            try args.expect(["old", "new"])
            let old = try args.secret("old", required: false)
            let new = try args.secret("new", required: true)
            let hadPassphrase = items.hasPassphrase
            let removed: Int
            do { removed = try items.changePassphrase(old: old, new: new) } catch {
                if error.status == .authFailed { Log.warning("passphrase change refused") }
                throw error
            }
            if new == nil {
                if hadPassphrase { Log.write(.notice, "passphrase removed: akpu items destroyed", [("items", String(removed))]) }
            } else {
                Log.write(.notice, hadPassphrase ? "passphrase changed" : "passphrase set")
            }
            return nil
        case .backup:
            try args.expect(["passphrase"])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                throw KeychainError(.param, "the backup passphrase must not be empty")
            }
            let file = try items.backup(passphrase: passphrase)
            // A backup that no restore request could carry would look like a backup and be useless.
            guard file.count + 1024 <= maxFrameBytes else {
                throw KeychainError(.allocate, "the backup would be \(file.count) bytes, more than a restore request may carry (maxFrameBytes \(maxFrameBytes)); raise maxFrameBytes in keychaind.json (up to 67108864) here and where you restore")
            }
            Log.info("backup made", [("bytes", String(file.count))])
            return .bytes(file)
        case .restore:
            try args.expect(["passphrase", "data"])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                throw KeychainError(.authFailed, "the backup passphrase is empty")
            }
            guard case .bytes(let data)? = arguments["data"] else {
                throw .param("op \"restore\" needs \"data\" (bytes: the backup file's content)")
            }
            let counts = try items.restore(passphrase: passphrase, data: data)
            Log.info("backup restored", [("restored", String(counts.restored)), ("skipped", String(counts.skipped))])
            return .map(["restored": .int(Int64(counts.restored)), "skipped": .int(Int64(counts.skipped))])
        default:
            throw .param("op \"\(op.rawValue)\" is not an admin operation")
        }
    }

    /// The top-level keys of an admin request.
    private struct Arguments {
        let values: [String: Value]
        init(_ values: [String: Value]) { self.values = values }

        func expect(_ known: [String]) throws(KeychainError) {
            for key in values.keys where !known.contains(key) {
                throw .param("unknown request key \"\(printable(key))\" for this op (known: \(known.isEmpty ? "none" : known.joined(separator: ", ")))")
            }
        }

        /// A passphrase argument in guarded memory; nil when absent (and not required) or empty.
        func secret(_ key: String, required: Bool) throws(KeychainError) -> SecureBytes? {
            switch values[key] {
            case nil:
                if required { throw .param("this op needs \"\(key)\" (bytes)") }
                return nil
            case .bytes(let b)?:
                return try PasswordHash.passphrase(b)
            case let other?:
                throw .param("\"\(key)\" must be bytes, not \(other.kindName)")
            }
        }

        /// Zeroes the passphrase bytes of the decoded request in place (shared storage included).
        func wipe() {
            for key in ["passphrase", "old", "new"] {
                if case .bytes(let b)? = values[key] { Sodium.wipeShared(b) }
            }
        }

        private func printable(_ key: String) -> String {
            String(key.unicodeScalars.prefix(32).map { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?" })
        }
    }

    private func caller(_ app: AppEntry?, peer: PeerIdentity) throws(KeychainError) -> Caller {
        guard let exe = peer.executable else {
            throw KeychainError(.missingEntitlement, "caller not identified: \(peer.problem ?? "unknown executable")")
        }
        guard let app else {
            throw KeychainError(.missingEntitlement,
                                "executable \(exe) is not registered with keychaind; add an apps.d/*.json entry with \"application-identifier\", \"keychain-access-groups\" and \"executables\": [\"\(exe)\"], then send SIGHUP to keychaind")
        }
        return Caller(accessGroups: app.accessGroups, isAdmin: app.admin)
    }

    private func status(app: AppEntry?) throws(KeychainError) -> Value {
        // Only what the caller may see: all items for an admin, its groups' items for an app, and no
        // count at all for an unregistered executable.
        let count = try app.map { (a) throws(KeychainError) in
            try items.itemCount(visibleTo: Caller(accessGroups: a.accessGroups, isAdmin: a.admin))
        } ?? 0
        let protection = items.protectionStatus
        return .map([
            "version": .text(Self.version),
            "locked": .bool(protection.locked),
            "passphraseSet": .bool(protection.passphraseSet),
            "failedUnlocks": .int(Int64(protection.failedUnlocks)),
            "unlockDelay": .float(protection.unlockDelay),
            "items": .int(Int64(count)),
            "uptime": .float(MonotonicClock.now() - started),
            // The auto-lock idle clock: seconds since the last request that counts as activity.
            "idleSeconds": .float(Double(MonotonicClock.milliseconds() - lastActivity.load(ordering: .relaxed)) / 1000),
            "connections": .int(Int64(openConnections.load(ordering: .relaxed))),
            "classes": .map(protection.classes.mapValues(Value.bool)),
            "caller": app.map { .text($0.applicationIdentifier) } ?? .null,
            "admin": .bool(app?.admin ?? false),
            "groups": app.map { .array($0.accessGroups.map(Value.text)) } ?? .null,
        ])
    }
}

enum MonotonicClock {
    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    static func milliseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }
}
