package import KeychainCore
import KeychainSystem
import KeychainWire

/// One connection to keychaind, shared by every caller in the process, with pipelined requests.
///
/// Each request gets the next id and is written whole under a write lock; a reader thread owned by the
/// connection reads responses and hands each to the caller waiting for that id (a blocked thread, or
/// an `async` caller's continuation — async callers never park a cooperative-pool thread).
///
/// When the daemon goes away (restart, socket activation, idle timeout) the next request connects
/// again. A request whose write fails was not delivered and is retried once on a new connection. A
/// request that was written but not answered when the connection died is replayed once only when it
/// cannot change anything (`copy`, `status`); any other call fails with `errSecNotAvailable`, because
/// the daemon may or may not have carried it out.
public final class KeychainConnection: Sendable {
    /// The largest request the client sends: the highest `maxFrameBytes` a daemon can be set to.
    public static let maxRequestBytes = 64 << 20

    /// The connection every SecItem call, `Keychain`, `DeviceIdentifier` and `KeychainAdmin` uses by
    /// default. Its socket path comes from `KEYCHAIND_SOCKET` or `$XDG_RUNTIME_DIR/keychaind/keychaind.sock`,
    /// resolved again at each (re)connect.
    public static let shared = KeychainConnection()

    /// Largest response the client accepts (backups and `m_LimitAll` results can be large).
    public static let maxResponseBytes = 256 << 20

    private struct Pending {
        let waiter: Waiter
        let generation: Int
        var sent: Bool
    }

    private struct State {
        var explicitPath: String?
        var link: Link?
        var generation = 0
        var nextID: Int64 = 1
        var pending: [Int64: Pending] = [:]
    }

    private let state: Locked<State>
    /// Held while one frame is written, so frames never interleave.
    private let writeLock = Lock()
    /// Held while connecting, so many callers arriving together open one connection, not many.
    private let connectLock = Lock()

    /// A connection to `socketPath`, or (nil) to the path the environment names at each connect.
    public init(socketPath: String? = nil) {
        state = Locked(State(explicitPath: socketPath))
    }

    /// The socket this connection uses (or will use on its next connect).
    public var socketPath: String {
        state.withLock { $0.explicitPath } ?? SocketLocation.fromProcessEnvironment()
    }

    /// Points the connection at another socket (nil: the environment's) and drops the current link.
    /// Requests in flight on the old link fail with `errSecNotAvailable` (or are replayed if harmless).
    public func retarget(socketPath: String?) {
        let old = state.withLock { s -> Link? in
            s.explicitPath = socketPath
            let l = s.link
            s.link = nil
            return l
        }
        old?.shutdown()
    }

    /// Closes the current link (the next request connects again).
    public func disconnect() {
        let old = state.withLock { s -> Link? in
            let l = s.link
            s.link = nil
            return l
        }
        old?.shutdown()
    }

    /// Whether this process has a link to the daemon open (for tests and diagnostics). A link inherited
    /// through `fork()` does not count: it belongs to the parent.
    public var isConnected: Bool { state.withLock { $0.link.map { $0.pid == CurrentProcess.pid } ?? false } }

    /// How many links this connection has opened so far; a call that had to reconnect raises it
    /// (for tests and diagnostics).
    package var linkGeneration: Int { state.withLock { $0.generation } }

    // MARK: Calls

    /// Sends one request and waits for its answer, blocking the calling thread.
    ///
    /// Returns the response's `result` (nil when the operation returns none); a non-zero status is
    /// thrown as `KeychainError` with the daemon's message.
    package func call(
        _ op: Operation, query: [String: Value]? = nil, attributes: [String: Value]? = nil,
        arguments: [String: Value] = [:]
    ) throws(KeychainError) -> Value? {
        var plan = RetryPlan(op: op)
        while true {
            let slot = OneShot<Outcome>()
            let outcome: Outcome
            switch start(op, query, attributes, arguments, waiter: .blocking(slot)) {
            case .failure(let e): throw e
            case .success(.some(let immediate)): outcome = immediate
            case .success(nil): outcome = slot.wait()
            }
            if let result = try plan.next(outcome) { return result.value }
        }
    }

    /// Sends one request and suspends until its answer arrives; the reader thread resumes the caller.
    package func call(
        _ op: Operation, query: [String: Value]? = nil, attributes: [String: Value]? = nil,
        arguments: [String: Value] = [:]
    ) async throws(KeychainError) -> Value? {
        var plan = RetryPlan(op: op)
        while true {
            let outcome: Outcome = await withCheckedContinuation { (cont: CheckedContinuation<Outcome, Never>) in
                switch self.start(op, query, attributes, arguments, waiter: .async(cont)) {
                case .failure(let e): cont.resume(returning: .failed(e))
                case .success(.some(let immediate)): cont.resume(returning: immediate)
                case .success(nil): break  // the reader thread resumes it
                }
            }
            if let result = try plan.next(outcome) { return result.value }
        }
    }

