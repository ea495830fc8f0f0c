public import KeychainCore
import KeychainCrypto
public import KeychainItems
import KeychainStore
public import KeychainSystem

/// A keychain item as the Secret Service shows it (docs/secret-service.md).
public struct SecretServiceItem: Sendable {
    /// The item's 16-byte id (its persistent reference's), fixed for its life: the object path's last
    /// element.
    public var id: [UInt8]
    /// The access group it lives in: the collection.
    public var group: String
    /// Its class key is not available now (the keychain is locked): only `id`, `group` and `created`
    /// are known then.
    public var locked: Bool
    /// The item's label (`kSecAttrLabel`), shown as the Secret Service `Label`.
    public var label: String
    /// The attributes the Secret Service searches on; derived from service and account unless `ownAttributes`.
    public var attributes: SecretServiceAttributes
    /// The MIME type of the secret, `text/plain` unless the creator gave another.
    public var contentType: String
    /// Seconds since the epoch.
    public var created: Double
    /// When the item last changed, in seconds since the epoch.
    public var modified: Double
    /// It carries Secret Service attributes of its own (made through the bus); otherwise they are
    /// its service and account.
    public var ownAttributes: Bool
}

/// One item a search found: its id and the group (collection) it is in.
public struct SecretServiceMatch: Sendable, Hashable {
    /// The item's 16-byte id, the last element of its object path.
    public var id: [UInt8]
    /// The access group (collection) the item is in.
    public var group: String
}

/// The Secret Service's calls on the item itemStore. Every call names the groups it works in (the
/// caller's collections) and the caller, and checks each group with `AccessPolicy.checkEntitlement`,
/// so an app reaches only its own groups. Items are keychain items: what the Secret Service stores is
/// sealed and indexed like everything else, and the same items are visible through SecItem.
extension ItemService {
    /// The class of items made through the bus: WhenUnlocked, as every desktop keyring's login
    /// collection is readable only while unlocked.
    static let secretServiceProtection = ProtectionClass.default

    /// Whether the items the Secret Service creates can be read now.
    public var secretServiceUnlocked: Bool { itemVault.isAvailable(Self.secretServiceProtection) }

    private func groupDigests(_ groups: [String], _ caller: Caller) throws(KeychainError) -> [(
        group: String, digest: [UInt8]
    )] {
        var out: [(group: String, digest: [UInt8])] = []
        // Before the first unlock of a keychain with a passphrase no digest can be computed:
        // errSecInteractionNotAllowed, as for a locked collection.
        let index = try itemVault.indexer()
        for g in groups {
            try AccessPolicy.checkEntitlement(g, caller)
            out.append((g, index.column(.accessGroup, Array(g.utf8))))
        }
        return out
    }

    /// The creation time in an item id (its first 8 bytes: microseconds, big-endian).
    static func creationTime(id: [UInt8]) -> Double {
        guard id.count >= 8 else { return 0 }
        var micros: UInt64 = 0
        for b in id[0..<8] { micros = micros << 8 | UInt64(b) }
        return Double(micros) / 1_000_000
    }

