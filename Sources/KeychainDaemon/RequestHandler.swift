import KeychainCore
import KeychainCrypto
public import KeychainItems
import KeychainPrompt
public import KeychainRequests
import KeychainSystem
public import KeychainWire
import Synchronization

/// The socket's adapter over the request core (KeychainRequests/RequestCore.swift): turns one frame
/// body into one response — decodes the request, finds who is calling (cached per connection),
/// asks the access policy (KeychainItems/AccessPolicy.swift), and calls the item service. Knows no
/// sockets. Admin verbs: AdminOperations.swift; approvals: Approvals.swift; status: StatusReport.swift.
public final class RequestHandler: Sendable {
    let items: ItemService
    let registrar: Registrar
    let started = MonotonicClock.now()
    let openConnections = Atomic<Int>(0)
    /// Of those, the connections of programs that were not registered apps when they connected
    /// (limited to a quarter of `maxConnections`: Daemon.admit).
    let unregisteredConnections = Atomic<Int>(0)
    /// The transport-neutral path this handler adapts the socket to (identification, activity,
    /// the unlock gate, the other transports' status).
    let core: RequestCore
    /// Monotonic milliseconds of the unlock that `maxUnlockedSeconds` counts from: the last unlock
    /// with the right passphrase, or when the auto-lock thread first saw the keychain unlocked
    /// otherwise (a credential at start, the first passphrase set). Daemon+AutoLock.swift.
    let unlockedAt = Atomic<Int64>(MonotonicClock.milliseconds())
    /// `autoLockSeconds` and `maxUnlockedSeconds`, as `status` reports them (0: off).
    let lockSettings: (autoLock: Int, maxUnlocked: Int)

    /// The largest request frame accepted (`maxFrameBytes`): a backup must fit in a restore request.
    let maxFrameBytes: Int
    /// Partial frames held across all connections (`maxBufferedBytes`).
    let budget: BufferBudget

    /// The config's `pinentryProgram`, for `status` (keychainctl runs it where it has no terminal).
    let pinentryProgram: String?
    /// The sync service, when `syncFolder` is set (Daemon+Sync.swift).
    let sync = Locked<(any SyncRequests)?>(nil)
    /// The item service, for extensions in other files.
    var itemService: ItemService { items }
    /// The passphrase prompt a SecItem call on a locked keychain shows (RequestHandler+Prompt.swift),
    /// made when one is needed; nil: nobody is asked (the fuzz target, tests over a fixed registry).
    let makePrompter: (@Sendable () -> Prompter)?
    /// How an item that needs the person is confirmed, and the reuse window's confirmations
    /// (RequestHandler+Presence.swift).
    let presence: PresenceSettings
    let presenceWindow = PresenceWindow()

    init(
        core: RequestCore, registrar: Registrar, maxFrameBytes: Int = Frame.defaultMaxBytes,
        maxBufferedBytes: Int = 64 << 20, lockSettings: (autoLock: Int, maxUnlocked: Int) = (0, 0),
        pinentryProgram: String? = nil, prompter: (@Sendable () -> Prompter)? = nil,
        presence: PresenceSettings = PresenceSettings()
    ) {
        self.presence = presence
        self.pinentryProgram = pinentryProgram
        makePrompter = prompter
        self.core = core
        items = core.items
        self.registrar = registrar
        self.maxFrameBytes = maxFrameBytes
        self.lockSettings = lockSettings
        budget = BufferBudget(limit: maxBufferedBytes)
    }

    /// A handler over a fixed registry (the fuzz target; tests).
    public convenience init(items: ItemService, registry: AppRegistry, maxFrameBytes: Int = Frame.defaultMaxBytes) {
        let registrar = Registrar(registry: registry, items: items)
        self.init(
            core: RequestCore(items: items, directory: RegistryDirectory(registrar: registrar, watcher: nil)),
            registrar: registrar, maxFrameBytes: maxFrameBytes)
    }

    /// What to send back, and whether the connection must close after it (the bytes were not a
    /// CBOR map, so the stream can no longer be trusted).
    public struct Outcome {
        /// The response to send back.
        public var response: Response
        /// Whether to close the connection once the response is sent.
        public var closeAfter: Bool
    }