    // MARK: Internals

    /// Registers a waiter, connecting first if needed, and writes the request.
    /// Returns `.success(nil)` when the waiter will be resumed by the reader, `.success(outcome)` when
    /// the caller must use `outcome` itself (the write failed, or the link died right after it).
    private func start(
        _ op: Operation, _ query: [String: Value]?, _ attributes: [String: Value]?,
        _ arguments: [String: Value], waiter: Waiter
    ) -> Result<Outcome?, KeychainError> {
        let link: Link
        do throws(KeychainError) { link = try currentLink() } catch { return .failure(error) }

        let id = state.withLock { s -> Int64 in
            let id = s.nextID
            s.nextID += 1
            s.pending[id] = Pending(waiter: waiter, generation: link.generation, sent: false)
            return id
        }
        // In wiping storage: a request may carry an item's secret or a passphrase, and the frame is
        // zeroed once written (when the last reference to it goes, at the end of this call).
        let frame = Frame.encodeSecret(
            Request(
                id: id, op: op.rawValue, query: query, attributes: attributes,
                arguments: arguments
            ).value)
        // The daemon enforces its own maxFrameBytes (1 MiB by default, configurable up to 64 MiB) and
        // answers a larger frame with an error; beyond 64 MiB no daemon would accept it.
        if frame.count - 4 > Self.maxRequestBytes {
            _ = state.withLock { $0.pending.removeValue(forKey: id) }
            return .failure(
                KeychainError(
                    .param,
                    "the request is \(frame.count - 4) bytes; keychaind accepts at most \(Self.maxRequestBytes) bytes per request"
                ))
        }
        let written: KeychainError? = writeLock.withLock {
            do throws(KeychainError) {
                try link.socket.writeAll(frame)
                return nil
            } catch { return error }
        }
        if let error = written {
            // Not delivered (the peer is gone): forget the waiter, drop the link, let the caller retry —
            // unless the daemon said why it stopped reading (it refused this frame): that is the answer.
            let mine = state.withLock { s -> Bool in
                if s.link === link { s.link = nil }
                return s.pending.removeValue(forKey: id) != nil
            }
            link.shutdown()
            // Not mine: the reader already answered (resumed) this waiter, so it must not be
            // answered again here (an async caller's continuation would be resumed twice).
            guard mine else { return .success(nil) }
            if let refusal = link.refusal.withLock({ $0 }) { return .failure(refusal) }
            return .success(.notSent(error))
        }
        // Delivered. If the link died meanwhile, the reader skipped this (unsent) waiter: fail it here.
        let lostHere = state.withLock { s -> Bool in
            guard s.pending[id] != nil else { return false }  // already answered
            if s.link === link {
                s.pending[id]!.sent = true
                return false
            }
            s.pending.removeValue(forKey: id)
            return true
        }
        if lostHere { return .success(.lost(link.refusal.withLock { $0 } ?? link.lostError)) }
        return .success(nil)
    }

    /// The open link, connecting (once, for all concurrent callers) when there is none.
    private func currentLink() throws(KeychainError) -> Link {
        let pid = CurrentProcess.pid
        // A link inherited through fork() belongs to the parent (its reader thread did not come
        // along, and the daemon identified the parent at connect): the child leaves it alone and opens
        // its own, which the daemon identifies as the child.
        if let l = state.withLock({ $0.link }), l.pid == pid { return l }
        return try connectLock.withLock { () throws(KeychainError) -> Link in
            if let l = state.withLock({ $0.link }), l.pid == pid { return l }
            let path = state.withLock { $0.explicitPath } ?? SocketLocation.fromProcessEnvironment()
            let socket: UnixSocket
            do throws(KeychainError) {
                socket = try UnixSocket.connect(to: path)
            } catch {
                throw KeychainError(
                    .notAvailable, error.message + " (is keychaind running? KEYCHAIND_SOCKET overrides the path)")
            }
            let link = state.withLock { s -> Link in
                s.generation += 1
                let l = Link(socket: socket, generation: s.generation, path: path)
                s.link = l
                return l
            }
            do throws(KeychainError) {
                try startThread { [self] in self.readLoop(link) }
            } catch {
                state.withLock { s in if s.link === link { s.link = nil } }
                throw error
            }
            return link
        }
    }