    /// Lower-case hexadecimal of an item id (an item's account when the bus made it with attributes of
    /// its own, and its object path's last element).
    public static func hex(_ id: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(id.count * 2)
        for b in id {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The view of one row, or nil when it is not in one of `digests`' groups (also after decrypting:
    /// a forged group column buys nothing).
    private func view(_ row: StoredItem, _ digests: [(group: String, digest: [UInt8])]) throws(KeychainError)
        -> SecretServiceItem?
    {
        let groupIndex = row.accessGroupIndex  // once: a row's getters copy the column
        guard let group = digests.first(where: { $0.digest == groupIndex })?.group else { return nil }
        let created = Self.creationTime(id: row.ref)
        guard let protection = ProtectionClass(column: row.protectionClass), itemVault.isAvailable(protection) else {
            return SecretServiceItem(
                id: row.ref, group: group, locked: true, label: "", attributes: SecretServiceAttributes(),
                contentType: SecretServiceFields.defaultContentType, created: created, modified: created,
                ownAttributes: false)
        }
        let item = try itemCodec.open(row, withSecret: false)
        return view(item, group: group)
    }

    private func view(_ item: OpenedItem, group: String) -> SecretServiceItem? {
        guard let agrp = item.attributes["agrp"]?.text, AccessPolicy.sameGroup(agrp, group) else { return nil }
        let fields = SecretServiceFields.view(of: item.attributes)
        let label =
            item.attributes["labl"].flatMap(ItemService.attributeBytes(of:)).map { String(decoding: $0, as: UTF8.self) }
            ?? ""
        return SecretServiceItem(
            id: item.row.ref, group: group, locked: false, label: label, attributes: fields.attributes,
            contentType: fields.contentType, created: item.attributes["cdat"]?.date ?? 0,
            modified: item.attributes["mdat"]?.date ?? 0, ownAttributes: fields.own)
    }

    /// The rows a search must look at: items with their own attributes through the attribute index,
    /// and — when the search names only `service` and `account` — the other items through their
    /// service and account columns. Every item of the groups when the search is empty.
    private func searchFilters(_ query: SecretServiceAttributes, groupIndexes: [[UInt8]]?, withSecret: Bool = false)
        throws(KeychainError) -> [RowFilter]
    {
        let index = try itemVault.indexer()
        guard !query.isEmpty else { return [RowFilter(accessGroupIndexes: groupIndexes, includeSecret: withSecret)] }
        // The first digest drives the query: not one of the names that many items share.
        let common: Set<[UInt8]> = [Array("xdg:schema".utf8), Array("application".utf8)]
        let ordered = query.sorted.sorted { !common.contains($0.name) && common.contains($1.name) }
        var filters = [
            RowFilter(
                accessGroupIndexes: groupIndexes,
                requiredAttributeIndexes: ordered.map { index.secretServiceAttribute(name: $0.name, value: $0.value) },
                includeSecret: withSecret)
        ]
        let service = query[SecretServiceFields.serviceName]
        let account = query[SecretServiceFields.accountName]
        if query.count == (service == nil ? 0 : 1) + (account == nil ? 0 : 1) {
            filters.append(
                RowFilter(
                    serviceIndex: service.map { index.column(.service, $0) },
                    accountIndex: account.map { index.column(.account, $0) },
                    accessGroupIndexes: groupIndexes, excludedAttributeIndex: index.secretServiceItemMark,
                    includeSecret: withSecret))
        }
        return filters
    }

    // MARK: Reading

    /// Every item of `group`, oldest first (no decryption: ids only).
    public func secretServiceItemIDs(group: String, caller: Caller) throws(KeychainError) -> [[UInt8]] {
        let digests = try groupDigests([group], caller)
        var ids: [[UInt8]] = []
        try itemStore.read { (r) throws(KeychainError) in
            try r.forEach(RowFilter(accessGroupIndexes: digests.map(\.digest))) { (row) throws(KeychainError) -> Bool in
                ids.append(row.ref)
                return true
            }
        }
        return ids.sorted { $0.lexicographicallyPrecedes($1) }
    }

    /// One item of `groups`, or nil when none of them holds it.
    public func secretServiceItem(id: [UInt8], groups: [String], caller: Caller) throws(KeychainError)
        -> SecretServiceItem?
    {
        let digests = try groupDigests(groups, caller)
        guard !digests.isEmpty, id.count == ItemService.itemIDLength else { return nil }
        var found: SecretServiceItem?
        try itemStore.read { (r) throws(KeychainError) in
            try r.forEach(RowFilter(ref: id, accessGroupIndexes: digests.map(\.digest))) {
                (row) throws(KeychainError) -> Bool in
                found = try view(row, digests)
                return false
            }
        }
        return found
    }

    /// The items of `groups` whose attributes include every pair of `query`, oldest first: those
    /// that can be read now, and the locked ones. Found through the keyed indexes alone, which are
    /// exact: an item with attributes of its own carries one digest per pair and a search asks for
    /// all of the query's digests; any other item shows `service` and `account` exactly as its index
    /// columns hold them. Nothing is decrypted — a search returns paths only, and reading an item
    /// (its secret or attributes) opens and re-checks it, group included, like every SecItem call.
    public func secretServiceSearch(
        _ query: SecretServiceAttributes, groups: [String],
        caller: Caller
    ) throws(KeychainError) -> (unlocked: [SecretServiceMatch], locked: [SecretServiceMatch]) {
        if let problem = query.problem { throw .param(problem) }
        let digests = try groupDigests(groups, caller)
        guard !digests.isEmpty else { return ([], []) }
        var unlocked: [SecretServiceMatch] = []
        var locked: [SecretServiceMatch] = []
        try itemStore.read { (r) throws(KeychainError) in
            for filter in try searchFilters(query, groupIndexes: digests.map(\.digest)) {
                try r.forEach(filter) { (row) throws(KeychainError) -> Bool in
                    let groupIndex = row.accessGroupIndex  // once: a row's getters copy the column
                    guard let group = digests.first(where: { $0.digest == groupIndex })?.group else {
                        return true
                    }
                    let match = SecretServiceMatch(id: row.ref, group: group)
                    if let protection = ProtectionClass(column: row.protectionClass),
                        itemVault.isAvailable(protection)
                    {
                        unlocked.append(match)
                    } else {
                        locked.append(match)
                    }
                    return true
                }
            }
        }
        let order = { (a: SecretServiceMatch, b: SecretServiceMatch) in a.id.lexicographicallyPrecedes(b.id) }
        return (unlocked.sorted(by: order), locked.sorted(by: order))
    }

    /// The secret of one item and its content type; nil when `groups` hold no such item. A locked
    /// item is errSecInteractionNotAllowed.
    public func secretServiceSecret(id: [UInt8], groups: [String], caller: Caller) throws(KeychainError) -> (
        secret: SecretBytes, contentType: String
    )? {
        let digests = try groupDigests(groups, caller)
        guard !digests.isEmpty, id.count == ItemService.itemIDLength else { return nil }
        var result: (secret: SecretBytes, contentType: String)?
        try itemStore.read { (r) throws(KeychainError) in
            try r.forEach(RowFilter(ref: id, accessGroupIndexes: digests.map(\.digest), includeSecret: true)) {
                (row) throws(KeychainError) -> Bool in
                let groupIndex = row.accessGroupIndex  // once: a row's getters copy the column
                guard let group = digests.first(where: { $0.digest == groupIndex })?.group else {
                    return false
                }
                if row.protectionClass >= ProtectionClass.presenceBit { throw Self.presenceRefused }
                let item = try itemCodec.open(row, withSecret: true)
                guard let view = view(item, group: group) else { return false }  // the secret wipes itself
                result = (item.secret ?? SecretBytes(), view.contentType)
                return false
            }
        }
        return result
    }

    /// Created: the oldest item's creation time; modified: the newest modification (creation times
    /// only while locked). Zero for an empty group.
    public func secretServiceGroupDates(group: String, caller: Caller) throws(KeychainError) -> (
        created: Double, modified: Double
    ) {
        let digests = try groupDigests([group], caller)
        var created = Double.infinity
        var modified = 0.0
        try itemStore.read { (r) throws(KeychainError) in
            try r.forEach(RowFilter(accessGroupIndexes: digests.map(\.digest))) { (row) throws(KeychainError) -> Bool in
                let item: SecretServiceItem?
                do throws(KeychainError) { item = try view(row, digests) } catch  where error.status == .decode {
                    return true
                }
                guard let item else { return true }
                created = min(created, item.created)
                modified = max(modified, item.modified)
                return true
            }
        }
        return created.isFinite ? (created, max(created, modified)) : (0, 0)
    }

    // MARK: Writing

    /// `CreateItem`: a new item in `group`, or with `replace` the item there whose attributes are
    /// exactly these (its label, secret and content type replaced). Attributes that are exactly a
    /// `service` and an `account` make a plain keychain item with that service and account (the item
    /// SecItem finds by them), unless that one exists already; any other attributes are kept as the
    /// item's own. Returns the item's id and whether it replaced one.
    public func secretServiceCreate(
        group: String, label: String, attributes: SecretServiceAttributes, secret: SecretBytes,
        contentType: String, replace: Bool, caller: Caller
    ) throws(KeychainError) -> (id: [UInt8], replaced: Bool) {
        if let problem = attributes.problem { throw .param(problem) }
        let digests = try groupDigests([group], caller)
        let protection = Self.secretServiceProtection
        guard itemVault.isAvailable(protection) else { throw Self.lockedError }
        let type = contentType.isEmpty ? SecretServiceFields.defaultContentType : contentType
        return try itemStore.write { (w) throws(KeychainError) -> (id: [UInt8], replaced: Bool) in
            if replace {
                var match: OpenedItem?
                for filter in try searchFilters(attributes, groupIndexes: digests.map(\.digest)) where match == nil {
                    try w.reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                        let item = try itemCodec.open(row, withSecret: false)
                        guard let v = view(item, group: group), v.attributes == attributes else { return true }
                        match = item
                        return false
                    }
                }
                if let item = match {
                    try rewrite(item, in: w, secret: secret) { (stored) throws(KeychainError) in
                        stored["labl"] = .text(label)
                        try Self.setContentType(type, attributes: attributes, in: &stored)
                    }
                    return (item.row.ref, true)
                }
            }
            let now = itemClock.next()
            let ref = ItemService.newItemID(createdAt: now)
            var stored: [String: Value] = [
                "agrp": .text(group), "pdmn": .text(protection.code), "sync": .bool(false),
                "cdat": .date(now), "mdat": .date(now), "labl": .text(label),
            ]
            func text(_ name: String) -> Value { .text(String(decoding: attributes[name] ?? [], as: UTF8.self)) }
            if type == SecretServiceFields.defaultContentType, let inet = NetworkPassword.attributes(for: attributes) {
                let row = try itemCodec.seal(
                    ref: ref, protection: protection, attributes: stored.merging(inet) { $1 }, secret: secret)
                do throws(KeychainError) {
                    try w.insert(row)
                    return (ref, false)
                } catch  where error.status == .duplicateItem {
                    // Taken (a second item with the same attributes): it keeps them as its own.
                }
            }
            if SecretServiceFields.isServiceAndAccount(attributes) && type == SecretServiceFields.defaultContentType {
                stored["svce"] = text(SecretServiceFields.serviceName)
                stored["acct"] = text(SecretServiceFields.accountName)
                let row = try itemCodec.seal(ref: ref, protection: protection, attributes: stored, secret: secret)
                do throws(KeychainError) {
                    try w.insert(row)
                    return (ref, false)
                } catch  where error.status == .duplicateItem {
                    // Taken (a second item with the same attributes): it keeps them as its own.
                }
            }
            stored["svce"] = text(SecretServiceFields.serviceName)
            stored["acct"] = .text(Self.hex(ref))
            stored["gena"] = .bytes(SecretServiceFields.encode(attributes, contentType: type))
            let row = try itemCodec.seal(ref: ref, protection: protection, attributes: stored, secret: secret)
            try w.insert(row)
            return (ref, false)
        }
    }

    /// `Item.SetSecret`: a new secret and content type.
    public func secretServiceSetSecret(
        id: [UInt8], groups: [String], secret: SecretBytes, contentType: String,
        caller: Caller
    ) throws(KeychainError) -> Bool {
        let type = contentType.isEmpty ? SecretServiceFields.defaultContentType : contentType
        return try modify(id: id, groups: groups, caller: caller, secret: secret) {
            (stored, view) throws(KeychainError) in
            try Self.setContentType(type, attributes: view.attributes, in: &stored)
        }
    }

    /// `Item.Label` set.
    public func secretServiceSetLabel(id: [UInt8], groups: [String], label: String, caller: Caller)
        throws(KeychainError) -> Bool
    {
        try modify(id: id, groups: groups, caller: caller, secret: nil) { (stored, _) throws(KeychainError) in
            stored["labl"] = .text(label)
        }
    }

    /// `Item.Attributes` set. An item with attributes of its own gets the new ones (its service and
    /// account stay). An item made through the keychain API takes a new `service` and `account` as its
    /// service and account; other attributes become its own, unless its `gena` holds the app's data.
    public func secretServiceSetAttributes(
        id: [UInt8], groups: [String], attributes: SecretServiceAttributes,
        caller: Caller
    ) throws(KeychainError) -> Bool {
        if let problem = attributes.problem { throw .param(problem) }
        return try modify(id: id, groups: groups, caller: caller, secret: nil) { (stored, view) throws(KeychainError) in
            if SecretServiceFields.isInternetPassword(stored) {
                guard let inet = NetworkPassword.attributes(for: attributes) else {
                    throw KeychainError(
                        .param,
                        "this item is an internet password: its attributes are those of the \(NetworkPassword.schema) schema, each set once and not empty"
                    )
                }
                stored["ptcl"] = nil
                stored["atyp"] = nil
                stored.merge(inet) { $1 }
                return
            }
            if !view.ownAttributes && SecretServiceFields.isServiceAndAccount(attributes) {
                stored["svce"] = .text(String(decoding: attributes[SecretServiceFields.serviceName]!, as: UTF8.self))
                stored["acct"] = .text(String(decoding: attributes[SecretServiceFields.accountName]!, as: UTF8.self))
                return
            }
            if !view.ownAttributes, stored["gena"] != nil {
                throw KeychainError(
                    .param,
                    "this item was made through the keychain API and keeps its app's data in kSecAttrGeneric; its Secret Service attributes are its service and account only"
                )
            }
            stored["gena"] = .bytes(SecretServiceFields.encode(attributes, contentType: view.contentType))
        }
    }

    /// `Item.Delete`. Returns whether the item was there.
    public func secretServiceDelete(id: [UInt8], groups: [String], caller: Caller) throws(KeychainError) -> Bool {
        let digests = try groupDigests(groups, caller)
        guard !digests.isEmpty, id.count == ItemService.itemIDLength else { return false }
        return try itemStore.write { (w) throws(KeychainError) -> Bool in
            var rowid: Int64?
            try w.reader.forEach(RowFilter(ref: id, accessGroupIndexes: digests.map(\.digest))) {
                (row) throws(KeychainError) -> Bool in
                rowid = row.rowid
                return false
            }
            guard let rowid else { return false }
            try w.delete(rowid: rowid)
            return true
        }
    }

    /// `Collection.Delete`: every item of the group. Returns their ids.
    public func secretServiceDeleteAll(group: String, caller: Caller) throws(KeychainError) -> [[UInt8]] {
        let digests = try groupDigests([group], caller)
        return try itemStore.write { (w) throws(KeychainError) -> [[UInt8]] in
            var rows: [(Int64, [UInt8])] = []
            try w.reader.forEach(RowFilter(accessGroupIndexes: digests.map(\.digest))) {
                (row) throws(KeychainError) -> Bool in
                rows.append((row.rowid, row.ref))
                return true
            }
            for (rowid, _) in rows { try w.delete(rowid: rowid) }
            return rows.map(\.1)
        }
    }

    static let lockedError = KeychainError(
        .interactionNotAllowed, "the keychain is locked: unlock it (keychainctl unlock)")

    /// Changes one item in place (`change` edits its stored attributes; `secret`, when given, replaces
    /// its secret). Returns false when `groups` hold no such item.
    private func modify(
        id: [UInt8], groups: [String], caller: Caller, secret: SecretBytes?,
        _ change: (inout [String: Value], SecretServiceItem) throws(KeychainError) -> Void
    ) throws(KeychainError) -> Bool {
        let digests = try groupDigests(groups, caller)
        guard !digests.isEmpty, id.count == ItemService.itemIDLength else { return false }
        return try itemStore.write { (w) throws(KeychainError) -> Bool in
            var found: (OpenedItem, SecretServiceItem)?
            // With the secret column: re-sealing under a fresh item key opens the unchanged secret.
            var filter = RowFilter(ref: id, accessGroupIndexes: digests.map(\.digest))
            filter.includeSecret = true
            try w.reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                let groupIndex = row.accessGroupIndex  // once: a row's getters copy the column
                guard let group = digests.first(where: { $0.digest == groupIndex })?.group else {
                    return false
                }
                let item = try itemCodec.open(row, withSecret: false)
                if let v = view(item, group: group) { found = (item, v) }
                return false
            }
            guard let (item, v) = found else { return false }
            try rewrite(item, in: w, secret: secret) { (stored) throws(KeychainError) in try change(&stored, v) }
            return true
        }
    }

