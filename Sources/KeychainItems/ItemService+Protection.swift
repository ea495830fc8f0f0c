public import KeychainCore
public import KeychainCrypto
import KeychainStore
import KeychainSystem
import Synchronization

/// The keychain's protection state, as `status` reports it.
public struct ProtectionStatus: Sendable, Equatable {
    /// A passphrase is set and the WhenUnlocked classes are not available.
    public var locked: Bool
    /// Whether a keychain passphrase has been set.
    public var passphraseSet: Bool
    /// `pdmn` code → whether items of that class can be used now.
    public var classes: [String: Bool]
    /// Wrong passphrases since the last right one (kept across restarts).
    public var failedUnlocks: Int
    /// Seconds until the next unlock attempt is accepted (0: now).
    public var unlockDelay: Double
}

/// Passphrase, lock states and the wrong-passphrase delay (backups: ItemService+Backup.swift).
///
/// Unlock, passphrase changes and the failure counter run one at a time (`protectionLock`); the
/// Argon2id derivations inside them are also one at a time process-wide (`PasswordHash`).
extension ItemService {
    static let failuresMeta = "unlock-failures"

    /// The wall-clock time in seconds since the epoch: the clock the wrong-passphrase delay uses.
    @Sendable public static func systemTime() -> Double {
        WallClock.now()
    }

    // MARK: State

    /// The lock state, class availability and wrong-passphrase delay now; never touches a secret.
    public var protectionStatus: ProtectionStatus {
        var classes: [String: Bool] = [:]
        for c in ProtectionClass.allCases { classes[c.code] = vault.isAvailable(c) }
        let failures = (try? loadFailures()) ?? Failures(count: 0, last: 0)
        return ProtectionStatus(
            locked: vault.isLocked, passphraseSet: vault.hasPassphrase, classes: classes,
            failedUnlocks: failures.count, unlockDelay: failures.remaining(now: wallClock()))
    }

    /// Whether the keychain is locked (a passphrase is set and the WhenUnlocked classes are unavailable).
    public var isLocked: Bool { vault.isLocked }
    /// Whether a keychain passphrase has been set.
    @inlinable @inline(__always) public var hasPassphrase: Bool { vault.hasPassphrase }

    // MARK: Lock and unlock

    /// Apple's lock: the WhenUnlocked class keys (ak, aku, akpu) are dropped from memory (zeroed);
    /// AfterFirstUnlock and Always stay. Without a passphrase there is nothing to unlock with later:
    /// errSecParam, nothing changes.
    public func lock() throws(KeychainError) {
        guard vault.lockWhenUnlockedClasses() else {
            throw KeychainError(
                .param, "no passphrase is set, so the keychain cannot be locked; set one with `keychainctl passwd`")
        }
        locks.add(1, ordering: .releasing)
    }

    /// How many times the keychain has locked since it opened (a confirmation of the person's
    /// presence counts until the next lock only).
    public var lockCount: Int { locks.load(ordering: .acquiring) }

    /// Lock if a passphrase is set and the keychain is unlocked (auto-lock). Returns whether it locked.
    @discardableResult
    public func lockIfUnlocked() -> Bool {
        guard vault.hasPassphrase, !vault.isLocked, vault.lockWhenUnlockedClasses() else { return false }
        locks.add(1, ordering: .releasing)
        return true
    }

    /// Unlocks with the passphrase (Argon2id, so this takes the profile's time). A wrong passphrase is
    /// errSecAuthFailed and counts towards the escalating delay; while a delay is in force the
    /// passphrase is not even tried (errSecAuthFailed at once, saying how long to wait). Without a
    /// passphrase set this succeeds: the keychain is always unlocked then.
    ///
    /// The first unlock of a keychain whose rows are still searched with the device index key (its
    /// passphrase was set by a keychaind without the passphrase index key) migrates it: every row is
    /// sealed again with its digests keyed by a fresh passphrase index key, in one transaction with
    /// the keyring that holds that key, so a crash leaves the old or the new index, never a mix. A
    /// failure there is reported, and the keychain stays unlocked and searchable as before; the next
    /// unlock tries again.
    public func unlock(passphrase: SecureBytes) throws(KeychainError) {
        try protectionLock.withLock { (_) throws(KeychainError) in
            guard vault.hasPassphrase else { return }
            try checkNoDelay()
            let migration: Vault.PendingIndex?
            do throws(KeychainError) {
                migration = try vault.unlock(passphrase: passphrase)
            } catch  where error.status == .authFailed {
                throw try recordFailure()
            }
            try clearFailures()
            if let migration { try migrateIndex(migration) }
        }
    }

