import KeychainCore
import KeychainCrypto
public import KeychainItems
import KeychainSystem
public import KeychainWire
import Synchronization

/// Turns one frame body into one response: decodes the request, finds who is calling, asks the
/// access policy (KeychainItems/AccessPolicy.swift), and calls the item service. Knows no sockets.
public final class RequestHandler: Sendable {
    /// The daemon's version, as the `status` operation and `--version` report it.
    public static let version = "0.1.0"

    private let items: ItemService
    let registrar: Registrar
    private let started = MonotonicClock.now()
    let openConnections = Atomic<Int>(0)
    /// Of those, the connections of programs that were not registered apps when they connected
    /// (limited to a quarter of `maxConnections`: Daemon.admit).
    let unregisteredConnections = Atomic<Int>(0)
    /// Monotonic milliseconds of the last request that counts as activity for auto-lock: a
    /// successful one of an identified app — an item returned, added, updated or deleted, or an
    /// unlock with the right passphrase (never a failing request, never `status`, never an
    /// unidentified peer).
    let lastActivity = Atomic<Int64>(MonotonicClock.milliseconds())
    /// Monotonic milliseconds of the unlock that `maxUnlockedSeconds` counts from: the last unlock
    /// with the right passphrase, or when the auto-lock thread first saw the keychain unlocked
    /// otherwise (a credential at start, the first passphrase set). Daemon+AutoLock.swift.
    let unlockedAt = Atomic<Int64>(MonotonicClock.milliseconds())
    /// Held by an unlock from its passphrase check until `unlockedAt` and `lastActivity` say so, and
    /// by the auto-lock thread while it decides to lock: a right passphrase is never followed by a
    /// lock counted from before it.
    let unlockGate = Lock()
    /// `autoLockSeconds` and `maxUnlockedSeconds`, as `status` reports them (0: off).
    let lockSettings: (autoLock: Int, maxUnlocked: Int)

    /// The largest request frame accepted (`maxFrameBytes`): a backup must fit in a restore request.
    private let maxFrameBytes: Int
    /// Partial frames held across all connections (`maxBufferedBytes`).
    let budget: BufferBudget
    /// What `status` says about the Secret Service while it is served (`secretService`), and the
    /// isolation note that goes with it; nil when it is not served.
    let secretServiceStatus = Locked<(fields: [String: Value], note: String)?>(nil)

    /// The config's `pinentryProgram`, for `status` (keychainctl runs it where it has no terminal).
    let pinentryProgram: String?
    /// The sync service, when `syncFolder` is set (Daemon+Sync.swift).
    let sync = Locked<(any SyncRequests)?>(nil)
    /// The item service, for extensions in other files.
    var itemService: ItemService { items }

    init(
        items: ItemService, registrar: Registrar, maxFrameBytes: Int = Frame.defaultMaxBytes,
        maxBufferedBytes: Int = 64 << 20, lockSettings: (autoLock: Int, maxUnlocked: Int) = (0, 0),
        pinentryProgram: String? = nil
    ) {
        self.pinentryProgram = pinentryProgram
        self.items = items
        self.registrar = registrar
        self.maxFrameBytes = maxFrameBytes
        self.lockSettings = lockSettings
        budget = BufferBudget(limit: maxBufferedBytes)
    }