    /// An item whose access control needs the person (kSecAttrAccessControl) is read and changed
    /// through SecItem calls, which ask; the bus has no way to ask for it.
    static let presenceRefused = KeychainError(
        .interactionNotAllowed,
        "the item's access control (kSecAttrAccessControl) needs the person's confirmation, which the Secret Service does not ask for; read it with SecItemCopyMatching"
    )

    /// Re-seals `item` with its attributes changed by `change`, a new modification date, and the new
    /// secret when given. A collision of the changed
    /// service and account with another item is errSecDuplicateItem.
    private func rewrite(
        _ item: OpenedItem, in w: StoreWriter, secret: SecretBytes?,
        _ change: (inout [String: Value]) throws(KeychainError) -> Void
    ) throws(KeychainError) {
        if secret != nil && item.row.protectionClass >= ProtectionClass.presenceBit { throw Self.presenceRefused }
        var stored = item.attributes
        try change(&stored)
        stored["mdat"] = .date(itemClock.next(after: item.attributes["mdat"]?.date))
        // A fresh item key, as every update (ItemService.update): the unchanged secret is opened to be
        // sealed again.
        let kept = secret == nil ? try itemCodec.open(item.row, withSecret: true, withAttributes: false).secret : nil
        let row = try itemCodec.seal(
            ref: item.row.ref, protection: item.protection, attributes: stored,
            secret: secret ?? kept ?? SecretBytes(), rowid: item.row.rowid)
        do throws(KeychainError) {
            try w.update(row)
        } catch  where error.status == .duplicateItem {
            throw KeychainError(.duplicateItem, "another item of this collection already has this service and account")
        }
    }

