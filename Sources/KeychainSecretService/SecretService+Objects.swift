import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainPrompt
import KeychainRequests
import KeychainSystem

/// The objects of the Secret Service API as one caller sees them, and their methods and properties.
extension SecretService {
    static let serviceInterface = "org.freedesktop.Secret.Service"
    static let collectionInterface = "org.freedesktop.Secret.Collection"
    static let itemInterface = "org.freedesktop.Secret.Item"
    static let sessionInterface = "org.freedesktop.Secret.Session"
    static let promptInterface = "org.freedesktop.Secret.Prompt"
    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    static let introspectableInterface = "org.freedesktop.DBus.Introspectable"
    static let noPrompt = "/"

    /// What a path names for this caller.
    enum Object {
        case service
        case collection(Collection)
        /// An item path; whether the item exists is checked by each call.
        case item(Collection, id: [UInt8])
        /// An item of another group that this connection's search listed (SecretService+Foreign.swift).
        case foreignItem(String, id: [UInt8])
        case session(String)
        case prompt(String)

        var interface: String {
            switch self {
            case .service: return SecretService.serviceInterface
            case .collection: return SecretService.collectionInterface
            case .item, .foreignItem: return SecretService.itemInterface
            case .session: return SecretService.sessionInterface
            case .prompt: return SecretService.promptInterface
            }
        }
    }

    /// Resolves a path in the caller's view: its collections (and the `default` alias), items below
    /// them, and its own sessions and prompts. Anything else is UnknownObject.
    func resolve(_ path: String, _ known: BusCaller) throws(BusError) -> Object {
        if path == Self.root { return .service }
        guard path.hasPrefix(Self.root + "/") else { throw .unknownObject(path) }
        let parts = path.dropFirst(Self.root.count + 1).split(separator: "/", omittingEmptySubsequences: false).map(
            String.init)
        let collections = known.collections
        func collection(_ kind: String, _ name: String) -> Collection? {
            switch kind {
            case "collection": return collections.first { $0.element == name }
            case "aliases": return name == "default" || name == "login" ? collections.first : nil
            default: return nil
            }
        }
        switch parts.count {
        case 2:
            switch parts[0] {
            case "session":
                guard let s = sessions[path], s.owner == known.name else { throw .unknownObject(path) }
                return .session(path)
            case "prompt":
                guard let p = prompts[path], p.owner == known.name else { throw .unknownObject(path) }
                return .prompt(path)
            default:
                guard let c = collection(parts[0], parts[1]) else { throw .unknownObject(path) }
                return .collection(c)
            }
        case 3:
            if parts[0] == "collection", parts[1] == Self.foreignElement {
                guard known.foreign[path] != nil, let id = Self.itemID(parts[2]) else { throw .unknownObject(path) }
                return .foreignItem(path, id: id)
            }
            guard let c = collection(parts[0], parts[1]), let id = Self.itemID(parts[2]) else {
                throw .unknownObject(path)
            }
            return .item(c, id: id)
        default:
            throw .unknownObject(path)
        }
    }

    /// The item id in a path element (32 lower-case hex digits).
    static func itemID(_ element: String) -> [UInt8]? {
        let b = Array(element.utf8)
        guard b.count == 32 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(16)
        var i = 0
        while i < 32 {
            guard let h = hexValue(b[i]), let l = hexValue(b[i + 1]) else { return nil }
            out.append(h << 4 | l)
            i += 2
        }
        return out
    }

