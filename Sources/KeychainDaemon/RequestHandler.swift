#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import KeychainCore
import KeychainWire
import KeychainItems

/// Turns one frame body into one response: decodes the request, finds who is calling, applies the
/// access policy, and calls the item service. Knows no sockets.
public final class RequestHandler: Sendable {
    public static let version = "0.1.0"

    private let items: ItemService
    private let registry: Mutex<AppRegistry>
    private let started = MonotonicClock.now()
    let openConnections = Atomic<Int>(0)

    public init(items: ItemService, registry: AppRegistry) {
        self.items = items
        self.registry = Mutex(registry)
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
            throw KeychainError(.unimplemented, "op \"\(op.rawValue)\" is not available yet: passphrases and lock states come with the protection work (issue 5)")
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
        return registry.withLock { $0.caller(for: app) }
    }

    private func status(app: AppEntry?) throws(KeychainError) -> Value {
        let count = try items.itemCount()
        var classes: [String: Value] = [:]
        for c in ["ak", "ck", "dk", "aku", "cku", "dku", "akpu"] { classes[c] = .bool(c != "akpu") }
        return .map([
            "version": .text(Self.version),
            "locked": .bool(false),
            "passphraseSet": .bool(false),
            "items": .int(Int64(count)),
            "uptime": .float(MonotonicClock.now() - started),
            "connections": .int(Int64(openConnections.load(ordering: .relaxed))),
            "classes": .map(classes),
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
}