    /// Re-keys every row's digests with `migration.indexer` and stores its keyring, then puts it in force.
    private func migrateIndex(_ migration: Vault.PendingIndex) throws(KeychainError) {
        let afterRow = testHooks.withLock { $0.afterRewrappedRow }
        do {
            try store.writeAlone(
                { (w) throws(KeychainError) in
                    try w.setMeta("keyring", migration.keyring)
                    try reseal(w, indexer: migration.indexer, openWith: nil, sealWith: nil, afterRow: afterRow)
                }, committed: { vault.adopt(migration) })
        } catch {
            throw KeychainError(
                error.status,
                "the keychain is unlocked, but moving its search index under the passphrase failed (it stays under device.key until the next unlock tries again): \(error.message)"
            )
        }
        // The digests keyed by the device index key are still in the WAL: fold it into the database
        // (secure_delete overwrote the freed pages) and truncate it.
        store.truncateLog()
    }

    /// Seals every row again (a fresh item key, the same attributes and secret) with its digests
    /// computed by `indexer`, one row at a time in rowid order: the item keys open with `openWith`
    /// (nil: the vault's keys) and are sealed under `sealWith` (nil: the vault's). A row that does not
    /// open because it is damaged is left as it is (it did not open before either); any other error
    /// fails the caller's transaction. Runs inside the caller's transaction; returns how many rows.
    @discardableResult
    func reseal(
        _ w: StoreWriter, indexer: BlindIndexer, openWith: ((ProtectionClass) -> SecureBytes?)?,
        sealWith: ((ProtectionClass) -> SecureBytes?)?, afterRow: (@Sendable (Int) throws(KeychainError) -> Void)?
    ) throws(KeychainError) -> Int {
        // The refs laid end to end in one array (16 bytes an item, no array per item), then each row
        // read, opened and written one at a time: memory stays flat but for them.
        var refs: [UInt8] = []
        try w.reader.forEach(RowFilter(includeSecret: false, includeSearchIndexes: false, includeAttributes: false)) {
            (row) throws(KeychainError) -> Bool in
            let ref = row.ref
            guard ref.count == PersistentRef.idLength else { return true }  // damaged: no row opens it
            refs.append(contentsOf: ref)
            return true
        }
        var count = 0
        for at in stride(from: 0, to: refs.count, by: PersistentRef.idLength) {
            let ref = Array(refs[at..<at + PersistentRef.idLength])
            var found: StoredItem?
            try w.reader.forEach(RowFilter(ref: ref, includeSecret: true, includeSearchIndexes: false)) {
                (row) throws(KeychainError) -> Bool in
                found = row
                return false
            }
            guard let row = found else { continue }
            let item: OpenedItem
            do throws(KeychainError) {
                item = try codec.open(row, withSecret: true, classKey: openWith)
            } catch  where error.status == .decode {
                continue
            }
            let classKey: SecureBytes?
            if let sealWith {
                guard let k = sealWith(item.protection) else {
                    throw KeychainError(.internal, "no \(item.protection.code) class key to seal an item with")
                }
                classKey = k
            } else {
                classKey = nil
            }
            let resealed = try codec.seal(
                ref: row.ref, protection: item.protection, attributes: item.attributes,
                secret: item.secret ?? SecretBytes(), rowid: row.rowid, classKey: classKey, indexer: indexer)
            try w.update(resealed)
            count += 1
            try afterRow?(count)
        }
        return count
    }

    // MARK: Passphrase

