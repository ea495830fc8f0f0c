public import KeychainCore
public import KeychainCrypto
import KeychainStore
public import KeychainSystem

/// What sync (docs/sync.md) reads from and writes to the store: the synchronizable items of the
/// classes that may leave the device, with their attributes, access group and secret — the shape a
/// backup carries — and the versions other devices wrote.
extension ItemService {
    /// The classes whose synchronizable items travel: every class but the ThisDeviceOnly ones.
    public static let synchronizedClasses = ProtectionClass.allCases.filter { !$0.isThisDeviceOnly }

    /// One synchronizable item as sync carries it: stored attributes (no persistent reference) and secret.
    public struct SyncedItem: Sendable, CustomStringConvertible {
        /// The stored attributes, without the persistent reference.
        public var attributes: [String: Value]
        /// The item's secret.
        public var secret: SecretBytes
        /// An item of these attributes and secret.
        public init(attributes: [String: Value], secret: SecretBytes) {
            self.attributes = attributes
            self.secret = secret
        }
        /// The item class (`genp` unless the item says otherwise).
        public var itemClass: String { attributes["class"]?.text ?? "genp" }
        /// What makes the item one item on every device: its class's code, then the value of each
        /// attribute of the class's uniqueness key (`ItemClass.uniqueness`: access group, service and
        /// account for a generic password; access group, account, server, protocol, authentication
        /// type, port, path, security domain for an internet password; and `sync`), as the store's
        /// uniqueness digest takes them (an absent attribute is its default). Nil for a class this
        /// daemon does not know.
        public var identity: [[UInt8]]? {
            guard let c = ItemCodec.itemClass(of: attributes) else { return nil }
            return [Array(c.code.utf8)] + ItemCodec.uniqueParts(c, attributes)
        }
        /// The shape only: never an attribute's value or the secret.
        public var description: String { "synced item (\(attributes.count) attributes, secret \(secret.count) bytes)" }
    }

    /// A version from another device to make local.
    public enum SyncChange: Sendable {
        /// Add the item, or replace the one of the same identity (`SyncedItem.identity`).
        case put(SyncedItem)
        /// Delete the item of this identity (`SyncedItem.identity`), if any.
        case remove(identity: [[UInt8]])
    }

    /// Apple's rule: a synchronizable item may not be of a ThisDeviceOnly class (those cannot leave the
    /// device). Such an add or update is errSecParam and changes nothing.
    static func checkSynchronizable(_ synchronizable: Bool, _ protection: ProtectionClass) throws(KeychainError) {
        guard synchronizable, protection.isThisDeviceOnly else { return }
        throw .param(
            "a synchronizable item cannot be of a ThisDeviceOnly class (\(protection.code)): such items never leave the device"
        )
    }

    /// Changes with every write transaction that finishes (see `ItemStore.writeGeneration`).
    public var writeGeneration: UInt64 { store.writeGeneration }

    /// Whether the synchronized classes are open (sync waits for the first unlock otherwise).
    public var synchronizedClassesAvailable: Bool { Self.synchronizedClasses.allSatisfy { vault.isAvailable($0) } }

    /// Every item with `sync` true of the synchronized classes. errSecInteractionNotAllowed while
    /// those classes are locked. Rows that fail to open are left out (they are reported by the row
    /// checks elsewhere) and counted.
    public func synchronizableItems() throws(KeychainError) -> (items: [SyncedItem], damaged: Int) {
        guard synchronizedClassesAvailable else {
            throw KeychainError(.interactionNotAllowed, "the keychain is locked: sync waits for it to be unlocked")
        }
        var items: [SyncedItem] = []
        var damaged = 0
        let filter = RowFilter(classes: Self.synchronizedClasses.map(\.rawValue), includeSecret: true)
        try store.read { (r) throws(KeychainError) in
            try r.forEach(filter) { (row) throws(KeychainError) -> Bool in
                do throws(KeychainError) {
                    let item = try codec.open(row, withSecret: true)
                    if item.attributes["sync"]?.bool == true {
                        items.append(SyncedItem(attributes: item.attributes, secret: item.secret ?? SecretBytes()))
                    }
                } catch  where error.status == .decode {
                    damaged += 1
                }
                return true
            }
        }
        return (items, damaged)
    }