    private static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: return c - 0x30
        case 0x61...0x66: return c - 0x61 + 10
        default: return nil
        }
    }

    /// Maps the item service's errors onto the Secret Service's.
    static func busError(_ e: KeychainError) -> BusError {
        switch e.status {
        case .missingEntitlement: return .accessDenied(e.message)
        case .interactionNotAllowed: return .isLocked(e.message)
        case .param, .noSuchAttr: return .invalidArgs(e.message)
        case .itemNotFound: return .noSuchObject(e.message)
        default: return .failed(e.message)
        }
    }

    /// Runs an item-service call, mapping its errors.
    func store<R>(_ body: () throws(KeychainError) -> R) throws(BusError) -> R {
        do throws(KeychainError) { return try body() } catch { throw Self.busError(error) }
    }

    /// The access policy's word on an action for this caller.
    func allow(_ action: Operation, _ known: BusCaller, _ caller: Caller) throws(BusError) {
        if case .deny(let e) = AccessPolicy.decideOnBus(action, caller: caller) { throw Self.busError(e) }
    }

    /// An item call that succeeded — found, read, created, changed or deleted an item — counts as
    /// activity for auto-lock when a registered app made it (as on the socket: never a failing call,
    /// never one of an unregistered process).
    func counted(_ known: BusCaller) {
        if known.registered { core.noteActivity() }
    }

    // MARK: Serving one call

    func serve(_ m: BusMessage) throws(BusError) -> BusMessage? {
        let path = m.path ?? ""
        let member = m.member ?? ""
        var interface = m.interface ?? ""
        if interface == Self.introspectableInterface {
            guard member == "Introspect" else { throw .unknownMethod(interface, member) }
            try m.expect("")
            let reply = try bus.newReturn(to: m)
            try reply.append(string: Introspection.xml(for: path))
            return reply
        }
        let (known, caller) = try identify(m)
        let object = try resolve(path, known)
        if interface.isEmpty { interface = object.interface }
        if interface == Self.propertiesInterface { return try properties(m, member, object, known, caller) }
        guard interface == object.interface else {
            throw BusError(
                "org.freedesktop.DBus.Error.UnknownInterface",
                "\(BusPath.printable(path)) has no interface \(BusPath.printable(interface))")
        }
        switch object {
        case .service: return try serviceMethod(m, member, known, caller)
        case .collection(let c): return try collectionMethod(m, member, c, known, caller)
        case .item(let c, let id): return try itemMethod(m, member, c, id, known, caller)
        case .foreignItem(let path, let id): return try foreignItemMethod(m, member, path, id, known, caller)
        case .session(let path):
            guard member == "Close" else { throw .unknownMethod(interface, member) }
            try m.expect("")
            sessions[path] = nil
            return try bus.newReturn(to: m)
        case .prompt(let path): return try promptMethod(m, member, path, known)
        }
    }

    // MARK: Service

    private func serviceMethod(_ m: BusMessage, _ member: String, _ known: BusCaller, _ caller: Caller) throws(BusError)
        -> BusMessage
    {
        let reply: BusMessage
        switch member {
        case "OpenSession":
            try m.expect("sv")
            let algorithm = try m.readString()
            guard let (_, contents) = try m.peek(), let contents else { throw .invalidArgs("missing input") }
            guard sessions.values.filter({ $0.owner == known.name }).count < Self.maxSessionsPerCaller else {
                throw .limitsExceeded("this connection has \(Self.maxSessionsPerCaller) sessions open; close some")
            }
            guard sessions.count < Self.maxSessions else {
                throw .limitsExceeded("keychaind has \(Self.maxSessions) transfer sessions open; try again later")
            }
            guard known.registered || unregisteredCount(sessions.values.map(\.owner)) < Self.maxSessions / 2 else {
                throw .limitsExceeded(
                    "processes that are not registered apps have \(Self.maxSessions / 2) transfer sessions open; try again later"
                )
            }
            let session: TransferSession
            reply = try bus.newReturn(to: m)
            switch algorithm {
            case TransferCrypto.plain:
                try m.skip("v")
                session = TransferSession(owner: known.name, key: nil)
                try reply.open("v", "s")
                try reply.append(string: "")
                try reply.close()
            case TransferCrypto.dh:
                guard contents == "ay" else {
                    throw .invalidArgs("\(TransferCrypto.dh) takes the client's public key as bytes (ay)")
                }
                _ = try m.enter("v", "ay")
                let client = try m.readBytes()
                try m.exit()
                let ours: [UInt8]
                let key: SecureBytes
                do { (ours, key) = try TransferCrypto.respond(clientPublic: client) } catch {
                    throw Self.busError(error)
                }
                session = TransferSession(owner: known.name, key: key)
                try reply.open("v", "ay")
                try reply.append(bytes: ours)
                try reply.close()
            default:
                throw .notSupported(
                    "transfer algorithm \(BusPath.printable(algorithm)) is not supported; use plain or \(TransferCrypto.dh)"
                )
            }
            let path = Self.root + "/session/s\(nextObject)"
            nextObject += 1
            sessions[path] = session
            try reply.append(string: path, type: "o")
        case "SearchItems":
            try m.expect("a{ss}")
            let query = try readAttributes(m)
            try allow(.copy, known, caller)
            known.lastSearch = Self.describe(query)
            let collections = known.collections
            let found = try store { () throws(KeychainError) in
                try items.secretServiceSearch(query, groups: collections.map(\.group), caller: caller)
            }
            let foreign = try foreignSearch(query, known, caller)
            if !found.unlocked.isEmpty || !found.locked.isEmpty { counted(known) }
            reply = try bus.newReturn(to: m)
            try reply.append(objectPaths: found.unlocked.map { paths(collections, $0) } + foreign.unlocked)
            try reply.append(objectPaths: found.locked.map { paths(collections, $0) } + foreign.locked)
        case "GetSecrets":
            try m.expect("aoo")
            let paths = try m.readObjectPaths(limit: Self.maxObjectsPerCall)
            let session = try transferSession(try m.readString("o"), known)
            try allow(.copy, known, caller)
            reply = try bus.newReturn(to: m)
            try reply.open("a", "{o(oayays)}")
            var replyBytes = 0
            var read = false
            for path in Set(paths).sorted() {
                let found: (secret: SecretBytes, contentType: String)?
                do throws(KeychainError) {
                    switch try? resolve(path, known) {
                    case .item(let c, let id)?:
                        found = try items.secretServiceSecret(id: id, groups: [c.group], caller: caller)
                    case .foreignItem(_, let id)?:
                        found = try foreignSecret(known, caller, path, id)  // nil without the person's yes
                    default:
                        continue
                    }
                } catch  where error.status == .interactionNotAllowed || error.status == .decode {
                    continue  // locked or damaged items are left out, as the spec's clients expect
                } catch {
                    throw Self.busError(error)
                }
                guard let secret = found else { continue }
                replyBytes += secret.secret.count
                guard replyBytes <= maxReplyBytes else {
                    throw .limitsExceeded(
                        "the secrets asked for come to more than \(maxReplyBytes) bytes; ask for fewer items at a time")
                }
                try reply.open("e", "o(oayays)")
                try reply.append(string: path, type: "o")
                try appendSecret(
                    reply, secret.secret, contentType: secret.contentType, session: session.path, session.session)
                try reply.close()
                read = true
            }
            try reply.close()
            if read { counted(known) }
        case "Unlock":
            try m.expect("ao")
            // Each path once: a pending prompt keeps its list, and a list of one path repeated a
            // million times held half a gigabyte per prompt (an attack review's finding).
            var objects: [String] = []
            var foreign: [String] = []  // other groups' items without the person's yes yet
            for path in Self.distinct(try m.readObjectPaths(limit: Self.maxObjectsPerCall)) {
                switch try? resolve(path, known) {
                case nil: continue
                case .foreignItem?:
                    if grantedGroup(known, path) == nil { foreign.append(path) } else { objects.append(path) }
                default: objects.append(path)
                }
            }
            reply = try bus.newReturn(to: m)
            if foreign.isEmpty && (items.secretServiceUnlocked || objects.isEmpty) {
                try reply.append(objectPaths: objects)
                try reply.append(string: Self.noPrompt, type: "o")
            } else if items.secretServiceUnlocked {
                // Only the yes/no dialog is needed: what is readable now is answered at once.
                try reply.append(objectPaths: objects)
                try reply.append(string: try newPrompt(known, caller, [], foreign: foreign), type: "o")
            } else {
                try reply.append(objectPaths: [])
                try reply.append(string: try newPrompt(known, caller, objects, foreign: foreign), type: "o")
            }
        case "Lock":
            try m.expect("ao")
            let objects = Self.distinct(try m.readObjectPaths(limit: Self.maxObjectsPerCall)).filter {
                (try? resolve($0, known)) != nil
            }
            try allow(.lock, known, caller)
            reply = try bus.newReturn(to: m)
            var locked: [String] = []
            if items.hasPassphrase && !objects.isEmpty {
                if !items.isLocked {
                    try store { () throws(KeychainError) in try items.lock() }
                    Log.info("keychain locked", [("by", "secret service")])
                }
                locked = objects
            }
            try reply.append(objectPaths: locked)
            try reply.append(string: Self.noPrompt, type: "o")
        case "ReadAlias":
            try m.expect("s")
            let name = try m.readString()
            reply = try bus.newReturn(to: m)
            let path = (name == "default" || name == "login") ? known.collections.first?.path : nil
            try reply.append(string: path ?? Self.noPrompt, type: "o")
        case "SetAlias":
            try m.expect("so")
            let name = try m.readString()
            let path = try m.readString("o")
            guard name == "default" || name == "login" else {
                throw .notSupported("keychaind keeps the aliases default and login only")
            }
            guard case .collection(let c)? = try? resolve(path, known), c == known.collections.first else {
                throw .notSupported(
                    "the \(name) collection is always the caller's first access group (\(known.collections.first?.path ?? "none"))"
                )
            }
            reply = try bus.newReturn(to: m)
        case "CreateCollection":
            try m.expect("a{sv}s")
            let label = try readLabel(m, property: "org.freedesktop.Secret.Collection.Label")
            let alias = try m.readString()
            let collections = known.collections
            let match =
                (alias == "default" || alias == "login")
                ? collections.first
                : collections.first { c in label.map { c.group == $0 || c.element == $0 } ?? false }
            guard let match else {
                throw .notSupported(
                    "keychaind's collections are the caller's access groups (\(collections.map(\.group).joined(separator: ", "))); register another group to get another collection"
                )
            }
            reply = try bus.newReturn(to: m)
            try reply.append(string: match.path, type: "o")
            try reply.append(string: Self.noPrompt, type: "o")
        default:
            throw .unknownMethod(Self.serviceInterface, member)
        }
        return reply
    }

    private func paths(_ collections: [Collection], _ match: SecretServiceMatch) -> String {
        (collections.first { $0.group.utf8.elementsEqual(match.group.utf8) } ?? collections[0]).itemPath(match.id)
    }

    // MARK: Collection

    private func collectionMethod(
        _ m: BusMessage, _ member: String, _ c: Collection, _ known: BusCaller,
        _ caller: Caller
    ) throws(BusError) -> BusMessage {
        let reply: BusMessage
        switch member {
        case "SearchItems":
            try m.expect("a{ss}")
            let query = try readAttributes(m)
            try allow(.copy, known, caller)
            known.lastSearch = Self.describe(query)
            let found = try store { () throws(KeychainError) in
                try items.secretServiceSearch(query, groups: [c.group], caller: caller)
            }
            if !found.unlocked.isEmpty || !found.locked.isEmpty { counted(known) }
            reply = try bus.newReturn(to: m)
            try reply.append(objectPaths: (found.unlocked + found.locked).map { c.itemPath($0.id) })
        case "CreateItem":
            try m.expect("a{sv}(oayays)b")
            var label = ""
            var attributes = SecretServiceAttributes()
            _ = try m.enter("a", "{sv}")
            while try m.enter("e", "sv") {
                let name = try m.readString()
                guard let (_, contents) = try m.peek() else { throw .invalidArgs("malformed properties") }
                switch name {
                case "org.freedesktop.Secret.Item.Label":
                    guard contents == "s" else { throw .invalidArgs("\(name) must be a string") }
                    _ = try m.enter("v", "s")
                    label = try m.readString()
                    try m.exit()
                case "org.freedesktop.Secret.Item.Attributes":
                    guard contents == "a{ss}" else { throw .invalidArgs("\(name) must be a{ss}") }
                    _ = try m.enter("v", "a{ss}")
                    attributes = try readAttributes(m)
                    try m.exit()
                default:
                    try m.skip("v")
                }
                try m.exit()
            }
            try m.exit()
            let (secret, contentType) = try readSecret(m, known)
            let replace = try m.readBool()
            try checkLabel(label)
            try allow(.add, known, caller)
            if replace { try allow(.update, known, caller) }
            let made = try store { () throws(KeychainError) in
                try items.secretServiceCreate(
                    group: c.group, label: label, attributes: attributes, secret: secret,
                    contentType: contentType, replace: replace, caller: caller)
            }
            counted(known)
            reply = try bus.newReturn(to: m)
            try reply.append(string: c.itemPath(made.id), type: "o")
            try reply.append(string: Self.noPrompt, type: "o")
            emit(made.replaced ? "ItemChanged" : "ItemCreated", group: c.group, id: made.id)
        case "Delete":
            try m.expect("")
            try allow(.delete, known, caller)
            let gone = try store { () throws(KeychainError) in
                try items.secretServiceDeleteAll(group: c.group, caller: caller)
            }
            if !gone.isEmpty { counted(known) }
            reply = try bus.newReturn(to: m)
            try reply.append(string: Self.noPrompt, type: "o")
            for id in gone { emit("ItemDeleted", group: c.group, id: id) }
        default:
            throw .unknownMethod(Self.collectionInterface, member)
        }
        return reply
    }

    // MARK: Item

    private func itemMethod(
        _ m: BusMessage, _ member: String, _ c: Collection, _ id: [UInt8], _ known: BusCaller,
        _ caller: Caller
    ) throws(BusError) -> BusMessage {
        let reply: BusMessage
        let path = m.path ?? ""
        switch member {
        case "GetSecret":
            try m.expect("o")
            let sessionPath = try m.readString("o")
            try allow(.copy, known, caller)
            guard
                let found = try store({ () throws(KeychainError) in
                    try items.secretServiceSecret(id: id, groups: [c.group], caller: caller)
                })
            else {
                throw .unknownObject(path)
            }
            let session = try transferSession(sessionPath, known)
            reply = try bus.newReturn(to: m)
            try appendSecret(
                reply, found.secret, contentType: found.contentType, session: session.path, session.session)
            counted(known)
        case "SetSecret":
            try m.expect("(oayays)")
            let (secret, contentType) = try readSecret(m, known)
            try allow(.update, known, caller)
            guard
                try store({ () throws(KeychainError) in
                    try items.secretServiceSetSecret(
                        id: id, groups: [c.group], secret: secret, contentType: contentType, caller: caller
                    )
                })
            else { throw .unknownObject(path) }
            counted(known)
            reply = try bus.newReturn(to: m)
            emit("ItemChanged", group: c.group, id: id)
        case "Delete":
            try m.expect("")
            try allow(.delete, known, caller)
            guard
                try store({ () throws(KeychainError) in
                    try items.secretServiceDelete(id: id, groups: [c.group], caller: caller)
                })
            else {
                throw .unknownObject(path)
            }
            counted(known)
            reply = try bus.newReturn(to: m)
            try reply.append(string: Self.noPrompt, type: "o")
            emit("ItemDeleted", group: c.group, id: id)
        default:
            throw .unknownMethod(Self.itemInterface, member)
        }
        return reply
    }

    /// How many of these owners are not registered apps: they share half of each limit for all
    /// callers, so that processes of the user that are no app cannot lock the apps out.
    func unregisteredCount(_ owners: [String]) -> Int {
        owners.reduce(0) { $0 + (callers[$1]?.registered == true ? 0 : 1) }
    }

    /// `paths` with repeats left out, in their first order (compared as bytes, as object paths are).
    static func distinct(_ paths: [String]) -> [String] {
        var seen = Set<[UInt8]>()
        return paths.filter { seen.insert(Array($0.utf8)).inserted }
    }

    // MARK: Prompt

    private func newPrompt(_ known: BusCaller, _ caller: Caller, _ objects: [String], foreign: [String] = [])
        throws(BusError) -> String
    {
        guard prompts.values.filter({ $0.owner == known.name }).count < Self.maxPromptsPerCaller else {
            throw .limitsExceeded("this connection has \(Self.maxPromptsPerCaller) prompts pending")
        }
        guard prompts.count < Self.maxPrompts else {
            throw .limitsExceeded(
                "keychaind has \(Self.maxPrompts) prompts pending; unlock the keychain or try again later")
        }
        guard known.registered || unregisteredCount(prompts.values.map(\.owner)) < Self.maxPrompts / 2 else {
            throw .limitsExceeded(
                "processes that are not registered apps have \(Self.maxPrompts / 2) prompts pending; unlock the keychain or try again later"
            )
        }
        let path = Self.root + "/prompt/p\(nextObject)"
        nextObject += 1
        var prompt = PendingPrompt(
            owner: known.name, objects: objects, request: request(known, caller, objects, foreign: foreign.count))
        prompt.foreign = foreign
        prompt.confirming = !foreign.isEmpty && items.secretServiceUnlocked
        prompts[path] = prompt
        return path
    }

    private func promptMethod(_ m: BusMessage, _ member: String, _ path: String, _ known: BusCaller) throws(BusError)
        -> BusMessage?
    {
        switch member {
        case "Prompt":
            try m.expect("s")
            let window = try m.readString()
            if prompts[path]?.waiting == false {
                prompts[path]?.waiting = true
                // An X11 window id, as the spec's clients pass it (decimal or 0x…), or none.
                if window.utf8.count <= 32, window.utf8.allSatisfy({ $0 >= 0x21 && $0 < 0x7F }) {
                    prompts[path]?.request.parentWindow = window
                }
            }
            // The reply goes first, so that Completed (at once when already unlocked) follows it.
            bus.send(try bus.newReturn(to: m))
            checkPrompts()
            askNext()
            return nil
        case "Dismiss":
            try m.expect("")
            bus.send(try bus.newReturn(to: m))
            if let p = prompts.removeValue(forKey: path) { complete(path, p, dismissed: true) }
            return nil
        default:
            throw .unknownMethod(Self.promptInterface, member)
        }
    }

    /// Completes the waiting prompts once the keychain is unlocked; a prompt that also asks about
    /// other apps' items goes on to its yes/no dialog.
    func checkPrompts() {
        guard items.secretServiceUnlocked else { return }
        waitingLogged = false
        var confirming = false
        for (path, p) in prompts where p.waiting && !p.confirming {
            if p.foreign.isEmpty {
                prompts[path] = nil
                complete(path, p, dismissed: false)
            } else if asking != path {
                prompts[path]?.confirming = true
                prompts[path]?.asked = false
                confirming = true
            }
        }
        if confirming { askNext() }
    }

    func complete(_ path: String, _ p: PendingPrompt, dismissed: Bool) {
        if let wait = p.portal {
            finishPortal(wait, dismissed: dismissed)
            return
        }
        guard let signal = try? bus.newSignal(path: path, interface: Self.promptInterface, member: "Completed") else {
            return
        }
        do throws(BusError) {
            try signal.append(bool: dismissed)
            try signal.open("v", "ao")
            try signal.append(objectPaths: dismissed ? [] : p.objects)
            try signal.close()
        } catch { return }
        bus.send(signal, destination: p.owner)
    }

    // MARK: Signals

    /// ItemCreated / ItemChanged / ItemDeleted, sent only to the connections whose callers can see
    /// the group, each with the paths of its own view: a signal never tells anyone else that an item
    /// exists.
    func emit(_ member: String, group: String, id: [UInt8]) {
        for known in callers.values {
            guard known.identity.process?.isRunning == true,
                let c = known.collections.first(where: { $0.group.utf8.elementsEqual(group.utf8) }),
                let signal = try? bus.newSignal(path: c.path, interface: Self.collectionInterface, member: member),
                (try? signal.append(string: c.itemPath(id), type: "o")) != nil
            else { continue }
            bus.send(signal, destination: known.name)
        }
    }

    // MARK: Arguments

    private func readAttributes(_ m: BusMessage) throws(BusError) -> SecretServiceAttributes {
        try Self.attributes(m.readStringMap(limit: SecretServiceAttributes.maxCount))
    }

    /// An `a{ss}` as attributes: InvalidArgs for a name given twice or beyond the limits (as
    /// CreateItem, SearchItems and setting the Attributes property all take them).
    static func attributes(_ pairs: [(name: [UInt8], value: [UInt8])]) throws(BusError) -> SecretServiceAttributes {
        var map: [[UInt8]: [UInt8]] = [:]
        for (n, v) in pairs {
            guard map[n] == nil else { throw .invalidArgs("an attribute name appears twice") }
            map[n] = v
        }
        let attributes = SecretServiceAttributes(map)
        if let problem = attributes.problem { throw .invalidArgs(problem) }
        return attributes
    }

    private func readLabel(_ m: BusMessage, property: String) throws(BusError) -> String? {
        var label: String?
        _ = try m.enter("a", "{sv}")
        while try m.enter("e", "sv") {
            let name = try m.readString()
            guard let (_, contents) = try m.peek() else { throw .invalidArgs("malformed properties") }
            if name == property, contents == "s" {
                _ = try m.enter("v", "s")
                label = try m.readString()
                try m.exit()
            } else {
                try m.skip("v")
            }
            try m.exit()
        }
        try m.exit()
        return label
    }

    func checkLabel(_ label: String) throws(BusError) {
        if label.utf8.count > SecretServiceAttributes.maxFieldBytes {
            throw .invalidArgs("the label is longer than \(SecretServiceAttributes.maxFieldBytes) bytes")
        }
    }

    func transferSession(_ path: String, _ known: BusCaller) throws(BusError) -> (
        path: String, session: TransferSession
    ) {
        guard let s = sessions[path], s.owner == known.name else {
            throw .noSession("no open session \(BusPath.printable(path)) on this connection; call OpenSession first")
        }
        return (path, s)
    }

    /// `(oayays)`: the session must be the caller's; the secret is decrypted with it, into wiping
    /// storage. What it was read from (the plaintext itself in a `plain` session) is zeroed on every
    /// path, refusals included.
    private func readSecret(_ m: BusMessage, _ known: BusCaller) throws(BusError) -> (SecretBytes, String) {
        _ = try m.enter("r", "oayays")
        let session = try transferSession(try m.readString("o"), known).session
        let parameters = try m.readBytes()
        var value = try m.readBytes()
        defer { Sodium.zero(&value) }
        let contentType = try m.readString()
        try m.exit()
        guard value.count <= maxSecretBytes + 32 else {
            throw .invalidArgs("the secret is larger than \(maxSecretBytes) bytes")
        }
        guard contentType.utf8.count <= 256 else { throw .invalidArgs("the content type is longer than 256 bytes") }
        var opened = try session.open(parameters: parameters, value: value)
        defer { Sodium.zero(&opened) }
        guard opened.count <= maxSecretBytes else {
            throw .invalidArgs("the secret is larger than \(maxSecretBytes) bytes")
        }
        return (SecretBytes(opened), contentType)
    }

    func appendSecret(
        _ reply: BusMessage, _ secret: SecretBytes, contentType: String, session path: String,
        _ session: TransferSession
    ) throws(BusError) {
        var plain = secret.unprotectedArray
        defer { Sodium.zero(&plain) }
        var sealed = try session.seal(plain)
        defer { Sodium.zero(&sealed.value) }
        try reply.open("r", "oayays")
        try reply.append(string: path, type: "o")
        try reply.append(bytes: sealed.parameters)
        try reply.append(bytes: sealed.value)
        try reply.append(string: contentType)
        try reply.close()
    }
}