    /// One request from a peer identified afresh (the fuzz target; connections use a `ConnectionPeer`).
    public func handle(frame body: [UInt8], peer: PeerIdentity) -> Outcome {
        outcome(of: body, peer: ConnectionPeer(peer), memo: nil)
    }

    /// A client's state across requests as its connection keeps it: the identification and the memo
    /// of compiled copies. For the fuzz target, which must reach the memo path as real clients do.
    public final class Session {
        let peer: ConnectionPeer
        let memo = CopyMemo()

        /// A session for a peer identified as `identity` (identified again in each registry generation).
        public init(_ identity: PeerIdentity) { peer = ConnectionPeer(identity) }
    }

    /// One request within `session`, served as its connection would serve it (the memo included).
    public func handle(frame body: [UInt8], session: Session) -> Outcome {
        outcome(of: body, peer: session.peer, memo: session.memo)
    }

    /// `respond` for a frame body given as an array, its answer read back from the frame written:
    /// the bytes a connection would send, as a `Response`.
    private func outcome(of body: [UInt8], peer: ConnectionPeer, memo: CopyMemo?) -> Outcome {
        let request = SecretBytes(body)
        var output = SecretBytes()
        let closeAfter = request.withUnsafeBytes { respond(frame: $0, peer: peer, memo: memo, into: &output) }
        let response = output.withUnsafeBytes { (frame) -> Response in
            guard frame.count >= 4, let value = try? CBOR.decode(UnsafeRawBufferPointer(rebasing: frame[4...])),
                let decoded = try? Response(value)
            else { return Response(id: 0, error: KeychainError(.internal, "the daemon framed an unreadable answer")) }
            return decoded
        }
        return Outcome(response: response, closeAfter: closeAfter)
    }

    /// Where a request of the common shape may leave its compiled `copy` query: the connection's
    /// memo and the `query` bytes within the frame body. It lives only as long as the request's
    /// handling, inside the scope that lends the frame body (`respond(frame:peer:memo:into:)`).
    struct MemoSlot {
        let memo: CopyMemo
        let query: UnsafeRawBufferPointer
    }

    /// One request of a connection, its frame body lent where it lies (the connection's frame buffer,
    /// which wipes it afterwards; no copy is made), its answer framed onto `output`. Returns whether
    /// the connection must close after the answer. With a `memo`, a `copy` of the common request
    /// shape whose `query` bytes were served before on this connection (same caller, same passphrase
    /// state) skips decoding, parsing and the policy decision (CopyMemo.swift); when it returns one
    /// item's data alone, that data is opened into a buffer on the stack and framed from there.
    @inline(__always)
    func respond(
        frame body: UnsafeRawBufferPointer, peer: ConnectionPeer, memo: CopyMemo?, into output: inout SecretBytes
    ) -> Bool {
        let start = output.count
        var slot: MemoSlot?
        if let memo, let shape = RequestShape.scan(body), shape.op == .copy {
            let query = UnsafeRawBufferPointer(rebasing: body[shape.queryStart...])
            var failure: KeychainError?
            if memoized(query, id: shape.id, memo: memo, peer: peer, into: &output, failure: &failure) {
                if failure?.status == .interactionNotAllowed && makePrompter != nil {
                    // The keychain is locked: the full path may ask the person (RequestHandler+Prompt.swift).
                    output.removeLast(output.count - start)
                } else {
                    if output.capacity > AnswerLedger.freeOutputBytes {
                        held(&output, answerFrom: start, id: shape.id, peer: peer)
                    }
                    return false
                }
            }
            slot = MemoSlot(memo: memo, query: query)
        }
        let outcome = decodeAndServe(body, peer: peer, slot: slot)
        outcome.response.appendFrame(to: &output)
        if output.capacity > AnswerLedger.freeOutputBytes {
            held(&output, answerFrom: start, id: outcome.response.id, peer: peer)
        }
        return outcome.closeAfter
    }