    /// Sets, changes (`new`) or removes (`new == nil`) the passphrase. `old` must be the current one
    /// when one is set (it counts as an unlock attempt: delays apply); ignored when none is set.
    ///
    /// **Rotation.** Setting or changing it draws fresh class keys for ak, ck, aku, cku and akpu and
    /// re-wraps the item key of every item of those classes under them (the items' attributes and
    /// secrets are not touched), so a copy of the keyring from before the change opens nothing written
    /// after it. Every change also draws a fresh registry key and re-seals the approved registrations
    /// under it: `approving` replaces them (setting the first passphrase passes those the admin
    /// confirmed, possibly none); nil keeps the stored list (a stored list that no longer opens is replaced
    /// by an empty one). Removing the passphrase deletes every `akpu` item instead (Apple: they exist
    /// only while a passcode is set) and keeps the other class keys.
    ///
    /// Everything happens in one SQLite transaction, committed alone, so a crash or a failure at any
    /// row leaves the old or the new passphrase in force, never neither. Rows are re-wrapped a batch at
    /// a time (memory stays flat); the writer is held meanwhile, so other writes wait, and reads carry
    /// on until the commit, which puts the new keys in force for every reader at once. Returns how many
    /// `akpu` items went. The lock state is kept (removing the passphrase unlocks, since nothing could
    /// unlock later).
    @discardableResult
    public func changePassphrase(
        old: SecureBytes?, new: SecureBytes?,
        approving: [ApprovedRegistration]? = nil
    ) throws(KeychainError) -> Int {
        try protectionLock.withLock { (_) throws(KeychainError) -> Int in
            let hadPassphrase = vault.hasPassphrase
            if hadPassphrase {
                guard old != nil else {
                    throw KeychainError(
                        .authFailed, "a passphrase is set: the current one (\"old\") is needed to change it")
                }
                try checkNoDelay()
            }
            if !hadPassphrase && new == nil { return 0 }
            let approved = approving.map(ApprovedRegistration.encode)
            let pending: Vault.PendingChange
            do throws(KeychainError) {
                pending = try vault.preparePassphraseChange(old: old, new: new, profile: kdfProfile)
            } catch  where error.status == .authFailed && hadPassphrase {
                throw try recordFailure()
            }
            let afterRow = testHooks.withLock { $0.afterRewrappedRow }
            if pending.removesPassphrase { vault.setRemovingPassphrase(true) }
            let removed: Int
            do throws(KeychainError) {
                removed = try store.writeAlone(
                    { (w) throws(KeychainError) -> Int in
                        try w.setMeta("keyring", pending.keyring)
                        try w.deleteMeta(Self.failuresMeta)
                        let removed =
                            pending.removesPassphrase
                            ? try w.deleteItems(protectionClass: ProtectionClass.whenPasscodeSetThisDeviceOnly.rawValue)
                            : 0
                        if pending.reindexes {
                            // The digests' key changes: every row sealed again (under the new class keys).
                            try reseal(
                                w, indexer: pending.indexer, openWith: { pending.previousClassKey($0) },
                                sealWith: { pending.classKey($0) }, afterRow: afterRow)
                        }
                        var rewrapped = 0
                        try w.rewrapItemKeys(
                            classes: pending.reindexes ? [] : pending.rotatedClasses.flatMap(\.columnValues)
                        ) {
                            (row) throws(KeychainError) -> [UInt8]? in
                            guard let protection = ProtectionClass(column: row.protectionClass),
                                let sealing = ItemSealing(sealedItemKey: row.sealed)
                            else { return nil }  // damaged: it did not open before the change and will not after
                            let ad = ItemCodec.associatedData(
                                ref: row.ref, column: row.protectionClass, part: .itemKey,
                                uniqueIndex: row.uniqueIndex, sealing: sealing)
                            let replacement: [UInt8]
                            do throws(KeychainError) {
                                replacement = try pending.rewrapItemKey(
                                    row.sealed, protection: protection, associatedData: ad)
                            } catch  where error.status == .decode {
                                // Damaged (it failed authentication, so it did not open before the change
                                // and will not after). Any other error — a crypto library that cannot run —
                                // fails the whole change, which then leaves every row as it was.
                                return nil
                            }
                            rewrapped += 1
                            try afterRow?(rewrapped)
                            return replacement
                        }
                        let list: [UInt8]?
                        if let approved {
                            list = approved
                        } else if let stored = try w.reader.meta(Self.registrationsMeta) {
                            list =
                                pending.previousRegistryKey.flatMap { try? Vault.openRegistry(stored, key: $0) }
                                ?? ApprovedRegistration.encode([])
                        } else {
                            list = nil
                        }
                        if let list {
                            try w.setMeta(Self.registrationsMeta, Vault.sealRegistry(list, key: pending.registryKey))
                        }
                        return removed
                    }, committed: { vault.adopt(pending) })
            } catch {
                vault.setRemovingPassphrase(false)
                throw error
            }
            // The old keyring's pages are still in the WAL; fold them into the database (where
            // secure_delete overwrote them) and truncate the WAL, so a copy of the disk does not
            // keep the keyring wrapped under the old passphrase.
            store.truncateLog()
            return removed
        }
    }

