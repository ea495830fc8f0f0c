import KeychainCore
import KeychainItems
import KeychainPrompt
import KeychainRequests
import KeychainSystem

/// The Secret portal's backend, `org.freedesktop.impl.portal.Secret` at
/// `/org/freedesktop/portal/desktop` on the Secret Service's own bus name: xdg-desktop-portal calls
/// `RetrieveSecret` for a sandboxed app that asked the portal (libsecret inside a Flatpak does, for
/// the key of its file keyring), and keychaind writes that app's secret into the descriptor given.
///
/// The secret is 64 bytes from the kernel's CSPRNG, made at the app's first call and kept as an item
/// of the app's own group (service `org.freedesktop.portal.Secret`, account the app ID): the group
/// a sandboxed caller has on the bus — `flatpak.<app id>`, or the first group of a registration that
/// names the app ID — so it survives restarts and no other app reaches it.
///
/// Who is trusted for what (docs/security.md): only xdg-desktop-portal may call, checked as an
/// executable is (its file at `portalFrontend`, in keychaind's namespaces). The app ID it names must
/// be the sandbox of the process that asked it: the request handle names that process's connection,
/// which keychaind identifies itself (`FlatpakInfo`, with its read-only and namespace checks), so a
/// sandbox that xdg-desktop-portal would take at its word (a writable `/.flatpak-info`, a sandbox
/// made inside a sandbox) gets nothing.
extension SecretService {
    static let portalPath = "/org/freedesktop/portal/desktop"
    static let portalInterface = "org.freedesktop.impl.portal.Secret"
    static let portalRequestInterface = "org.freedesktop.impl.portal.Request"
    /// Where xdg-desktop-portal puts its requests: `<prefix><sender>/<token>`, the sender being the
    /// asking connection's unique name without its `:` and with `.` as `_`.
    static let portalRequestPrefix = portalPath + "/request/"
    /// Debian's xdg-desktop-portal: the one program that may call the backend.
    public static let portalFrontendPath = "/usr/libexec/xdg-desktop-portal"
    /// The service of an app's portal secret item (its account is the app ID).
    public static let portalItemService = "org.freedesktop.portal.Secret"
    static let portalSecretBytes = 64
    /// `response` values of a portal request.
    static let portalSuccess: UInt32 = 0
    static let portalCancelled: UInt32 = 1

    /// Every method call to the portal's paths: served, or an error reply. Returns 1 (handled), or 0
    /// for what is not a method call.
    func handlePortal(_ m: BusMessage) -> Int32 {
        guard m.isMethodCall else { return 0 }
        do throws(BusError) {
            try m.markSensitive()
            if let reply = try servePortal(m) { bus.send(reply) }
        } catch {
            bus.replyError(to: m, error)
        }
        return 1
    }

    private func servePortal(_ m: BusMessage) throws(BusError) -> BusMessage? {
        let path = m.path ?? ""
        let member = m.member ?? ""
        let interface = m.interface ?? ""
        if interface == Self.introspectableInterface {
            guard member == "Introspect" else { throw .unknownMethod(interface, member) }
            try m.expect("")
            let reply = try bus.newReturn(to: m)
            try reply.append(string: Introspection.portal(for: path))
            return reply
        }
        if path == Self.portalPath {
            if interface == Self.propertiesInterface { return try portalProperties(m, member) }
            guard interface.isEmpty || interface == Self.portalInterface else {
                throw BusError(
                    "org.freedesktop.DBus.Error.UnknownInterface",
                    "\(Self.portalPath) has no interface \(BusPath.printable(interface))")
            }
            guard member == "RetrieveSecret" else { throw .unknownMethod(Self.portalInterface, member) }
            return try retrieveSecret(m)
        }
        if path.hasPrefix(Self.portalRequestPrefix) {
            // xdg-desktop-portal's proxy for the request: RetrieveSecret answers at once (or waits for
            // an unlock, which a Close does not end), so there is nothing to close.
            if interface == Self.propertiesInterface && member == "GetAll" {
                try m.expect("s")
                let reply = try bus.newReturn(to: m)
                try reply.open("a", "{sv}")
                try reply.close()
                return reply
            }
            guard interface.isEmpty || interface == Self.portalRequestInterface, member == "Close" else {
                throw .unknownMethod(interface, member)
            }
            try m.expect("")
            try checkPortalFrontend(m)
            return try bus.newReturn(to: m)
        }
        throw .unknownObject(path)
    }

    /// `version` (1), the one property of the backend's interface.
    private func portalProperties(_ m: BusMessage, _ member: String) throws(BusError) -> BusMessage {
        let reply = try bus.newReturn(to: m)
        switch member {
        case "Get":
            try m.expect("ss")
            let interface = try m.readString()
            let name = try m.readString()
            guard interface == Self.portalInterface, name == "version" else {
                throw BusError(
                    "org.freedesktop.DBus.Error.UnknownProperty",
                    "no property \(BusPath.printable(name)) in \(BusPath.printable(interface))")
            }
            try reply.open("v", "u")
            try reply.append(uint32: 1)
            try reply.close()
        case "GetAll":
            try m.expect("s")
            let interface = try m.readString()
            try reply.open("a", "{sv}")
            if interface == Self.portalInterface {
                try reply.open("e", "sv")
                try reply.append(string: "version")
                try reply.open("v", "u")
                try reply.append(uint32: 1)
                try reply.close()
                try reply.close()
            }
            try reply.close()
        default:
            throw .unknownMethod(Self.propertiesInterface, member)
        }
        return reply
    }

