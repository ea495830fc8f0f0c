import Foundation
import KeychainCore
import KeychainItems
import KeychainPrompt
import KeychainRequests
import KeychainSystem
import Synchronization

/// An item of another group that one connection's search listed (`secretServiceForeignItems`
/// "confirm"): what the search matched (all the connection knows of it), and the person's yes for
/// this connection, if any.
struct ForeignItem {
    let id: [UInt8]
    /// The attributes of the search that listed it: what a locked foreign item shows.
    var matched: SecretServiceAttributes
    /// The group the person allowed it from, the keychain's lock count then, and the app it was
    /// allowed to: the grant holds while the keychain has not locked since and the connection is
    /// still that app.
    var grant: (group: String, locks: Int, app: String)?
}

/// Other apps' items on the bus, confirmed per item (docs/secret-service.md, "Other apps' items").
/// With `"secretServiceForeignItems": "confirm"`, a registered app's `SearchItems` also lists the
/// matching items of groups that are not its own — in `locked`, at
/// `/org/freedesktop/secrets/collection/_foreign/<id>` (`_fo` is no escaped group, so no collection
/// of any caller has that element). Only the connection whose search listed a path can name it.
/// `Unlock` of one returns a prompt whose `Prompt` shows a pinentry yes/no dialog naming the app and
/// the item; a yes lets that connection read it (`GetSecret(s)`, its properties) until the keychain
/// locks or the connection leaves the bus. Writes stay refused: the grant is read-only.
extension SecretService {
    /// The path element of foreign items: never an escaped group (`_` is followed by two hex digits
    /// there) nor `login`.
    static let foreignElement = "_foreign"
    /// Foreign items one connection may have listed at once (each is a path it can name).
    static let maxForeignPerCaller = 4096

    static func foreignPath(_ id: [UInt8]) -> String {
        root + "/collection/" + foreignElement + "/" + ItemService.hex(id)
    }

    /// The group a foreign item was granted from, while the grant holds.
    func grantedGroup(_ known: BusCaller, _ path: String) -> String? {
        guard let grant = known.foreign[path]?.grant, grant.locks == items.lockCount, items.secretServiceUnlocked,
            known.registered, case .success(let caller) = known.decision, caller.applicationIdentifier == grant.app
        else { return nil }
        return grant.group
    }

    /// The caller a granted read runs as: the same app, entitled to that one group, and only ever
    /// asked to read (the item calls below check the group as for any caller).
    func grantee(_ caller: Caller, _ group: String) -> Caller {
        Caller(applicationIdentifier: caller.applicationIdentifier, accessGroups: [group])
    }

    /// Other groups' items matching `query`, for a registered app in confirm mode (nothing otherwise):
    /// (paths it may read now, paths that need the person's yes).
    func foreignSearch(_ query: SecretServiceAttributes, _ known: BusCaller, _ caller: Caller) throws(BusError) -> (
        unlocked: [String], locked: [String]
    ) {
        guard foreignItems == .confirm, known.registered, !query.isEmpty else { return ([], []) }
        let own = known.collections.map(\.group)
        let ids = try store { () throws(KeychainError) in
            try items.secretServiceForeignSearch(query, excluding: own, caller: caller)
        }
        var unlocked: [String] = []
        var locked: [String] = []
        for id in ids {
            let path = Self.foreignPath(id)
            if known.foreign[path] == nil {
                guard known.foreign.count < Self.maxForeignPerCaller else { break }
                known.foreign[path] = ForeignItem(id: id, matched: query, grant: nil)
            }
            if grantedGroup(known, path) != nil { unlocked.append(path) } else { locked.append(path) }
        }
        return (unlocked, locked)
    }

    /// A secret of a granted foreign item; nil when there is no grant (or the item is gone).
    func foreignSecret(_ known: BusCaller, _ caller: Caller, _ path: String, _ id: [UInt8]) throws(KeychainError) -> (
        secret: SecretBytes, contentType: String
    )? {
        guard let group = grantedGroup(known, path) else { return nil }
        return try items.secretServiceSecret(id: id, groups: [group], caller: grantee(caller, group))
    }

    // MARK: Methods and properties

    func foreignItemMethod(
        _ m: BusMessage, _ member: String, _ path: String, _ id: [UInt8], _ known: BusCaller, _ caller: Caller
    ) throws(BusError) -> BusMessage {
        switch member {
        case "GetSecret":
            try m.expect("o")
            let sessionPath = try m.readString("o")
            try allow(.copy, known, caller)
            guard grantedGroup(known, path) != nil else {
                throw .isLocked(
                    "this item belongs to another app: Unlock it, and the person is asked whether \(caller.applicationIdentifier) may read it"
                )
            }
            guard let found = try store({ () throws(KeychainError) in try foreignSecret(known, caller, path, id) })
            else {
                throw .unknownObject(path)
            }
            let session = try transferSession(sessionPath, known)
            let reply = try bus.newReturn(to: m)
            try appendSecret(
                reply, found.secret, contentType: found.contentType, session: session.path, session.session)
            counted(known)
            return reply
        case "SetSecret", "Delete":
            throw Self.foreignReadOnly
        default:
            throw .unknownMethod(Self.itemInterface, member)
        }
    }

