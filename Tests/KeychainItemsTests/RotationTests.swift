import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainSystem
import Testing

@testable import KeychainItems
@testable import KeychainStore

extension ProtectedFixture {
    /// The `keyring` meta value as it is now (what a copy of the database taken now would hold).
    func keyring() throws -> [UInt8] {
        try #require(try service.store.meta("keyring"))
    }

    /// What someone holding `device.key` and a saved keyring value can unlock: the vault that keyring
    /// opens to, unlocked with `passphrase` when the keyring had one.
    func vault(fromKeyring keyring: [UInt8], passphrase: String?) throws -> Vault {
        let deviceKey = try #require(try DeviceKeyFile.load(path: directory + "/" + ItemService.deviceKeyName))
        let vault = try Vault.open(deviceKey: deviceKey, keyring: keyring)
        if let passphrase { try vault.unlock(passphrase: pass(passphrase)) }
        return vault
    }

    /// Every item's secret, by account, read as an administrator.
    func allSecrets() throws -> [String: String] {
        let all: [String: Value] = [
            "class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            "r_Data": .bool(true),
        ]
        var out: [String: String] = [:]
        for entry in try service.copyMatching(all, caller: Fixture.admin)?.array ?? [] {
            guard let map = entry.map, let account = map["acct"]?.text,
                let data = map["v_Data"]?.secretBytes?.unprotectedArray
            else { continue }
            out[account] = String(decoding: data, as: UTF8.self)
        }
        return out
    }
}

/// Runs `body` with the item key of `row` as `vault` unwraps it (errSecDecode when it does not).
func withItemKey<R>(
    _ row: ProtectedFixture.RawRow, _ vault: Vault, _ body: (UnsafeRawBufferPointer) throws(KeychainError) -> R
) throws(KeychainError) -> R {
    let protection = ProtectionClass(rawValue: row.protectionClass)!
    let classKey = try vault.classKey(protection)
    guard let sealing = ItemSealing(sealedItemKey: row.itemKey) else {
        throw KeychainError(.decode, "item key of no known layout")
    }
    let ad = ItemCodec.associatedData(
        ref: row.ref, column: row.protectionClass, part: .itemKey, uniqueIndex: row.keyIndex, sealing: sealing)
    return try classKey.withUnsafeBytes { (ck) throws(KeychainError) -> R in
        try withBytes(ad) { (a) throws(KeychainError) -> R in
            try AEAD.withOpenedKey(row.itemKey, key: ck, ad: a, what: "item key", sealing: sealing, body)
        }
    }
}

let masterCodes = ["ak", "ck", "aku", "cku", "akpu"]