    /// A handler over a fixed registry (the fuzz target; tests).
    public convenience init(items: ItemService, registry: AppRegistry, maxFrameBytes: Int = Frame.defaultMaxBytes) {
        self.init(items: items, registrar: Registrar(registry: registry, items: items), maxFrameBytes: maxFrameBytes)
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
    func respond(
        frame body: UnsafeRawBufferPointer, peer: ConnectionPeer, memo: CopyMemo?, into output: inout SecretBytes
    ) -> Bool {
        let start = output.count
        var slot: MemoSlot?
        if let memo, let shape = RequestShape.scan(body), shape.op == .copy {
            let query = UnsafeRawBufferPointer(rebasing: body[shape.queryStart...])
            if memoized(query, id: shape.id, memo: memo, peer: peer, into: &output) {
                if output.capacity > AnswerLedger.freeOutputBytes {
                    held(&output, answerFrom: start, id: shape.id, peer: peer)
                }
                return false
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
    private func memoized(
        _ query: UnsafeRawBufferPointer, id: Int64, memo: CopyMemo, peer: ConnectionPeer, into output: inout SecretBytes
    ) -> Bool {
        guard peer.isIdentified(in: registrar) else { return false }
        let token = CopyMemo.Token(
            registryGeneration: peer.generation, passphraseSet: items.hasPassphrase,
            indexGeneration: items.indexGeneration)
        let hash = CopyMemo.hash(query)
        if let compiled = memo.lookup(query, hash: hash, token: token) {
            served(compiled, id, peer: peer, into: &output)
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
            let found: Bool
            if items.lendsData(base) {
                found = answer(id, into: &output) { (place) throws(KeychainError) in
                    try items.withData(of: base, service: service, account: account, into: place)
                }
            } else {
                found = answer(id, into: &output) { () throws(KeychainError) in
                    try items.copy(base, service: service, account: account)
                }
            }
            if found { touch() }
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
        served(compiled, id, peer: peer, into: &output)
        return true
    }

    /// A compiled `copy` run for request `id`: the rows read now, activity counted when it found some.
    private func served(
        _ compiled: ItemService.CompiledCopy, _ id: Int64, peer: ConnectionPeer, into output: inout SecretBytes
    ) {
        let found =
            items.lendsData(compiled)
            ? answer(id, into: &output) { (place) throws(KeychainError) in
                try items.withData(of: compiled, into: place)
            }
            : answer(id, into: &output) { () throws(KeychainError) in try items.copy(compiled, answers: peer.answers) }
        if found { touch() }
    }

    /// The answer to request `id`: `result`'s value, or the error it threw. Returns whether it succeeded.
    @discardableResult
    private func answer(_ id: Int64, into output: inout SecretBytes, _ result: () throws(KeychainError) -> Value?)
        -> Bool
    {
        do {
            Response(id: id, result: try result()).appendFrame(to: &output)
            return true
        } catch {
            Response(id: id, error: error).appendFrame(to: &output)
            return false
        }
    }

    /// The answer to request `id` whose result is one item's data, which `open` opens straight into
    /// its place in the answer's frame; or the error `open` threw. (Whatever was framed before a
    /// throw is taken back and zeroed, so the answer is the error alone.)
    @discardableResult
    private func answer(
        _ id: Int64, into output: inout SecretBytes,
        data open: (ItemService.DataPlacement) throws(KeychainError) -> Void
    ) -> Bool {
        let start = output.count
        do {
            try open { (count, fill) throws(KeychainError) in
                try Response.appendSuccess(id: id, count: count, to: &output, filling: fill)
            }
            return true
        } catch {
            output.removeLast(output.count - start)
            Response(id: id, error: error).appendFrame(to: &output)
            return false
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
        var caller = app.map {
            Caller(applicationIdentifier: $0.applicationIdentifier, accessGroups: $0.accessGroups, isAdmin: $0.admin)
        }
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
                let result = try item(action, request, caller: caller!, answers: peer.answers)
                touch()
                return result
            }
            let token = CopyMemo.Token(
                registryGeneration: peer.generation, passphraseSet: passphraseSet,
                indexGeneration: items.indexGeneration)
            let result = try item(action, request, caller: caller!, answers: peer.answers) { compiled in
                slot.memo.store(slot.query, token: token, compiled: compiled)
                if let template = QueryTemplate.scan(slot.query) {
                    slot.memo.store(
                        template: template.key, queryCount: slot.query.count, token: token, compiled: compiled,
                        markers: template.markers)
                }
            }
            touch()
            return result
        case .add, .update, .delete:
            let result = try item(action, request, caller: caller!, answers: peer.answers)
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

    /// Restarts the auto-lock idle clock.
    private func touch() {
        // Written only when the millisecond changed: every connection shares this counter, and a
        // write on each request would pass its cache line between CPUs for nothing.
        let now = MonotonicClock.milliseconds()
        if lastActivity.load(ordering: .relaxed) != now { lastActivity.store(now, ordering: .relaxed) }
    }

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

    private func requiredPresence(_ args: Arguments, _ action: Operation) throws(KeychainError) -> SecureBytes {
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
        compiled remember: ((ItemService.CompiledCopy) -> Void)? = nil
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
            return try items.copy(compiled, answers: answers)
        case .delete:
            guard request.attributes == nil else { throw .param("op \"delete\" takes no \"attributes\"") }
            try items.delete(query, caller: caller)
            return nil
        default:
            guard let attributes = request.attributes else { throw .param("op \"update\" needs an \"attributes\" map") }
            try items.update(query, attributes: attributes, caller: caller)
            return nil
        }
    }

    /// Unlocks with `passphrase` (a request's, or one typed at a passphrase prompt): a right one
    /// starts `maxUnlockedSeconds` again and makes the approved registrations readable.
    func unlock(passphrase: SecureBytes, by: String) throws(KeychainError) {
        let wasLocked = items.isLocked
        do {
            // A right passphrase starts `maxUnlockedSeconds` again (Daemon+AutoLock.swift).
            try unlockGate.withLock { () throws(KeychainError) in
                try items.unlock(passphrase: passphrase)
                unlockedAt.store(MonotonicClock.milliseconds(), ordering: .relaxed)
                touch()
            }
        } catch {
            Log.warning("unlock refused", [("by", by), ("failures", String(items.protectionStatus.failedUnlocks))])
            throw error
        }
        Log.info("keychain unlocked", [("by", by)])
        // The approved registrations are sealed under the passphrase: readable from now on.
        if wasLocked { registrar.reload("unlock") }
    }

    // MARK: Admin operations (docs/protocol.md §11)

    private func admin(_ action: Operation, _ args: Arguments, caller: Caller) throws(KeychainError) -> Value? {
        switch action {
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
            try unlock(passphrase: passphrase, by: "request")
            return nil
        case .passwd:
            try args.expect(["old", "new", "approve"])
            let old = try args.secret("old", required: false)
            let new = try args.secret("new", required: true)
            let hadPassphrase = items.hasPassphrase
            // Setting the first passphrase approves exactly the registrations the request names, each
            // as the admin was shown it, and nothing else: until now any process of the user could
            // write (and, through the admin tool, approve) a registration. [] replaces any list stored
            // without a passphrase.
            let named = try registrationsToApprove(args.values["approve"])
            if hadPassphrase && !named.isEmpty {
                throw .param(
                    "\"approve\" goes with setting the first passphrase only; a passphrase is set: approve registrations with op \"approve\""
                )
            }
            let approving = hadPassphrase || new == nil ? nil : named
            let removed: Int
            do { removed = try items.changePassphrase(old: old, new: new, approving: approving) } catch {
                if error.status == .authFailed { Log.warning("passphrase change refused") }
                throw error
            }
            registrar.reload("passwd")
            // The first passphrase makes an open keychain lockable: `maxUnlockedSeconds` counts from here.
            if !hadPassphrase { unlockedAt.store(MonotonicClock.milliseconds(), ordering: .relaxed) }
            if new == nil {
                if hadPassphrase {
                    Log.write(.notice, "passphrase removed: akpu items destroyed", [("items", String(removed))])
                }
                return nil
            }
            Log.write(.notice, hadPassphrase ? "passphrase changed" : "passphrase set")
            guard !hadPassphrase else { return nil }
            return .map(["approved": .array((approving ?? []).map { .text($0.applicationIdentifier) })])
        case .backup:
            try args.expect(["passphrase", Arguments.presenceKey])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                throw KeychainError(.param, "the backup passphrase must not be empty")
            }
            let file = try items.backup(passphrase: passphrase)
            // A backup that no restore request could carry would look like a backup and be useless.
            guard file.count + 1024 <= maxFrameBytes else {
                throw KeychainError(
                    .allocate,
                    "the backup would be \(file.count) bytes, more than a restore request may carry (maxFrameBytes \(maxFrameBytes)); raise maxFrameBytes in keychaind.json (up to 67108864) here and where you restore"
                )
            }
            Log.info("backup made", [("bytes", String(file.count)), ("by", caller.applicationIdentifier)])
            return .bytes(file)
        case .restore:
            try args.expect(["passphrase", "data", Arguments.presenceKey])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                throw KeychainError(.authFailed, "the backup passphrase is empty")
            }
            guard case .bytes(let data)? = args.values["data"] else {
                throw .param("op \"restore\" needs \"data\" (bytes: the backup file's content)")
            }
            let counts = try items.restore(passphrase: passphrase, data: data)
            Log.info("backup restored", [("restored", String(counts.restored)), ("skipped", String(counts.skipped))])
            return .map(["restored": .int(Int64(counts.restored)), "skipped": .int(Int64(counts.skipped))])
        case .approve:
            try args.expect(["file", "expect", "preview", Arguments.presenceKey])
            guard case .text(let name)? = args.values["file"] else {
                throw .param(
                    "op \"approve\" needs \"file\": the name of a *.json file in \(registrar.userAppsDirectory)")
            }
            let entry = try readForApproval(name)
            // What the file says now, shown before the passphrase is asked for (`preview`) and
            // compared with what the admin saw (`expect`): the file is the user's, so any process of
            // the user may rewrite it between the admin's look and this read.
            let registration = Self.registrationValue(entry)
            if case .bool(true)? = args.values["preview"] {
                return .map(["file": .text(entry.file), "registration": registration])
            }
            if let expected = args.values["expect"], !Self.matches(expected, entry) {
                throw KeychainError(
                    .param,
                    "cannot approve \(name): it changed since it was read for approval (it now says \(Self.describe(entry))); nothing was approved — look at the file and approve it again"
                )
            }
            let presence = items.hasPassphrase ? try requiredPresence(args, action) : nil
            var list = try approvals()
            list.removeAll { $0.applicationIdentifier.utf8.elementsEqual(entry.applicationIdentifier.utf8) }
            list.append(Registrar.approval(entry))
            try items.setApprovedRegistrations(list, passphrase: presence)
            registrar.reload("approve")
            Log.write(
                .notice, "registration approved",
                [
                    ("file", entry.file), ("app", entry.applicationIdentifier),
                    ("admin", String(entry.admin)), ("by", caller.applicationIdentifier),
                ])
            return .map([
                "approved": .text(entry.applicationIdentifier), "file": .text(entry.file), "registration": registration,
            ])
        case .revoke:
            try args.expect(["application-identifier", Arguments.presenceKey])
            guard case .text(let id)? = args.values["application-identifier"], !id.isEmpty else {
                throw .param("op \"revoke\" needs \"application-identifier\" (text)")
            }
            let presence = items.hasPassphrase ? try requiredPresence(args, action) : nil
            var list = try approvals()
            let before = list.count
            list.removeAll { $0.applicationIdentifier.utf8.elementsEqual(id.utf8) }
            guard list.count < before else {
                throw KeychainError(.itemNotFound, "no approved registration has that application-identifier")
            }
            try items.setApprovedRegistrations(list, passphrase: presence)
            registrar.reload("revoke")
            Log.write(.notice, "approval revoked", [("app", id), ("by", caller.applicationIdentifier)])
            return nil
        default:
            throw .param("op \"\(action.rawValue)\" is not an admin operation")
        }
    }

    /// The registration file `name` of the user's apps.d as it is now, refused when it cannot be
    /// approved (not a plain *.json name, unreadable, or an executable the user can modify).
    private func readForApproval(_ name: String) throws(KeychainError) -> AppEntry {
        guard !name.isEmpty, !name.contains("/"), name.hasSuffix(".json"), !name.hasPrefix(".") else {
            throw .param(
                "cannot approve \"\(Arguments.printable(name))\": not the name of a *.json file in \(registrar.userAppsDirectory)"
            )
        }
        let entry: AppEntry
        do { entry = try AppFiles.parse(file: registrar.userAppsDirectory + "/" + name) } catch {
            throw KeychainError(.param, "cannot approve: \(error)")
        }
        let principal = TrustedPaths.Principal.current()
        if principal.uid != 0 {
            for exe in entry.executables {
                if let problem = TrustedPaths.modifiableProblem(exe, by: principal) {
                    throw KeychainError(
                        .param,
                        "cannot approve \(name): executable \(exe) can be modified by this user (\(problem)); install it root-owned (for example under /usr/local/bin) and register that path"
                    )
                }
            }
        }
        return entry
    }

    /// `passwd`'s "approve": a list of {"file": name in the user's apps.d, "expect": the registration
    /// as the admin was shown it}. Each file must say exactly what was shown (as for `approve`), or
    /// nothing is changed. Later entries for one application-identifier replace earlier ones.
    private func registrationsToApprove(_ value: Value?) throws(KeychainError) -> [ApprovedRegistration] {
        guard let value else { return [] }
        let usage =
            "\"approve\" must be a list of maps {\"file\": a *.json name in \(registrar.userAppsDirectory), \"expect\": the registration as shown}"
        guard case .array(let requested) = value else { throw .param(usage) }
        var list: [ApprovedRegistration] = []
        for item in requested {
            guard case .map(let m) = item, m.count == 2, case .text(let name)? = m["file"], let expected = m["expect"]
            else { throw .param(usage) }
            let entry = try readForApproval(name)
            guard Self.matches(expected, entry) else {
                throw KeychainError(
                    .param,
                    "cannot approve \(name): it changed since it was shown (it now says \(Self.describe(entry))); nothing was changed — look at the file and try again"
                )
            }
            list.removeAll { $0.applicationIdentifier.utf8.elementsEqual(entry.applicationIdentifier.utf8) }
            list.append(Registrar.approval(entry))
        }
        return list
    }

    private func approvals() throws(KeychainError) -> [ApprovedRegistration] {
        guard let list = try items.approvedRegistrations() else {
            throw KeychainError(
                .interactionNotAllowed, "the keychain has not been unlocked since keychaind started: unlock it first")
        }
        return list
    }

    /// The top-level keys of a request besides the envelope.
    private struct Arguments {
        /// The keychain passphrase an administrator sends to prove the user's presence.
        static let presenceKey = "keychainPassphrase"

        let values: [String: Value]
        init(_ values: [String: Value]) { self.values = values }

        func expect(_ known: [String]) throws(KeychainError) {
            for key in values.keys where !known.contains(key) {
                throw .param(
                    "unknown request key \"\(Self.printable(key))\" for this op (known: \(known.isEmpty ? "none" : known.joined(separator: ", ")))"
                )
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
            case .secret(let s)?:
                return try s.withUnsafeBytes { (b) throws(KeychainError) in try PasswordHash.passphrase(b) }
            case let other?:
                throw .param("\"\(key)\" must be bytes, not \(other.kindName)")
            }
        }

        /// Zeroes the passphrase bytes of the decoded request in place (shared storage included).
        func wipe() {
            for key in ["passphrase", "old", "new", Self.presenceKey] {
                if case .bytes(let b)? = values[key] { Sodium.wipeShared(b) }
            }
        }

        static func printable(_ key: String) -> String {
            String(
                key.unicodeScalars.prefix(32).map {
                    $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?"
                })
        }
    }

    // MARK: status

    private func status(app: AppEntry?, identified: Result<AppEntry, KeychainIdentityError>) throws(KeychainError)
        -> Value
    {
        // Only what the caller may see: all items for an admin, its groups' items for an app, and no
        // count at all for an unregistered executable.
        let count =
            try app.map { (a) throws(KeychainError) in
                try items.itemCount(visibleTo: Caller(accessGroups: a.accessGroups, isAdmin: a.admin))
            } ?? 0
        let protection = items.protectionStatus
        let bus = secretServiceStatus.withLock { $0 }
        var result: [String: Value] = [
            "version": .text(Self.version),
            "locked": .bool(protection.locked),
            "passphraseSet": .bool(protection.passphraseSet),
            "failedUnlocks": .int(Int64(protection.failedUnlocks)),
            "unlockDelay": .float(protection.unlockDelay),
            "items": .int(Int64(count)),
            "uptime": .float(MonotonicClock.now() - started),
            // The auto-lock idle clock: seconds since the last request that counts as activity.
            "idleSeconds": .float(Double(MonotonicClock.milliseconds() - lastActivity.load(ordering: .relaxed)) / 1000),
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
                extraNotes: bus.map { [$0.note] } ?? []),
        ]
        if let bus { result["secretService"] = .map(bus.fields) }
        if protection.passphraseSet && !protection.locked {
            // What `maxUnlockedSeconds` counts: seconds since the unlock.
            let since = MonotonicClock.milliseconds() - unlockedAt.load(ordering: .relaxed)
            result["unlockedSeconds"] = .float(Double(max(0, since)) / 1000)
        }
        if case .failure(let why) = identified { result["unidentified"] = .text(why.message) }
        return .map(result)
    }
}

extension RequestHandler {
    /// A registration as `approve` shows it and compares it: the four keys of an apps.d file.
    static func registrationValue(_ entry: AppEntry) -> Value {
        .map([
            "application-identifier": .text(entry.applicationIdentifier),
            "keychain-access-groups": .array(entry.accessGroups.map(Value.text)),
            "executables": .array(entry.executables.map(Value.text)),
            "admin": .bool(entry.admin),
        ])
    }

    /// Whether `expected` is `registrationValue(entry)`, its text compared byte for byte (as
    /// approvals are): two spellings of one path that Unicode calls equal may be two files.
    static func matches(_ expected: Value, _ entry: AppEntry) -> Bool {
        guard case .map(let m) = expected, m.count == 4, case .bool(let admin)? = m["admin"], admin == entry.admin,
            case .text(let id)? = m["application-identifier"], id.utf8.elementsEqual(entry.applicationIdentifier.utf8)
        else { return false }
        func same(_ key: String, _ list: [String]) -> Bool {
            guard case .array(let values)? = m[key], values.count == list.count else { return false }
            return zip(values, list).allSatisfy { v, s in
                if case .text(let t) = v { return t.utf8.elementsEqual(s.utf8) }
                return false
            }
        }
        return same("keychain-access-groups", entry.accessGroups) && same("executables", entry.executables)
    }

    /// The same registration in one line, for a refusal's message.
    static func describe(_ entry: AppEntry) -> String {
        "application-identifier \(entry.applicationIdentifier), groups \(entry.accessGroups.joined(separator: ", ")), executables \(entry.executables.joined(separator: ", ")), admin \(entry.admin ? "yes" : "no")"
    }
}