    /// Keeps a content type: in the item's own Secret Service fields; an item made through the keychain
    /// API gets fields of its own only when the type is not the default and its `gena` is free.
    static func setContentType(_ type: String, attributes: SecretServiceAttributes, in stored: inout [String: Value])
        throws(KeychainError)
    {
        if SecretServiceFields.isInternetPassword(stored) {
            guard type == SecretServiceFields.defaultContentType else {
                throw KeychainError(
                    .param, "an internet password's secret is text/plain; it takes no other content type")
            }
            return
        }
        if SecretServiceFields.decode(stored["gena"]) != nil {
            stored["gena"] = .bytes(
                SecretServiceFields.encode(SecretServiceFields.decode(stored["gena"])!.attributes, contentType: type))
        } else if type != SecretServiceFields.defaultContentType && stored["gena"] == nil {
            stored["gena"] = .bytes(SecretServiceFields.encode(attributes, contentType: type))
        }
    }
}

/// An item of a group that is not the caller's, as the yes/no dialog names it
/// (`secretServiceForeignItems` "confirm"; docs/secret-service.md).
public struct SecretServiceForeignItem: Sendable {
    /// The access group it lives in: whose item it is.
    public var group: String
    /// Its label (`labl`).
    public var label: String
    /// The attributes the Secret Service shows for it (`service` and `account` for a SecItem item).
    public var attributes: SecretServiceAttributes
}