    static var foreignReadOnly: BusError {
        .accessDenied(
            "this item belongs to another app: it can be read once the person allows it, never changed or deleted from here"
        )
    }

    /// A foreign item's properties: what its search matched while it is not granted (Locked true, no
    /// label, no dates); the item's own once granted.
    func foreignProperties(_ known: BusCaller, _ caller: Caller, _ path: String, _ id: [UInt8]) throws(BusError)
        -> (locked: Bool, attributes: SecretServiceAttributes, label: String, created: Double, modified: Double)
    {
        try allow(.copy, known, caller)
        guard let entry = known.foreign[path] else { throw .unknownObject(path) }
        guard let group = grantedGroup(known, path) else { return (true, entry.matched, "", 0, 0) }
        guard
            let item = try store({ () throws(KeychainError) in
                try items.secretServiceItem(id: id, groups: [group], caller: grantee(caller, group))
            })
        else { throw .unknownObject(path) }
        return (item.locked, item.attributes, item.label, item.created, item.modified)
    }

    // MARK: The yes/no dialog

    /// Shows the yes/no dialog of a confirming prompt (bus thread; its answer comes back through
    /// `answers`). Returns false when it did not show (the prompt is then dismissed).
    func confirmForeign(_ path: String, _ p: PendingPrompt) -> Bool {
        guard let known = callers[p.owner], case .success(let caller) = known.decision, known.registered else {
            dismissForeign(path, "the asking connection is gone")
            return false
        }
        let own = known.collections.map(\.group)
        var named: [String: String] = [:]
        var lines: [String] = []
        for foreignPath in p.foreign {
            guard let entry = known.foreign[foreignPath] else { continue }
            let item: SecretServiceForeignItem?
            do throws(KeychainError) {
                item = try items.secretServiceForeignItem(id: entry.id, excluding: own, caller: caller)
            } catch {
                dismissForeign(path, error.message)
                return false
            }
            guard let item else { continue }
            named[foreignPath] = item.group
            let label = Self.printable(item.label.isEmpty ? "(no label)" : item.label)
            lines.append(
                "“\(label)” (\(Self.describe(item.attributes))) of the access group \(Self.printable(item.group))")
        }
        guard !lines.isEmpty else {
            dismissForeign(path, "the items asked for are gone")
            return false
        }
        let app = caller.applicationIdentifier
        let what = lines.count == 1 ? "an item that belongs to another app" : "\(lines.count) items of other apps"
        var request = PromptRequest(
            title: "Allow access to another app's item",
            description:
                "The app \(app) asks to read \(what):\n\(lines.prefix(8).joined(separator: "\n"))\(lines.count > 8 ? "\n…" : "")\n\nAllow \(app) to read \(lines.count == 1 ? "it" : "them") until the keychain locks? It cannot change or delete \(lines.count == 1 ? "it" : "them")."
        )
        request.parentWindow = p.request.parentWindow
        let prompter = passphrasePrompts.prompter()
        if let why = prompter.unavailable(request) {
            dismissForeign(path, why)
            return false
        }
        prompts[path]?.named = named
        prompts[path]?.locksWhenAsked = items.lockCount
        prompts[path]?.askedFor = app
        asking = path
        Log.info(
            "secret service: asking to allow another app's item",
            [("prompt", path), ("app", app), ("items", String(named.count)), ("program", prompter.program ?? "-")])
        let core = self.core
        let shown = request
        showDialog(for: path) { () throws(PromptFailure) -> PromptOutcome in
            try core.promptLock.withLock { () throws(PromptFailure) in
                try prompter.confirm(shown, okLabel: "Allow", cancelLabel: "Deny")
            }
            return .confirmed
        }
        return true
    }

    /// The person said yes: the items named are granted to the owner's connection — unless the
    /// keychain locked meanwhile (then the prompt is dismissed) — and the prompt completes.
    func foreignAllowed(_ path: String) {
        guard let p = prompts.removeValue(forKey: path) else { return }
        guard let known = callers[p.owner], p.locksWhenAsked == items.lockCount, items.secretServiceUnlocked,
            known.registered, case .success(let caller) = known.decision, caller.applicationIdentifier == p.askedFor
        else {
            Log.info("secret service: a yes came after the keychain locked; nothing granted", [("prompt", path)])
            complete(path, p, dismissed: true)
            return
        }
        var granted: [String] = []
        for (foreignPath, group) in p.named.sorted(by: { $0.key < $1.key }) where known.foreign[foreignPath] != nil {
            known.foreign[foreignPath]?.grant = (group, p.locksWhenAsked, p.askedFor)
            granted.append(foreignPath)
        }
        Log.info("secret service: another app's item allowed", [("prompt", path), ("items", String(granted.count))])
        var done = p
        done.objects = p.objects + granted
        complete(path, done, dismissed: false)
    }

    private func dismissForeign(_ path: String, _ why: String) {
        Log.info("secret service: a confirmation prompt was dismissed", [("prompt", path), ("why", why)])
        if let p = prompts.removeValue(forKey: path) { complete(path, p, dismissed: true) }
    }

    /// Text for a dialog: control characters left out, cut short.
    static func printable(_ s: String) -> String {
        String(String.UnicodeScalarView(s.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(200)))
    }
}