    /// Counts `output`, grown past its free bytes, against the daemon's budget until the connection
    /// writes it (`AnswerLedger.holdOutput`). Past the budget, the answer to request `id` (from
    /// `start` on) is taken back, the buffer shrunk to what it held before, and errSecAllocate framed
    /// in its place: the connection and every other client go on.
    @inline(never)
    private func held(_ output: inout SecretBytes, answerFrom start: Int, id: Int64, peer: ConnectionPeer) {
        guard let answers = peer.answers, !answers.holdOutput(capacity: output.capacity) else { return }
        HeapMemory.freed(output.capacity)
        output = output.withUnsafeBytes { (all) -> SecretBytes in
            var kept = SecretBytes(capacity: Swift.max(start, 4 * 1024))
            kept.append(contentsOf: UnsafeRawBufferPointer(rebasing: all[..<start]))
            return kept
        }
        Response(id: id, error: answers.outputRefusal).appendFrame(to: &output)
        // No larger than the buffer counted before this answer: always within the budget.
        _ = answers.holdOutput(capacity: output.capacity)
    }

    /// The full path: the frame body decoded, the request parsed, decided and served.
    private func decodeAndServe(_ body: UnsafeRawBufferPointer, peer: ConnectionPeer, slot: MemoSlot?) -> Outcome {
        let value: Value
        do { value = try CBOR.decode(body, secretKeys: secretRequestKeys) } catch {
            return Outcome(
                response: Response(id: 0, error: KeychainError(.param, "request is not valid CBOR: \(error.message)")),
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
            let result = try serve(request, peer: peer, slot: slot)
            return Outcome(response: Response(id: request.id, result: result), closeAfter: false)
        } catch {
            return Outcome(response: Response(id: request.id, error: error), closeAfter: false)
        }
    }

    /// A `copy` served from the memo, its answer framed onto `output`; false (nothing written) when
    /// its query is not there (or the entry is stale).
    /// Everything the full path does per request still happens: the peer is identified in the current
    /// registry generation, activity is counted, and the rows are read and opened now.
    ///
    /// A query the memo does not hold but whose template it does (the same query but for the service
    /// and account, both text) is served from the template's entry: its two values read as the
    /// decoder reads text. A key-only point lookup (`ItemService.copiesInPlace`) is run for them in
    /// place, its digests hashed from the request's bytes (`ItemService.copy(_:service:account:)`),
    /// unless the memo is to keep this query (`CopyMemo.noteRecompiled`: the second time its bytes
    /// come so); any other, and that one, is compiled from the template's (`ItemService.recompile`:
    /// the filters and digests made again) and the compiled query kept. When a value is not valid
    /// UTF-8 the request takes the full path, which answers with the error.
    @inline(__always)
    private func memoized(
        _ query: UnsafeRawBufferPointer, id: Int64, memo: CopyMemo, peer: ConnectionPeer,
        into output: inout SecretBytes,
        failure: inout KeychainError?
    ) -> Bool {
        guard peer.isIdentified(in: registrar) else { return false }
        let token = CopyMemo.Token(
            registryGeneration: peer.generation, passphraseSet: items.hasPassphrase,
            indexGeneration: items.indexGeneration)
        let hash = CopyMemo.hash(query)
        if let compiled = memo.lookup(query, hash: hash, token: token) {
            failure = served(compiled, id, peer: peer, into: &output)
            return true
        }
        var serviceRange = 0..<0
        var accountRange = 0..<0
        guard
            let base = memo.lookup(templateOf: query, token: token, service: &serviceRange, account: &accountRange)
        else { return false }
        let service = UnsafeRawBufferPointer(rebasing: query[serviceRange])
        let account = UnsafeRawBufferPointer(rebasing: query[accountRange])
        guard CBOR.isText(service), CBOR.isText(account) else { return false }
        if items.copiesInPlace(base) && !memo.noteRecompiled(query, hash: hash) {
            if items.lendsData(base) {
                failure = answer(id, into: &output) { (place) throws(KeychainError) in
                    try items.withData(of: base, service: service, account: account, into: place)
                }
            } else {
                failure = answer(id, into: &output) { () throws(KeychainError) in
                    try items.copy(base, service: service, account: account)
                }
            }
            if failure == nil { touch() }
            return true
        }
        guard let serviceText = CBOR.text(service), let accountText = CBOR.text(account),
            let compiled = try? items.recompile(base, service: serviceText, account: accountText)
        else { return false }
        if items.copiesInPlace(base) {
            // noteRecompiled said to keep it.
            memo.store(query, hash: hash, token: token, compiled: compiled)
        } else {
            memo.storeRecompiled(query, token: token, compiled: compiled)
        }
        failure = served(compiled, id, peer: peer, into: &output)
        return true
    }

    /// A compiled `copy` run for request `id`: the rows read now, activity counted when it found some.
    /// Returns the error answered, or nil.
    @inline(__always)
    private func served(
        _ compiled: ItemService.CompiledCopy, _ id: Int64, peer: ConnectionPeer, into output: inout SecretBytes
    ) -> KeychainError? {
        let failure =
            items.lendsData(compiled)
            ? answer(id, into: &output) { (place) throws(KeychainError) in
                try items.withData(of: compiled, into: place)
            }
            : answer(id, into: &output) { () throws(KeychainError) in try items.copy(compiled, answers: peer.answers) }
        if failure == nil { touch() }
        return failure
    }

    /// The answer to request `id`: `result`'s value, or the error it threw. Returns that error, or
    /// nil when it succeeded.
    @discardableResult
    private func answer(_ id: Int64, into output: inout SecretBytes, _ result: () throws(KeychainError) -> Value?)
        -> KeychainError?
    {
        do {
            Response(id: id, result: try result()).appendFrame(to: &output)
            return nil
        } catch {
            Response(id: id, error: error).appendFrame(to: &output)
            return error
        }
    }

    /// The answer to request `id` whose result is one item's data, which `open` opens straight into
    /// its place in the answer's frame; or the error `open` threw. (Whatever was framed before a
    /// throw is taken back and zeroed, so the answer is the error alone.)
    @discardableResult
    private func answer(
        _ id: Int64, into output: inout SecretBytes,
        data open: (ItemService.DataPlacement) throws(KeychainError) -> Void
    ) -> KeychainError? {
        let start = output.count
        do {
            try open { (count, fill) throws(KeychainError) in
                try Response.appendSuccess(id: id, count: count, to: &output, filling: fill)
            }
            return nil
        } catch {
            output.removeLast(output.count - start)
            Response(id: id, error: error).appendFrame(to: &output)
            return error
        }
    }

    private func serve(_ request: Request, peer: ConnectionPeer, slot: MemoSlot? = nil) throws(KeychainError) -> Value?
    {
        guard let action = Operation(rawValue: request.op) else {
            throw .param(
                "unknown op \"\(request.op)\" (known: \(Operation.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        // Secrets in the request's arguments are copied into guarded memory when used and the
        // decoded request's copies wiped, whatever happens (wrong type, unknown key, refusal).
        let args = Arguments(request.arguments)
        defer { args.wipe() }
        let identified = peer.app(in: registrar)
        let app = try? identified.get()
        var caller = app.map(RequestCore.caller(for:))
        var unidentified = ("", Status.missingEntitlement)
        if case .failure(let e) = identified { unidentified = (e.message, e.status) }
        let passphraseSet = items.hasPassphrase
        switch AccessPolicy.decide(
            action, caller: caller, unidentified: unidentified.0, unidentifiedStatus: unidentified.1,
            passphraseSet: passphraseSet)
        {
        case .deny(let error):
            throw error
        case .allowWithPresence:
            // Admin ops on the whole keychain: the keychain passphrase in this very request.
            // approve/revoke hand it to the item service, which checks it as it writes.
            if action != .approve && action != .revoke {
                try items.verifyPresence(passphrase: try requiredPresence(args, action))
            }
        case .allow:
            break
        }
        if action.isItemOperation, let c = caller {
            caller = try withPresence(c, args, passphraseSet: passphraseSet)
        }
        // Item requests count as activity for auto-lock once they succeed (a failing one, such as a
        // lookup of an item that does not exist, must not keep the keychain unlocked).
        switch action {
        case .copy:
            guard let slot else {
                let result = try askingForPresence(action, query: request.query, app: app, caller: caller) {
                    (grant) throws(KeychainError) in
                    try askingToUnlock(action, query: request.query, app: app) { () throws(KeychainError) in
                        try item(action, request, caller: caller!, answers: peer.answers, presence: grant)
                    }
                }
                touch()
                return result
            }
            let token = CopyMemo.Token(
                registryGeneration: peer.generation, passphraseSet: passphraseSet,
                indexGeneration: items.indexGeneration)
            let result = try askingForPresence(action, query: request.query, app: app, caller: caller) {
                (grant) throws(KeychainError) in
                try askingToUnlock(action, query: request.query, app: app) { () throws(KeychainError) in
                    try item(action, request, caller: caller!, answers: peer.answers, presence: grant) { compiled in
                        slot.memo.store(slot.query, token: token, compiled: compiled)
                        if let template = QueryTemplate.scan(slot.query) {
                            slot.memo.store(
                                template: template.key, queryCount: slot.query.count, token: token,
                                compiled: compiled, markers: template.markers)
                        }
                    }
                }
            }
            touch()
            return result
        case .add, .update, .delete:
            let result = try askingForPresence(action, query: request.query, app: app, caller: caller) {
                (grant) throws(KeychainError) in
                try askingToUnlock(action, query: request.query, app: app) { () throws(KeychainError) in
                    try item(action, request, caller: caller!, answers: peer.answers, presence: grant)
                }
            }
            touch()
            return result
        case .status:
            return try status(app: app, identified: identified)
        case .lock, .unlock, .passwd, .backup, .restore, .approve, .revoke:
            return try admin(action, args, caller: caller!)
        case .sync:
            return try sync(args.values)
        }
    }

    /// Restarts the auto-lock idle clock (RequestCore.noteActivity, inlined).
    @inline(__always) func touch() { core.noteActivity() }

    /// An admin item request that carries the keychain passphrase proves presence (checked here,
    /// counted like an unlock attempt); without one it acts on its own groups only. Nothing to prove
    /// without a passphrase set.
    private func withPresence(_ caller: Caller, _ args: Arguments, passphraseSet: Bool) throws(KeychainError) -> Caller
    {
        var c = caller
        let offered = try args.secret(Arguments.presenceKey, required: false)
        if offered != nil && !caller.isAdmin {
            throw .param("\"\(Arguments.presenceKey)\" is for admin apps; this caller is not one")
        }
        guard passphraseSet else { return c }
        c.hasPresence = false
        if let offered {
            try items.verifyPresence(passphrase: offered)
            c.hasPresence = true
        }
        return c
    }

    func requiredPresence(_ args: Arguments, _ action: Operation) throws(KeychainError) -> SecureBytes {
        guard let p = try args.secret(Arguments.presenceKey, required: false) else {
            throw KeychainError.passphraseNeeded(
                "op \"\(action.rawValue)\" needs the keychain passphrase (\"\(Arguments.presenceKey)\"): an administrator proves the user's presence while a passphrase is set"
            )
        }
        return p
    }

    // MARK: SecItem calls

    private func item(
        _ action: Operation, _ request: Request, caller: Caller, answers: AnswerLedger?,
        presence: PresenceGrant? = nil, compiled remember: ((ItemService.CompiledCopy) -> Void)? = nil
    ) throws(KeychainError) -> Value? {
        let op = action.rawValue
        for key in request.arguments.keys where key != Arguments.presenceKey {
            throw .param("unknown request key \"\(Arguments.printable(key))\" for op \"\(op)\"")
        }
        guard let query = request.query else { throw .param("op \"\(op)\" needs a \"query\" map") }
        switch action {
        case .add:
            guard request.attributes == nil else {
                throw .param("op \"add\" takes no \"attributes\"; put them in \"query\"")
            }
            return try items.add(query, caller: caller)
        case .copy:
            guard request.attributes == nil else { throw .param("op \"copy\" takes no \"attributes\"") }
            let compiled = try items.compileCopy(query, caller: caller)
            remember?(compiled)
            return try items.copy(compiled, answers: answers, presence: presence)
        case .delete:
            guard request.attributes == nil else { throw .param("op \"delete\" takes no \"attributes\"") }
            try items.delete(query, caller: caller)
            return nil
        default:
            guard let attributes = request.attributes else { throw .param("op \"update\" needs an \"attributes\" map") }
            try items.update(query, attributes: attributes, caller: caller, presence: presence)
            return nil
        }
    }

}