    /// Refuses every sender but xdg-desktop-portal: a process in keychaind's namespaces running the
    /// very file at `portalFrontend`.
    private func checkPortalFrontend(_ m: BusMessage) throws(BusError) {
        guard let sender = m.sender, sender.hasPrefix(":") else { throw .accessDenied("the call has no sender") }
        let identity = try connection(sender).identity
        guard let exe = identity.executable, let file = identity.executableFile,
            exe.utf8.elementsEqual(portalFrontend.utf8), FileIdentity.of(path: exe) == file
        else {
            let runs = identity.executable.map { "runs \($0)" } ?? "is not identified: \(identity.problem ?? "?")"
            throw .accessDenied(
                "only xdg-desktop-portal (\(portalFrontend)) may call \(Self.portalInterface); the caller (pid \(identity.pid)) \(runs)"
            )
        }
    }

    /// `RetrieveSecret(o handle, s app_id, h fd, a{sv} options) → (u response, a{sv} results)`.
    private func retrieveSecret(_ m: BusMessage) throws(BusError) -> BusMessage? {
        try checkPortalFrontend(m)
        try m.expect("osha{sv}")
        let handle = try m.readString("o")
        let appID = try m.readString()
        let fd = try m.readFD()
        guard !appID.isEmpty else {
            throw .invalidArgs(
                "no app ID: the Secret portal serves sandboxed (Flatpak) apps only, and xdg-desktop-portal names none for a process outside a sandbox"
            )
        }
        guard FlatpakInfo.isValidAppID(appID) else {
            throw .invalidArgs("\"\(BusPath.printable(appID))\" is not a valid Flatpak app ID")
        }
        let out: FileDescriptor
        do throws(Errno) { out = try FileDescriptor.duplicate(fd) } catch {
            throw .invalidArgs("the file descriptor cannot be used (\(error.message))")
        }
        defer { out.close() }
        guard (try? out.isOpenForWriting()) == true else {
            throw .invalidArgs("the file descriptor for the secret is not open for writing")
        }
        let (asker, caller) = try portalAsker(handle: handle, appID: appID)
        if !items.secretServiceUnlocked {
            return try waitForUnlock(m, handle: handle, out: out, asker: asker, appID: appID)
        }
        try fulfil(out, appID: appID, asker: asker, caller: caller)
        return try portalReply(to: m, Self.portalSuccess)
    }

