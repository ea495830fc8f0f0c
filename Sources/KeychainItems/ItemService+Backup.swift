public import KeychainCore
public import KeychainCrypto
import KeychainStore
import KeychainSystem

/// Backup and restore (docs/backup.md): every item of the classes a backup may carry, in one file
/// encrypted under its own passphrase, and back.
extension ItemService {
    /// The classes a backup carries: every class but the ThisDeviceOnly ones (aku, cku, dku, akpu).
    public static let backedUpClasses = ProtectionClass.allCases.filter { !$0.isThisDeviceOnly }

    /// Every item of the backed-up classes, of every access group, with attributes (dates included),
    /// secret and persistent-reference id, encrypted under `passphrase` (docs/backup.md). Needs those
    /// classes unlocked (errSecInteractionNotAllowed otherwise). Rows that fail to decrypt are left out
    /// and counted in the metadata (`damaged`).
    public func backup(passphrase: SecureBytes) throws(KeychainError) -> [UInt8] {
        for c in Self.backedUpClasses where !vault.isAvailable(c) {
            throw KeychainError(.interactionNotAllowed, "the keychain is locked: unlock it before making a backup")
        }
        var items: [OpenedItem] = []
        var damaged = 0
        let filter = RowFilter(classes: Self.backedUpClasses.flatMap(\.columnValues), includeSecret: true)
        try store.read { (r) throws(KeychainError) in
            try r.forEach(filter) { (row) throws(KeychainError) -> Bool in
                do throws(KeychainError) { items.append(try codec.open(row, withSecret: true)) } catch
                    where error.status == .decode
                {
                    damaged += 1
                }
                return true
            }
        }
        let writer = try BackupFile.Writer(
            passphrase: passphrase, parameters: .fresh(kdfProfile),
            metadata: [
                "format": .text("keychaind-backup"), "created": .date(wallClock()),
                "items": .int(Int64(items.count)), "damaged": .int(Int64(damaged)),
                "classes": .array(Self.backedUpClasses.map { .text($0.code) }),
            ])
        for item in items {
            writer.append(ref: item.row.ref, attributes: item.attributes, secret: item.secret ?? SecretBytes())
        }
        return writer.finish()
    }

    /// Restores a backup's items. The whole file is decrypted and checked before anything is written,
    /// then every item goes in one transaction, with its attributes, dates and (when no other item
    /// holds it) persistent reference. **Rule for items that already exist** (same class, service,
    /// account, access group and synchronizable value): the existing item is kept unchanged and the
    /// backup's copy is counted as skipped. Returns the counts.
    public func restore(passphrase: SecureBytes, data: [UInt8]) throws(KeychainError) -> (restored: Int, skipped: Int) {
        for c in Self.backedUpClasses where !vault.isAvailable(c) {
            throw KeychainError(.interactionNotAllowed, "the keychain is locked: unlock it before restoring a backup")
        }
        var contents = try BackupFile.open(data, passphrase: passphrase)
        for i in contents.items.indices {
            contents.items[i].attributes = try Self.validatedBackupAttributes(contents.items[i].attributes, index: i)
            guard contents.items[i].ref.count == PersistentRef.idLength else {
                throw KeychainError(.decode, "backup item \(i + 1) has a malformed persistent reference")
            }
        }
        return try store.write { (w) throws(KeychainError) -> (restored: Int, skipped: Int) in
            var restored = 0
            var skipped = 0
            for item in contents.items {
                let protection = ProtectionClass(code: item.attributes["pdmn"]!.text!)!
                var ref = item.ref
                var taken = false
                try w.reader.forEach(RowFilter(ref: ref)) { (_) throws(KeychainError) -> Bool in
                    taken = true
                    return false
                }
                if taken { ref = Sodium.randomBytes(PersistentRef.idLength) }
                let row = try codec.seal(
                    ref: ref, protection: protection, attributes: item.attributes, secret: item.secret)
                do throws(KeychainError) {
                    try w.insert(row)
                    restored += 1
                } catch  where error.status == .duplicateItem {
                    skipped += 1
                }
            }
            return (restored, skipped)
        }
    }

    /// A backup's attribute map must look exactly like what this daemon stores: known attributes in
    /// their stored form, the required ones present, and a class that backups may carry.
    static func validatedBackupAttributes(_ attributes: [String: Value], index: Int) throws(KeychainError) -> [String:
        Value]
    {
        let bad = KeychainError(.decode, "backup item \(index + 1) has malformed attributes")
        guard let itemClass = ItemCodec.itemClass(of: attributes) else { throw bad }
        for (key, value) in attributes where key != "class" {
            guard let attribute = Attribute(key, of: itemClass) else { throw bad }
            guard let normalized = try? attribute.normalize(value), normalized == value else { throw bad }
        }
        guard case .text(let group)? = attributes["agrp"], !group.isEmpty,
            case .text(let code)? = attributes["pdmn"], let protection = ProtectionClass(code: code),
            backedUpClasses.contains(protection),
            case .bool? = attributes["sync"], case .date? = attributes["cdat"], case .date? = attributes["mdat"],
            itemClass.defaults.keys.allSatisfy({ attributes[$0] != nil })
        else { throw bad }
        return attributes
    }
}