extension ItemService {
    /// The items of groups other than `own` whose attributes include every pair of `query`, oldest
    /// first: ids only, found through the keyed indexes as `secretServiceSearch`, nothing decrypted.
    /// Never for an empty query (that would list every item of the keychain), and never an item
    /// whose access control needs the person (those are not served on the bus at all).
    public func secretServiceForeignSearch(
        _ query: SecretServiceAttributes, excluding own: [String], caller: Caller
    ) throws(KeychainError) -> [[UInt8]] {
        if let problem = query.problem { throw .param(problem) }
        guard !query.isEmpty else { return [] }
        let mine = try groupDigests(own, caller).map(\.digest)
        var ids: [[UInt8]] = []
        try itemStore.read { (r) throws(KeychainError) in
            for filter in try searchFilters(query, groupIndexes: nil) {
                try r.forEach(filter) { (row) throws(KeychainError) -> Bool in
                    let groupIndex = row.accessGroupIndex  // once: a row's getters copy the column
                    if !mine.contains(groupIndex) && row.protectionClass < ProtectionClass.presenceBit {
                        ids.append(row.ref)
                    }
                    return true
                }
            }
        }
        return ids.sorted { $0.lexicographicallyPrecedes($1) }
    }

    /// The item `id` of a group other than `own`, opened to name it in a dialog: nil when there is
    /// none (gone, in one of `own`, or guarded by `.userPresence`); errSecInteractionNotAllowed
    /// while its class key is unavailable (the keychain is locked).
    public func secretServiceForeignItem(id: [UInt8], excluding own: [String], caller: Caller) throws(KeychainError)
        -> SecretServiceForeignItem?
    {
        let mine = try groupDigests(own, caller).map(\.digest)
        guard id.count == ItemService.itemIDLength else { return nil }
        var found: SecretServiceForeignItem?
        try itemStore.read { (r) throws(KeychainError) in
            try r.forEach(RowFilter(ref: id)) { (row) throws(KeychainError) -> Bool in
                let groupIndex = row.accessGroupIndex
                guard !mine.contains(groupIndex), row.protectionClass < ProtectionClass.presenceBit else {
                    return false
                }
                guard let protection = ProtectionClass(column: row.protectionClass), itemVault.isAvailable(protection)
                else {
                    throw KeychainError(.interactionNotAllowed, "the keychain is locked")
                }
                let item = try itemCodec.open(row, withSecret: false)
                // The group as the item itself says (a forged group column buys nothing).
                guard let agrp = item.attributes["agrp"]?.text,
                    !own.contains(where: { AccessPolicy.sameGroup($0, agrp) }),
                    let view = view(item, group: agrp)
                else { return false }
                found = SecretServiceForeignItem(group: agrp, label: view.label, attributes: view.attributes)
                return false
            }
        }
        return found
    }
}