    /// The reader: routes each response to its waiter until the link ends, then fails what was sent on it.
    private func readLoop(_ link: Link) {
        var frames = FrameBuffer(maxBytes: Self.maxResponseBytes)
        var reason = link.lostError
        while true {
            let body: SecretBytes?
            do throws(KeychainError) { body = try link.socket.readFrame(&frames) } catch {
                reason = KeychainError(
                    .notAvailable,
                    "connection to keychaind at \(link.path) failed before the answer arrived (\(error.message)); the request may or may not have been carried out"
                )
                break
            }
            guard let body else { break }
            let response: Response
            do throws(KeychainError) {
                // Secrets go from the wiping frame into wiping storage, never into a plain array.
                response = try Response(
                    CBOR.decode(
                        body, limits: CBOR.Limits(maxDepth: 16, maxCount: 1 << 20), secretKeys: secretResponseKeys))
            } catch {
                reason = KeychainError(
                    .notAvailable, "keychaind at \(link.path) sent an unreadable response (\(error.message))")
                break
            }
            // Request ids start at 1: an error with id 0 is the daemon's answer to a frame it could
            // not tie to a request (oversized, not CBOR), after which it closes the connection.
            // Hand its reason to the requests still waiting instead of a generic one.
            if response.id == 0 && response.status != .success {
                let refusal = KeychainError(response.status, response.message)
                link.refusal.withLock { $0 = refusal }
                reason = refusal
                continue
            }
            let waiter = state.withLock { $0.pending.removeValue(forKey: response.id)?.waiter }
            waiter?.resume(.answered(response))
        }
        let orphans = state.withLock { s -> [Waiter] in
            if s.link === link { s.link = nil }
            var out: [Waiter] = []
            for (id, p) in s.pending where p.generation == link.generation && p.sent {
                out.append(p.waiter)
                s.pending.removeValue(forKey: id)
            }
            return out
        }
        link.shutdown()
        for w in orphans { w.resume(.lost(reason)) }
    }
}

/// One open socket to the daemon and the generation number that tells its waiters apart.
private final class Link: Sendable {
    let socket: UnixSocket
    let generation: Int
    let path: String
    let pid = CurrentProcess.pid
    /// The daemon's error for a frame it could not take (id 0), after which it closes the link.
    let refusal = Locked<KeychainError?>(nil)

    init(socket: UnixSocket, generation: Int, path: String) {
        self.socket = socket
        self.generation = generation
        self.path = path
    }

    var lostError: KeychainError {
        KeychainError(
            .notAvailable,
            "connection to keychaind at \(path) closed before the answer arrived; the request may or may not have been carried out"
        )
    }

    /// Wakes the reader (which owns the close, via the socket's deinit) without racing on the fd number.
    ///
    /// Only in the process that opened the link: after `fork()` the child shares the parent's socket,
    /// and shutting it down would cut the parent's connection. The child just drops its copy (closed
    /// when the link is released) and connects on its own.
    func shutdown() {
        guard pid == CurrentProcess.pid else { return }
        socket.socket.shutdown(.both)
    }
}

/// What happened to one attempt.
enum Outcome: Sendable {
    case answered(Response)
    /// The write failed: the daemon never saw the request.
    case notSent(KeychainError)
    /// Written, but the link died before the answer.
    case lost(KeychainError)
    /// Could not start (no daemon, request too large).
    case failed(KeychainError)
}

/// Decides, attempt by attempt, whether to return, retry or throw.
struct RetryPlan {
    private var sendRetries = 1
    private var replays: Int

    init(op: Operation) {
        switch op {
        case .copy, .status: replays = 1
        default: replays = 0
        }
    }

    struct Done { let value: Value? }

    /// Done (with the result) or nil to try again; throws the call's error.
    mutating func next(_ outcome: Outcome) throws(KeychainError) -> Done? {
        switch outcome {
        case .answered(let r):
            try r.check()
            return Done(value: r.result)
        case .notSent(let e):
            if sendRetries > 0 {
                sendRetries -= 1
                return nil
            }
            throw e
        case .lost(let e):
            if replays > 0 {
                replays -= 1
                return nil
            }
            throw e
        case .failed(let e):
            throw e
        }
    }
}

/// Someone waiting for a response: a blocked thread or a suspended task.
enum Waiter: Sendable {
    case blocking(OneShot<Outcome>)
    case async(CheckedContinuation<Outcome, Never>)

    func resume(_ outcome: Outcome) {
        switch self {
        case .blocking(let slot): slot.resume(outcome)
        case .async(let c): c.resume(returning: outcome)
        }
    }
}

/// Starts the reader thread (a detached POSIX thread: no Foundation, so keychainctl stays light).
func startThread(_ body: @escaping @Sendable () -> Void) throws(KeychainError) {
    do { try Threads.start(stackSize: 256 * 1024, body) } catch {
        throw KeychainError(.allocate, "cannot start the keychaind reader thread", error)
    }
}