    /// Applies other devices' versions in one transaction. A put's attributes must be what this daemon
    /// stores (checked as a backup's are) and of a synchronized class with `sync` true; one that is
    /// not is left out (and counted), the others are applied. The local item keeps its persistent
    /// reference. Returns how many were left out.
    @discardableResult
    public func applySynced(_ given: [SyncChange]) throws(KeychainError) -> Int {
        let changes = given.filter { change in
            guard case .put(let item) = change else { return true }
            guard item.identity != nil, let attributes = try? Self.validatedBackupAttributes(item.attributes, index: 0)
            else { return false }
            return attributes["sync"]?.bool == true
        }
        let leftOut = given.count - changes.count
        guard !changes.isEmpty else { return leftOut }
        try store.write { (w) throws(KeychainError) in
            let index = try vault.indexer()
            // The synchronizable items present, by key.
            var present: [[[UInt8]]: (rowid: Int64, ref: [UInt8])] = [:]
            let filter = RowFilter(classes: Self.synchronizedClasses.map(\.rawValue))
            try w.reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                if let item = try? codec.open(row, withSecret: false), item.attributes["sync"]?.bool == true {
                    if let k = SyncedItem(attributes: item.attributes, secret: SecretBytes()).identity {
                        present[k] = (row.rowid, row.ref)
                    }
                }
                return true
            }
            for change in changes {
                switch change {
                case .put(let item):
                    guard let k = item.identity else { continue }
                    let protection = ProtectionClass(code: item.attributes["pdmn"]?.text ?? "")!
                    if let existing = present[k] {
                        let row = try codec.seal(
                            ref: existing.ref, protection: protection, attributes: item.attributes, secret: item.secret,
                            rowid: existing.rowid, indexer: index)
                        try w.update(row)
                    } else {
                        let ref = PersistentRef.newID(createdAt: item.attributes["cdat"]?.date ?? 0)
                        let row = try codec.seal(
                            ref: ref, protection: protection, attributes: item.attributes, secret: item.secret,
                            indexer: index)
                        do throws(KeychainError) {
                            let rowid = try w.insert(row)
                            present[k] = (rowid, ref)
                        } catch  where error.status == .duplicateItem {
                            // A local item of a ThisDeviceOnly class holds the key: it stays, unsynced.
                            continue
                        }
                    }
                case .remove(let k):
                    if let existing = present[k] {
                        try w.delete(rowid: existing.rowid)
                        present[k] = nil
                    }
                }
            }
        }
        return leftOut
    }
}

/// The sync key's own keeping: an item of class `aku` (WhenUnlockedThisDeviceOnly: bound to this
/// device and, with a passphrase set, readable only while unlocked) in an access group of keychaind's
/// own, never synchronizable. Whoever could read it could read the sync folder; so it is kept as the
/// keychain's own items are, not in a file beside them.
extension ItemService {
    /// The access group of keychaind's sync key item.
    public static let syncKeyGroup = "com.keychaind.sync"
    static let syncKeyService = "sync-key"

    /// The stored sync key record (nil when none); errSecInteractionNotAllowed while locked.
    public func syncKeyRecord() throws(KeychainError) -> SecretBytes? {
        try syncRecord(Self.syncKeyService)
    }

    /// Replaces the stored sync key record (nil: removes it).
    public func setSyncKeyRecord(_ record: SecretBytes?) throws(KeychainError) {
        try setSyncRecord(Self.syncKeyService, label: "keychaind sync key", record)
    }

    static let syncSigningKeyService = "sync-signing-key"

    /// This device's sync signing key (Ed25519 secret key; nil when none yet), kept as the sync key
    /// is; errSecInteractionNotAllowed while locked.
    public func syncSigningKeyRecord() throws(KeychainError) -> SecretBytes? {
        try syncRecord(Self.syncSigningKeyService)
    }

    /// Stores this device's sync signing key (made once; leaving sync keeps it).
    public func setSyncSigningKeyRecord(_ record: SecretBytes) throws(KeychainError) {
        try setSyncRecord(Self.syncSigningKeyService, label: "keychaind sync signing key", record)
    }

    private func syncRecord(_ service: String) throws(KeychainError) -> SecretBytes? {
        guard vault.isAvailable(.whenUnlockedThisDeviceOnly) else {
            throw KeychainError(
                .interactionNotAllowed, "the keychain is locked: the sync key is readable once unlocked")
        }
        var found: SecretBytes?
        let filter = RowFilter(classes: [ProtectionClass.whenUnlockedThisDeviceOnly.rawValue], includeSecret: true)
        try store.read { (r) throws(KeychainError) in
            try r.forEach(filter) { (row) throws(KeychainError) -> Bool in
                guard let item = try? codec.open(row, withSecret: true),
                    item.attributes["agrp"]?.text == Self.syncKeyGroup,
                    item.attributes["svce"]?.text == service
                else { return true }
                found = item.secret
                return false
            }
        }
        return found
    }

    private func setSyncRecord(_ service: String, label: String, _ record: SecretBytes?) throws(KeychainError) {
        let now = clock.next()
        let attributes: [String: Value] = [
            "agrp": .text(Self.syncKeyGroup), "svce": .text(service), "acct": .text(""),
            "pdmn": .text(ProtectionClass.whenUnlockedThisDeviceOnly.code), "sync": .bool(false),
            "cdat": .date(now), "mdat": .date(now), "labl": .text(label),
        ]
        try store.write { (w) throws(KeychainError) in
            let filter = RowFilter(classes: [ProtectionClass.whenUnlockedThisDeviceOnly.rawValue])
            var rowids: [Int64] = []
            try w.reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                if let item = try? codec.open(row, withSecret: false),
                    item.attributes["agrp"]?.text == Self.syncKeyGroup,
                    item.attributes["svce"]?.text == service
                {
                    rowids.append(row.rowid)
                }
                return true
            }
            for rowid in rowids { try w.delete(rowid: rowid) }
            if let record {
                let row = try codec.seal(
                    ref: PersistentRef.newID(createdAt: now), protection: .whenUnlockedThisDeviceOnly,
                    attributes: attributes, secret: record)
                _ = try w.insert(row)
            }
        }
    }
}