/// Setting or changing the passphrase rotates the master-protected class keys and re-wraps every
/// item key of those classes in the same transaction; updates seal under a fresh item key.
@Suite("RotationRules")
struct RotationTests {
    /// Someone with `device.key` and the keyring from before the change (an older copy of the
    /// database, a backup of $HOME) opens no item key in the current database — not of the rows
    /// re-wrapped by the change, not of items added or updated after it — except the Always classes,
    /// which the device key alone protects by design. With the rows from before the change the same
    /// keyring still works: it is the real old one.
    @Test(arguments: [false, true])
    func anOlderKeyringOpensNoItemKeyRewrappedOrWrittenAfterTheChange(hadPassphrase: Bool) throws {
        try withProtectedKeychain { fx in
            let before: String? = hadPassphrase ? "before" : nil
            if let before { try fx.service.changePassphrase(old: nil, new: pass(before)) }
            for code in allCodes where code != "akpu" || hadPassphrase {
                try fx.add("svc", "old-" + code, secret: "o-" + code, pdmn: code)
            }
            let savedKeyring = try fx.keyring()
            let olderRows = try fx.rawColumns()
            try fx.service.changePassphrase(old: before.map(pass), new: pass("after"))
            for code in allCodes { try fx.add("svc", "new-" + code, secret: "n-" + code, pdmn: code) }
            try fx.service.update(
                query("svc", "old-ak"), attributes: ["labl": .text("only the label")], caller: Fixture.app)
            try fx.service.update(query("svc", "old-ck"), attributes: ["v_Data": bytes("changed")], caller: Fixture.app)

            let attacker = try fx.vault(fromKeyring: savedKeyring, passphrase: before)
            let codec = ItemCodec(vault: attacker)
            for row in olderRows {
                #expect(throws: Never.self, "the saved keyring is the real one for the rows of its time") {
                    _ = try codec.open(row.stored, withSecret: true)
                }
            }
            let current = try fx.rawColumns()
            #expect(current.count == olderRows.count + allCodes.count)
            for row in current {
                let protection = try #require(ProtectionClass(rawValue: row.protectionClass))
                let opened = failure { try codec.open(row.stored, withSecret: true) }
                if protection.isAlways {
                    #expect(opened == nil, "\(protection.code) items are protected by the device key alone")
                } else {
                    #expect(opened?.status == .decode, "\(protection.code): an older keyring opened a current row")
                }
            }
            // The owner still reads everything with the new passphrase.
            try fx.reopen()
            try fx.service.unlock(passphrase: pass("after"))
            #expect(!fx.service.rowCheck.resealed)
            #expect(try fx.secret("svc", "old-ck") == "changed" && fx.secret("svc", "old-ak") == "o-ak")
        }
    }

    /// An update seals the whole row under a fresh item key, even when neither the class nor the
    /// secret changes: the item key of the row as it was before a passphrase change (taken from an
    /// older copy of the database with the older keyring) opens neither the updated secret nor the
    /// updated attributes.
    @Test func anUpdatedItemSharesNoKeyWithItsOlderRow() throws {
        try withProtectedKeychain { fx in
            try fx.add("svc", "label-only", secret: "same secret", pdmn: "ak")
            try fx.add("svc", "new-secret", secret: "first", pdmn: "cku")
            let savedKeyring = try fx.keyring()
            let older = try fx.rawColumns()
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            try fx.service.update(query("svc", "label-only"), attributes: ["labl": .text("x")], caller: Fixture.app)
            try fx.service.update(
                query("svc", "new-secret"), attributes: ["v_Data": bytes("second")], caller: Fixture.app)
            let attacker = try fx.vault(fromKeyring: savedKeyring, passphrase: nil)
            let current = try fx.rawColumns()
            for old in older {
                let now = try #require(current.first { $0.ref == old.ref })
                #expect(now.secret != old.secret && now.attributes != old.attributes && now.itemKey != old.itemKey)
                let results = try withItemKey(old, attacker) { (ik) -> (secret: Status, attributes: Status) in
                    let sealing = ItemSealing(sealedItemKey: now.itemKey)!
                    let secretAD = ItemCodec.associatedData(
                        ref: now.ref, column: old.protectionClass, part: .secret, sealing: sealing)
                    let attributesAD = ItemCodec.associatedData(
                        ref: now.ref, column: old.protectionClass, part: .attributes, sealing: sealing)
                    let s = status {
                        try secretAD.withUnsafeBytes { (a) throws(KeychainError) in
                            try AEAD.open(now.secret, key: ik, ad: a, what: "secret", sealing: sealing)
                        }
                    }
                    let a = status {
                        try attributesAD.withUnsafeBytes { (a) throws(KeychainError) in
                            try AEAD.open(now.attributes, key: ik, ad: a, what: "attributes", sealing: sealing)
                        }
                    }
                    return (s, a)
                }
                #expect(results.secret == .decode && results.attributes == .decode)
            }
            #expect(try fx.secret("svc", "label-only") == "same secret" && fx.secret("svc", "new-secret") == "second")
        }
    }

    /// Hundreds of items in every class (more than one batch of the re-wrap) all read back after a
    /// change and after a reopen; the row-state record follows every re-wrapped row.
    @Test func everyItemOfEveryClassOpensAfterTheChangeAndAfterAReopen() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            let service = fx.service
            let perThread = 150
            onThreads(4) { t in
                for i in 0..<perThread {
                    let code = allCodes[(t * perThread + i) % allCodes.count]
                    _ = try? service.add(
                        item("bulk", "\(code)-\(t)-\(i)", secret: "s\(t)-\(i)", ["pdmn": .text(code)]),
                        caller: Fixture.app)
                }
            }
            let expected = try fx.allSecrets()
            #expect(expected.count == 4 * perThread)
            #expect(
                try fx.rawColumns().filter { masterCodes.contains(ProtectionClass(rawValue: $0.protectionClass)!.code) }
                    .count
                    > StoreWriter.rewrapBatchSize, "the change must cross batch boundaries")
            try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            #expect(try fx.allSecrets() == expected)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed && fx.service.rowCheck.rows == Int64(expected.count))
            try fx.service.unlock(passphrase: pass("two"))
            #expect(try fx.allSecrets() == expected)
        }
    }

    /// A change that fails part-way through the rows (an I/O error, injected after 300 of them)
    /// leaves everything as it was: every row byte for byte, the keyring, the old passphrase in force,
    /// items readable at once and after a reopen, and the row-state record in step.
    @Test func aChangeThatFailsAfterSomeRowsLeavesTheOldPassphraseAndEveryItem() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("old"))
            let service = fx.service
            onThreads(4) { t in
                for i in 0..<125 {
                    let code = masterCodes[i % masterCodes.count]
                    _ = try? service.add(
                        item("bulk", "\(code)-\(t)-\(i)", secret: "s\(t)-\(i)", ["pdmn": .text(code)]),
                        caller: Fixture.app)
                }
            }
            let secrets = try fx.allSecrets()
            #expect(secrets.count == 500)
            let keyring = try fx.keyring()
            let rows = try fx.rawColumns()
            fx.service.testHooks.withLock {
                $0.afterRewrappedRow = { (n) throws(KeychainError) in
                    if n == 300 { throw KeychainError(.io, "injected failure after 300 rows") }
                }
            }
            let error = failure { try fx.service.changePassphrase(old: pass("old"), new: pass("new")) }
            fx.service.testHooks.withLock { $0.afterRewrappedRow = nil }
            #expect(error?.status == .io && error?.message == "injected failure after 300 rows")
            #expect(try fx.rawColumns() == rows && fx.keyring() == keyring)
            #expect(try fx.allSecrets() == secrets, "the keys in memory are still the ones the rows are sealed under")
            try fx.add("svc", "after-failure", secret: "written", pdmn: "ak")
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            #expect(failure { try fx.service.unlock(passphrase: pass("new")) }?.status == .authFailed)
            try fx.service.unlock(passphrase: pass("old"))
            var all = try fx.allSecrets()
            #expect(all.removeValue(forKey: "after-failure") == "written")
            #expect(all == secrets)
            // The same change goes through once nothing fails.
            try fx.service.changePassphrase(old: pass("old"), new: pass("new"))
            try fx.reopen()
            try fx.service.unlock(passphrase: pass("new"))
            #expect(try fx.allSecrets().count == secrets.count + 1)
        }
    }

    /// The same with a real full disk (the database capped at its size): the re-wrap fits in place,
    /// the registrations sealed at the end of the transaction do not, so the whole change rolls back.
    @Test func aFullDiskAtTheEndOfTheChangeRollsEverythingBack() throws {
        try withProtectedKeychain { fx in
            for i in 0..<300 { try fx.add("svc", "a\(i)", secret: "s\(i)", pdmn: ["ak", "ck", "aku", "cku"][i % 4]) }
            let secrets = try fx.allSecrets()
            let keyring = try fx.keyring()
            let rows = try fx.rawColumns()
            try fx.service.store.write { (w) throws(KeychainError) in
                let pages = try w.db.withStatement("PRAGMA page_count") { (s) throws(KeychainError) in
                    _ = try s.step()
                    return s.int64(0)
                }
                try w.db.execute("PRAGMA max_page_count = \(pages + 2)")
            }
            // ~200 KiB of registrations: far more than two free pages.
            let many = (0..<2000).map {
                ApprovedRegistration(
                    applicationIdentifier: "TEAM.app\($0)", accessGroups: ["TEAM.group-\($0)"],
                    executables: ["/usr/local/bin/app-number-\($0)"])
            }
            let error = failure { try fx.service.changePassphrase(old: nil, new: pass("pw"), approving: many) }
            #expect(
                error?.status == .io && error?.message.contains("disk is full") == true,
                "\(error?.message ?? "no error")")
            #expect(!fx.service.hasPassphrase && !fx.service.isLocked)
            #expect(try fx.rawColumns() == rows && fx.keyring() == keyring)
            #expect(try fx.allSecrets() == secrets)
            #expect(try fx.service.approvedRegistrations() == [])
            try fx.reopen()  // the cap belonged to the writer connection
            #expect(!fx.service.rowCheck.resealed && !fx.service.hasPassphrase)
            #expect(try fx.allSecrets() == secrets)
        }
    }

    /// A change while locked rotates the keys but keeps the lock state: classes locked before stay
    /// locked (after a lock, ck stays available; after a reopen, only dk and dku are).
    @Test func aChangeKeepsEachClassLockedOrUnlockedAsItWas() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            for code in allCodes { try fx.add("svc", code, secret: code, pdmn: code) }
            try fx.service.lock()
            let available = { Set(fx.service.protectionStatus.classes.filter { $0.value }.keys) }
            #expect(available() == ["ck", "cku", "dk", "dku"])
            try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            #expect(fx.service.isLocked && available() == ["ck", "cku", "dk", "dku"])
            for code in ["ck", "cku", "dk", "dku"] { #expect(try fx.secret("svc", code) == code, "\(code)") }
            try fx.reopen()
            try fx.service.changePassphrase(old: pass("two"), new: pass("three"))
            #expect(available() == ["dk", "dku"])
            try fx.service.unlock(passphrase: pass("three"))
            for code in allCodes { #expect(try fx.secret("svc", code) == code, "\(code)") }
        }
    }

    /// Removing the passphrase is as before: akpu items go, the other class keys are kept (their
    /// rows are not rewritten), and everything opens without a passphrase afterwards.
    @Test func removingThePassphraseDestroysAkpuAndRewritesNoOtherRow() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            for code in allCodes { try fx.add("svc", code, secret: code, pdmn: code) }
            let kept = try fx.rawColumns().filter {
                $0.protectionClass != ProtectionClass.whenPasscodeSetThisDeviceOnly.rawValue
            }
            #expect(try fx.service.changePassphrase(old: pass("pw"), new: nil) == 1)
            #expect(try fx.rawColumns() == kept)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed && !fx.service.isLocked)
            for code in allCodes where code != "akpu" { #expect(try fx.secret("svc", code) == code) }
        }
    }

    /// A row whose item key no longer opens (damaged) does not stop a change; it stays as it was,
    /// still its own errSecDecode, and every other item is re-wrapped.
    @Test func aDamagedRowDoesNotStopAChangeAndStaysDamaged() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            for a in ["a", "b", "c"] { try fx.add("svc", a, secret: a, pdmn: "ck") }
            try damageRow2(fx)
            let damaged = try fx.rawColumns()[1]
            try fx.service.changePassphrase(old: pass("one"), new: pass("pw"))
            #expect(try fx.rawColumns()[1] == damaged)
            try fx.service.unlock(passphrase: pass("pw"))
            #expect(try fx.secret("svc", "a") == "a" && fx.secret("svc", "c") == "c")
            #expect(status { try fx.secret("svc", "b") } == .decode)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("pw"))
            #expect(try fx.secret("svc", "c") == "c")
        }
    }

    /// Setting the first passphrase computes every row's digests again (under the passphrase index
    /// key), which needs the row's attributes: a damaged row, whose attributes do not open, does not
    /// stop it either and stays byte for byte as it was — found by no search from then on.
    @Test func aDamagedRowDoesNotStopTheFirstPassphraseAndStaysAsItWas() throws {
        try withProtectedKeychain { fx in
            for a in ["a", "b", "c"] { try fx.add("svc", a, secret: a, pdmn: "ck") }
            try damageRow2(fx)
            let damaged = try fx.rawColumns()[1]
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            #expect(try fx.rawColumns()[1] == damaged)
            #expect(try fx.secret("svc", "a") == "a" && fx.secret("svc", "c") == "c")
            #expect(status { try fx.secret("svc", "b") } == .itemNotFound)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("pw"))
            #expect(try fx.secret("svc", "c") == "c")
        }
    }

    /// Flips one bit of the second row's sealed item key and reopens the keychain accepting it.
    private func damageRow2(_ fx: ProtectedFixture) throws {
        var itemKey = try fx.rawColumns()[1].itemKey
        itemKey[30] ^= 0x01
        fx.service.close()
        let db = try SQLiteConnection(path: fx.directory + "/" + ItemService.databaseName, create: false)
        try db.withStatement("UPDATE items SET item_key = ? WHERE rowid = 2") { (s) throws(KeychainError) in
            try s.bind(1, itemKey)
            try s.run()
        }
        db.close()
        fx.service = try ItemService(
            directory: fx.directory, kdfProfile: .interactive, acceptCurrentRows: true, wallClock: fx.clock.read)
    }

    /// A warm point-lookup cache holds rows sealed under the old keys; the change's commit clears it.
    @Test func thePointLookupCacheServesNoRowFromBeforeTheChange() throws {
        try withProtectedKeychain { fx in
            try fx.add("svc", "cached", secret: "value", pdmn: "ak")
            #expect(try fx.secret("svc", "cached") == "value")
            #expect(try fx.secret("svc", "cached") == "value")
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            #expect(try fx.secret("svc", "cached") == "value")
            try fx.service.changePassphrase(old: pass("pw"), new: pass("pw2"))
            #expect(try fx.secret("svc", "cached") == "value")
        }
    }

    /// An add seals its row before it waits for the writer. One that sealed under the old class key
    /// while a change held the writer is sealed again under the new key when its turn comes, so it
    /// reads back (before, it would have been written under a key no keyring holds any more).
    @Test func anAddSealedWhileAChangeHoldsTheWriterIsSealedAgain() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("p0"))
            try fx.add("svc", "before", secret: "b", pdmn: "ak")
            let service = fx.service
            let outcome = Locked<Status?>(nil)
            let started = Locked<DispatchGroup?>(nil)
            fx.service.testHooks.withLock {
                $0.afterRewrappedRow = { (_) throws(KeychainError) in
                    // Runs with the writer held: start an add and wait until it is queued for the
                    // writer, which it is only after sealing its row.
                    let group = startThreads(1) { _ in
                        let result = status {
                            try service.add(
                                item("svc", "during", secret: "d", ["pdmn": .text("ak")]), caller: Fixture.app)
                        }
                        outcome.withLock { $0 = result }
                    }
                    started.withLock { $0 = group }
                    let deadline = Date().addingTimeInterval(60)
                    while service.store.writer.waitingWriters == 0 && Date() < deadline { usleep(1000) }
                }
            }
            try fx.service.changePassphrase(old: pass("p0"), new: pass("p1"))
            fx.service.testHooks.withLock { $0.afterRewrappedRow = nil }
            try #require(started.withLock { $0 }).wait()
            #expect(outcome.withLock { $0 } == .success)
            #expect(try fx.secret("svc", "during") == "d" && fx.secret("svc", "before") == "b")
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("p1"))
            #expect(try fx.secret("svc", "during") == "d")
        }
    }

    /// Reads, adds and updates running while the passphrase changes three times never see a row and a
    /// key from different sides of a change (no errSecDecode), and every add made meanwhile — sealed
    /// perhaps under a class key that was replaced before it was written — reads back afterwards.
    @Test func readsAndWritesDuringChangesNeverMixOldAndNewKeys() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("p0"))
            let base = 60
            for i in 0..<base { try fx.add("conc", "base\(i)", secret: "b\(i)", pdmn: allCodes[i % allCodes.count]) }
            let service = fx.service
            let stop = Locked(false)
            let problems = Locked<[String]>([])
            let added = Locked<[String: String]>([:])
            let workers = startThreads(4) { t in
                var n = 0
                while !stop.withLock({ $0 }) {
                    n += 1
                    do throws(KeychainError) {
                        if t == 0 {
                            let account = "w\(n)"
                            _ = try service.add(
                                item("conc", account, secret: "a\(n)", ["pdmn": .text(allCodes[n % allCodes.count])]),
                                caller: Fixture.app)
                            added.withLock { $0[account] = "a\(n)" }
                        } else if t == 1 {
                            try service.update(
                                query("conc", "base\(n % base)"), attributes: ["labl": .text("n\(n)")],
                                caller: Fixture.app)
                        } else {
                            var q = query("conc", "base\((n * 7 + t) % base)")
                            q["r_Data"] = .bool(true)
                            guard
                                let b = try service.copyMatching(q, caller: Fixture.app)?.secretBytes?.unprotectedArray,
                                String(decoding: b, as: UTF8.self) == "b\((n * 7 + t) % base)"
                            else {
                                problems.withLock { $0.append("thread \(t): a copy returned something else") }
                                continue
                            }
                        }
                    } catch {
                        problems.withLock { $0.append("thread \(t): \(error.status) \(error.message)") }
                    }
                }
            }
            for k in 1...3 { try fx.service.changePassphrase(old: pass("p\(k - 1)"), new: pass("p\(k)")) }
            stop.withLock { $0 = true }
            workers.wait()
            #expect(problems.withLock { $0 }.isEmpty, "\(problems.withLock { $0.prefix(5) })")
            let expectedAdds = added.withLock { $0 }
            var all = try fx.allSecrets()
            for (account, secret) in expectedAdds { #expect(all.removeValue(forKey: account) == secret, "\(account)") }
            #expect(all.count == base)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("p3"))
            #expect(try fx.allSecrets().count == base + expectedAdds.count)
        }
    }
}