    /// The app that asked xdg-desktop-portal: the connection the handle names, identified by keychaind
    /// itself, which must run in the sandbox of `appID` — and the caller it is on the bus.
    private func portalAsker(handle: String, appID: String) throws(BusError) -> (BusCaller, Caller) {
        guard handle.hasPrefix(Self.portalRequestPrefix) else {
            throw .invalidArgs("the handle \(BusPath.printable(handle)) is not a portal request path")
        }
        let element = handle.utf8.dropFirst(Self.portalRequestPrefix.utf8.count).prefix { $0 != UInt8(ascii: "/") }
        guard !element.isEmpty,
            element.allSatisfy({ $0 == UInt8(ascii: "_") || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) })
        else {
            throw .invalidArgs("the handle \(BusPath.printable(handle)) names no connection")
        }
        let sender =
            ":" + String(decoding: element.map { $0 == UInt8(ascii: "_") ? UInt8(ascii: ".") : $0 }, as: UTF8.self)
        let asker: BusCaller
        do throws(BusError) { asker = try connection(sender) } catch {
            throw .accessDenied("the app that asked for its secret (\(sender)) cannot be identified: \(error.message)")
        }
        guard let sandbox = asker.identity.flatpakAppID else {
            throw .accessDenied(
                "the process that asked for the secret of \(appID) (pid \(asker.identity.pid)) runs in no Flatpak sandbox keychaind trusts: \(asker.identity.problem ?? "it is not sandboxed")"
            )
        }
        guard sandbox.utf8.elementsEqual(appID.utf8) else {
            throw .accessDenied(
                "xdg-desktop-portal asked for the secret of \(appID), but the process that asked (pid \(asker.identity.pid)) runs in the sandbox of \(sandbox)"
            )
        }
        switch asker.decision {
        case .success(let caller) where !caller.accessGroups.isEmpty: return (asker, caller)
        case .success: throw .accessDenied("\(appID) has no access group")
        case .failure(let error): throw .accessDenied(error.message)
        }
    }

    /// Writes the app's secret (made and kept at its first call) into `out`.
    private func fulfil(_ out: FileDescriptor, appID: String, asker: BusCaller, caller: Caller) throws(BusError) {
        try allow(.copy, asker, caller)
        let group = caller.accessGroups[0]
        let attributes = SecretServiceAttributes(strings: [
            (SecretServiceFields.serviceName, Self.portalItemService), (SecretServiceFields.accountName, appID),
        ])
        let found = try store { () throws(KeychainError) in
            try items.secretServiceSearch(attributes, groups: [group], caller: caller)
        }
        var kept: SecretBytes?
        for match in found.unlocked where kept == nil {
            let stored = try store { () throws(KeychainError) in
                try items.secretServiceSecret(id: match.id, groups: [group], caller: caller)
            }
            if let stored, !stored.secret.isEmpty { kept = stored.secret }
        }
        var secret: SecretBytes
        if let kept {
            secret = kept
        } else {
            guard found.locked.isEmpty else { throw Self.busError(ItemService.lockedError) }
            try allow(.add, asker, caller)
            secret = SecretBytes(count: Self.portalSecretBytes)
            do throws(Errno) {
                try secret.withUnsafeMutableBytes { (b) throws(Errno) in try SystemRandom.fill(b) }
            } catch {
                throw .failed("no random bytes for the secret (\(error.message))")
            }
            let made = secret
            let (id, _) = try store { () throws(KeychainError) in
                try items.secretServiceCreate(
                    group: group, label: "Secret portal key of \(appID)", attributes: attributes, secret: made,
                    contentType: "", replace: false, caller: caller)
            }
            emit("ItemCreated", group: group, id: id)
            Log.info("secret service: made the Secret portal key of an app", [("app", appID)])
        }
        do throws(Errno) { try secret.withUnsafeBytes { (b) throws(Errno) in try out.writeAllWithoutWaiting(b) } } catch
        {
            throw .failed("cannot write the secret to the file descriptor given (\(error.message))")
        }
        counted(asker)
        Log.info("secret service: gave an app its Secret portal key", [("app", appID)])
    }

    /// A locked keychain: the call waits, as a Secret Service prompt does — the passphrase dialog
    /// (pinentry) shows when one can, else the call waits for `keychainctl unlock` — and is answered
    /// when the keychain is unlocked (`finishPortal`), or as cancelled when the dialog is dismissed.
    private func waitForUnlock(
        _ m: BusMessage, handle: String, out: FileDescriptor, asker: BusCaller, appID: String
    ) throws(BusError) -> BusMessage? {
        guard let frontend = m.sender else { throw .accessDenied("the call has no sender") }
        guard prompts[handle] == nil else {
            throw .invalidArgs("the request \(BusPath.printable(handle)) already waits")
        }
        guard prompts.values.filter({ $0.owner == frontend }).count < Self.maxPromptsPerCaller,
            prompts.count < Self.maxPrompts
        else {
            throw .limitsExceeded(
                "too many requests wait for the keychain to be unlocked; unlock it or try again later")
        }
        let kept: FileDescriptor
        do throws(Errno) { kept = try FileDescriptor.duplicate(out.rawValue) } catch {
            throw .failed("cannot keep the file descriptor while the keychain is locked (\(error.message))")
        }
        let request = PromptRequest(
            title: "Unlock the keychain",
            description:
                "The sandboxed app \(appID) asks to unlock the keychain to read its Secret portal key.\n\nType the keychain passphrase to unlock the keychain for it."
        )
        var pending = PendingPrompt(owner: frontend, objects: [], request: request)
        pending.waiting = true
        pending.portal = PortalWait(call: m, out: kept, appID: appID, asker: asker.name)
        prompts[handle] = pending
        Log.info("secret service: the Secret portal waits for the keychain to be unlocked", [("app", appID)])
        askNext()
        return nil
    }

    /// Answers a portal call that waited for the unlock: the secret when the keychain was unlocked
    /// (the app identified again first), cancelled when the dialog was dismissed.
    func finishPortal(_ wait: PortalWait, dismissed: Bool) {
        defer { wait.out.close() }
        do throws(BusError) {
            if dismissed {
                bus.send(try portalReply(to: wait.call, Self.portalCancelled))
                return
            }
            let asker = try connection(wait.asker)
            guard asker.identity.flatpakAppID.map({ $0.utf8.elementsEqual(wait.appID.utf8) }) == true,
                case .success(let caller) = asker.decision, !caller.accessGroups.isEmpty
            else {
                throw .accessDenied("the app that asked for the secret of \(wait.appID) is no longer that app")
            }
            try fulfil(wait.out, appID: wait.appID, asker: asker, caller: caller)
            bus.send(try portalReply(to: wait.call, Self.portalSuccess))
        } catch {
            bus.replyError(to: wait.call, error)
        }
    }

    private func portalReply(to m: BusMessage, _ response: UInt32) throws(BusError) -> BusMessage {
        let reply = try bus.newReturn(to: m)
        try reply.append(uint32: response)
        try reply.open("a", "{sv}")
        try reply.close()
        return reply
    }
}

/// A `RetrieveSecret` waiting for the keychain to be unlocked: its call (answered later), a copy of
/// its descriptor, the app ID and the asking connection's name.
struct PortalWait {
    let call: BusMessage
    let out: FileDescriptor
    let appID: String
    let asker: String
}