    // MARK: Wrong-passphrase delays

    /// Seconds to wait before the next attempt after `failures` wrong passphrases in a row: none for
    /// the first four, then 1 s, 5 s, 15 s, 1 min, 5 min, and 15 min from the tenth on (the shape of
    /// Apple's escalation, shorter because each guess already costs an Argon2id derivation).
    public static func unlockDelay(afterFailures failures: Int) -> Double {
        switch failures {
        case ..<5: return 0
        case 5: return 1
        case 6: return 5
        case 7: return 15
        case 8: return 60
        case 9: return 300
        default: return 900
        }
    }

    struct Failures {
        var count: Int
        /// Wall-clock time of the last failure.
        var last: Double

        func remaining(now: Double) -> Double {
            let delay = ItemService.unlockDelay(afterFailures: count)
            guard delay > 0 else { return 0 }
            // A clock set back must not stretch the wait beyond the delay itself.
            let elapsed = max(0, now - last)
            return max(0, delay - elapsed)
        }
    }

    func loadFailures() throws(KeychainError) -> Failures {
        guard let bytes = try store.meta(Self.failuresMeta),
            let map = (try? CBOR.decode(bytes))?.map, let count = map["count"]?.int
        else {
            return Failures(count: 0, last: 0)
        }
        let last: Double
        switch map["last"] {
        case .date(let d)?: last = d
        case .float(let d)?: last = d
        case .int(let i)?: last = Double(i)
        default: last = 0
        }
        return Failures(count: Int(clamping: max(0, count)), last: last)
    }

    func checkNoDelay() throws(KeychainError) {
        let remaining = try loadFailures().remaining(now: wallClock())
        if remaining > 0 {
            throw KeychainError(
                .authFailed,
                "too many wrong passphrases: try again in \(Self.seconds(remaining)) (the passphrase was not checked)")
        }
    }

    /// Counts one wrong passphrase (persisted before answering) and returns the error to throw.
    func recordFailure() throws(KeychainError) -> KeychainError {
        var failures = try loadFailures()
        failures.count += 1
        failures.last = wallClock()
        let encoded = CBOR.encode(.map(["count": .int(Int64(failures.count)), "last": .date(failures.last)]))
        try store.write { (w) throws(KeychainError) in try w.setMeta(Self.failuresMeta, encoded) }
        let delay = Self.unlockDelay(afterFailures: failures.count)
        let plural = failures.count == 1 ? "" : "s"
        return KeychainError(
            .authFailed,
            delay > 0
                ? "wrong passphrase (\(failures.count) failed attempt\(plural) in a row); the next attempt is accepted in \(Self.seconds(delay))"
                : "wrong passphrase (\(failures.count) failed attempt\(plural) in a row)")
    }

    func clearFailures() throws(KeychainError) {
        guard try store.meta(Self.failuresMeta) != nil else { return }
        try store.write { (w) throws(KeychainError) in try w.deleteMeta(Self.failuresMeta) }
    }

    static func seconds(_ s: Double) -> String {
        let whole = Int(s.rounded(.up))
        return whole == 1 ? "1 second" : "\(whole) seconds"
    }
}
