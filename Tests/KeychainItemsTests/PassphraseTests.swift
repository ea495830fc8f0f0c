import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import Testing

@testable import KeychainItems

/// A settable wall clock for the wrong-passphrase delays.
final class TestClock: Sendable {
    let now = Locked<Double>(1_700_000_000)
    func advance(_ s: Double) { now.withLock { $0 += s } }
    var read: @Sendable () -> Double { { [self] in now.withLock { $0 } } }
}

/// A keychain with cheap Argon2id (interactive) and a test clock.
final class ProtectedFixture {
    let root: String
    let directory: String
    let clock = TestClock()
    var service: ItemService

    /// `sealing`: what new rows are sealed with (as an older version, or another CPU, sealed them).
    init(profile: KDFProfile = .interactive, sealing: ItemSealing = .preferred) throws {
        var template = Array((NSTemporaryDirectory() + "/kc-protect-XXXXXX").utf8CString)
        guard let p = mkdtemp(&template) else { throw KeychainError(.io, "mkdtemp") }
        root = String(cString: p)
        directory = root + "/data"
        service = try ItemService(directory: directory, kdfProfile: profile, wallClock: clock.read, sealing: sealing)
    }

    func reopen(sealing: ItemSealing = .preferred) throws {
        service.close()
        service = try ItemService(
            directory: directory, kdfProfile: service.kdfProfile, wallClock: clock.read, sealing: sealing)
    }

    func cleanup() {
        service.close()
        try? FileManager.default.removeItem(atPath: root)
    }

    @discardableResult
    func add(_ svce: String, _ acct: String, secret: String = "pw", pdmn: String, group: String = "TEAM.app") throws
        -> Value?
    {
        try service.add(
            item(svce, acct, secret: secret, ["pdmn": .text(pdmn), "agrp": .text(group)]), caller: Fixture.app)
    }

    func secret(_ svce: String, _ acct: String) throws -> String? {
        var q = query(svce, acct)
        q["r_Data"] = .bool(true)
        guard let b = try service.copyMatching(q, caller: Fixture.app)?.secretBytes?.unprotectedArray else {
            return nil
        }
        return String(decoding: b, as: UTF8.self)
    }

    /// The columns of one row of the items table, as stored.
    struct RawRow: Equatable {
        var rowid: Int64
        var ref: [UInt8]
        var protectionClass: UInt8
        var keyIndex: [UInt8]
        var itemKey: [UInt8]
        var attributes: [UInt8]
        var secret: [UInt8]

        var stored: StoredItem {
            StoredItem(
                rowid: rowid, ref: ref, protectionClass: protectionClass, accessGroupIndex: [], serviceIndex: [],
                accountIndex: [], uniqueIndex: keyIndex, wrappedKey: itemKey, attributes: attributes, secret: secret)
        }
    }

    /// Every row of the items table (of `database`, default the keychain's), read with a connection
    /// of its own.
    func rawColumns(database: String? = nil) throws -> [RawRow] {
        let db = try SQLiteConnection(path: database ?? directory + "/" + ItemService.databaseName, create: false)
        defer { db.close() }
        var rows: [RawRow] = []
        try db.withStatement("SELECT rowid, ref, class, key_ix, item_key, attributes, secret FROM items ORDER BY rowid")
        { (s) throws(KeychainError) in
            while try s.step() {
                rows.append(
                    RawRow(
                        rowid: s.int64(0), ref: s.blob(1), protectionClass: UInt8(s.int64(2)), keyIndex: s.blob(3),
                        itemKey: s.blob(4), attributes: s.blob(5), secret: s.blob(6)))
            }
        }
        return rows
    }
}

func withProtectedKeychain(
    profile: KDFProfile = .interactive, sealing: ItemSealing = .preferred, _ body: (ProtectedFixture) throws -> Void
) throws {
    let fx = try ProtectedFixture(profile: profile, sealing: sealing)
    defer { fx.cleanup() }
    try body(fx)
}

let allCodes = ["ak", "ck", "dk", "aku", "cku", "dku", "akpu"]

@Suite struct PassphraseTests {
    func available(_ fx: ProtectedFixture) -> Set<String> {
        Set(fx.service.protectionStatus.classes.filter { $0.value }.keys)
    }

    @Test func withoutAPassphraseEveryClassButAkpuIsAvailableAndLockIsRefused() throws {
        try withProtectedKeychain { fx in
            #expect(available(fx) == ["ak", "ck", "dk", "aku", "cku", "dku"])
            #expect(!fx.service.protectionStatus.locked && !fx.service.protectionStatus.passphraseSet)
            #expect(failure { try fx.add("s", "a", pdmn: "akpu") }?.status == .authFailed)
            #expect(failure { try fx.service.lock() }?.status == .param)
            // Unlock without a passphrase set: nothing to check, success.
            try fx.service.unlock(passphrase: pass("anything"))
        }
    }

    @Test func aPassphraseMakesTheKeychainStartLockedAndOnlyTheRightOneUnlocksIt() throws {
        try withProtectedKeychain { fx in
            for code in allCodes.filter({ $0 != "akpu" }) { try fx.add("svc", code, secret: "s-" + code, pdmn: code) }
            try fx.service.changePassphrase(old: nil, new: pass("correct horse"))
            #expect(!fx.service.isLocked, "setting a passphrase keeps the keychain unlocked")
            try fx.add("svc", "akpu", secret: "s-akpu", pdmn: "akpu")
            try fx.reopen()
            let status = fx.service.protectionStatus
            #expect(status.locked && status.passphraseSet)
            #expect(available(fx) == ["dk", "dku"])
            for code in ["dk", "dku"] { #expect(try fx.secret("svc", code) == "s-" + code) }
            for code in ["ak", "ck", "aku", "cku", "akpu"] {
                #expect(failure { try fx.secret("svc", code) }?.status == .interactionNotAllowed, "\(code)")
                #expect(failure { try fx.add("new", code, pdmn: code) }?.status == .interactionNotAllowed, "\(code)")
            }
            #expect(failure { try fx.service.unlock(passphrase: pass("Correct horse")) }?.status == .authFailed)
            #expect(fx.service.isLocked)
            try fx.service.unlock(passphrase: pass("correct horse"))
            #expect(Set(allCodes) == available(fx))
            for code in allCodes { #expect(try fx.secret("svc", code) == "s-" + code) }
        }
    }

    @Test func lockDropsTheWhenUnlockedClassesOnly() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw1"))
            for code in allCodes { try fx.add("svc", code, pdmn: code) }
            try fx.service.lock()
            #expect(fx.service.isLocked)
            #expect(available(fx) == ["ck", "cku", "dk", "dku"])
            for code in ["ak", "aku", "akpu"] {
                #expect(failure { try fx.secret("svc", code) }?.status == .interactionNotAllowed)
            }
            for code in ["ck", "cku", "dk", "dku"] { #expect(try fx.secret("svc", code) == "pw") }
            // A locked row aborts a copy of everything; update and delete too.
            let all: [String: Value] = [
                "class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            ]
            #expect(failure { try fx.service.copyMatching(all, caller: Fixture.app) }?.status == .interactionNotAllowed)
            #expect(
                failure {
                    try fx.service.update(query("svc", "ak"), attributes: ["labl": .text("x")], caller: Fixture.app)
                }?.status == .interactionNotAllowed)
            #expect(
                failure { try fx.service.delete(query("svc", "ak"), caller: Fixture.app) }?.status
                    == .interactionNotAllowed)
            try fx.service.unlock(passphrase: pass("pw1"))
            #expect(try fx.service.copyMatching(all, caller: Fixture.app)?.array?.count == 7)
        }
    }

    /// Each class key in memory has its AES-256-GCM schedule beside it (where libsodium runs GCM):
    /// a class that stays in memory keeps the same one, a locked class's schedule is freed with its
    /// key (zeroed by sodium_free), and an unlock makes a new one; items open throughout.
    @Test func aClassKeysScheduleLivesAndDiesWithIt() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw1"))
            try fx.add("svc", "ak", pdmn: "ak")
            try fx.add("svc", "dk", pdmn: "dk")
            let vault = fx.service.vault
            let withGCM = ItemSealing.preferred == .aes256GCM
            for c in ProtectionClass.allCases {
                #expect((try vault.openingKey(c).prepared != nil) == withGCM, "\(c)")
            }
            weak let lockedAway = try vault.openingKey(.whenUnlocked).prepared
            let kept = try vault.openingKey(.always).prepared
            #expect((lockedAway != nil) == withGCM)
            try fx.service.lock()
            #expect(lockedAway == nil, "the whenUnlocked schedule outlived its key")
            #expect(failure { try vault.openingKey(.whenUnlocked) }?.status == .interactionNotAllowed)
            #expect(try vault.openingKey(.always).prepared === kept, "a class still in memory keeps its schedule")
            #expect(try fx.secret("svc", "dk") == "pw")
            try fx.service.unlock(passphrase: pass("pw1"))
            #expect((try vault.openingKey(.whenUnlocked).prepared != nil) == withGCM)
            #expect(try fx.secret("svc", "ak") == "pw")
        }
    }

    /// A change re-wraps the item key of every item of a master-protected class under the fresh class
    /// key and touches nothing else: sealed attributes and secrets stay byte for byte, and the Always
    /// classes (wrapped by the device key) are not rotated at all.
    @Test func changingThePassphraseRewrapsItemKeysButNeverTheSealedContents() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("old"))
            for code in allCodes { try fx.add("svc", code, secret: code, pdmn: code) }
            let before = try fx.rawColumns()
            #expect(failure { try fx.service.changePassphrase(old: nil, new: pass("new")) }?.status == .authFailed)
            #expect(
                failure { try fx.service.changePassphrase(old: pass("wrong"), new: pass("new")) }?.status == .authFailed
            )
            #expect(try fx.rawColumns() == before, "a refused change touches no row")
            try fx.service.changePassphrase(old: pass("old"), new: pass("new"))
            let after = try fx.rawColumns()
            #expect(after.count == before.count)
            for (b, a) in zip(before, after) {
                let code = ProtectionClass(rawValue: b.protectionClass)!.code
                #expect(
                    a.ref == b.ref && a.attributes == b.attributes && a.secret == b.secret && a.keyIndex == b.keyIndex,
                    "\(code)")
                if ["dk", "dku"].contains(code) {
                    #expect(a.itemKey == b.itemKey, "\(code): Always classes are not rotated")
                } else {
                    #expect(a.itemKey != b.itemKey, "\(code): the item key is re-wrapped under the new class key")
                }
            }
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            #expect(failure { try fx.service.unlock(passphrase: pass("old")) }?.status == .authFailed)
            try fx.service.unlock(passphrase: pass("new"))
            for code in allCodes { #expect(try fx.secret("svc", code) == code) }
            #expect(fx.service.protectionStatus.failedUnlocks == 0, "a right passphrase clears the counter")
        }
    }

    @Test func changingThePassphraseWhileLockedKeepsItLocked() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            try fx.add("svc", "a", pdmn: "ak")
            try fx.reopen()
            try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            #expect(fx.service.isLocked)
            try fx.service.unlock(passphrase: pass("two"))
            #expect(try fx.secret("svc", "a") == "pw")
        }
    }

    @Test func removingThePassphraseDestroysAkpuItemsAndUnlocksForGood() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            try fx.add("svc", "passcode", pdmn: "akpu")
            try fx.add("svc", "plain", pdmn: "ak")
            try fx.add("svc", "device", pdmn: "aku")
            try fx.service.lock()
            #expect(try fx.service.changePassphrase(old: pass("pw"), new: nil) == 1)
            #expect(!fx.service.hasPassphrase && !fx.service.isLocked)
            #expect(failure { try fx.secret("svc", "passcode") }?.status == .itemNotFound)
            #expect(try fx.secret("svc", "plain") == "pw" && fx.secret("svc", "device") == "pw")
            #expect(failure { try fx.add("svc", "again", pdmn: "akpu") }?.status == .authFailed)
            try fx.reopen()
            #expect(!fx.service.isLocked)
            #expect(try fx.secret("svc", "plain") == "pw")
            #expect(try fx.service.itemCount() == 2)
        }
    }

    @Test func akpuUpdateWithoutAPassphraseIsAuthFailed() throws {
        try withProtectedKeychain { fx in
            try fx.add("svc", "a", pdmn: "ak")
            #expect(
                failure {
                    try fx.service.update(query("svc", "a"), attributes: ["pdmn": .text("akpu")], caller: Fixture.app)
                }?.status == .authFailed)
        }
    }

    // MARK: Wrong-passphrase delays

    @Test func delayScheduleEscalatesLikeApples() {
        let delays = (1...12).map { ItemService.unlockDelay(afterFailures: $0) }
        #expect(delays == [0, 0, 0, 0, 1, 5, 15, 60, 300, 900, 900, 900])
    }

    @Test func wrongPassphrasesEscalateAndTheCountSurvivesAReopen() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("right"))
            try fx.reopen()
            for n in 1...4 {
                let e = failure { try fx.service.unlock(passphrase: pass("wrong")) }
                #expect(e?.status == .authFailed)
                #expect(e?.message.contains("\(n) failed attempt") == true, "\(e?.message ?? "")")
            }
            let fifth = failure { try fx.service.unlock(passphrase: pass("wrong")) }
            #expect(fifth?.message.contains("next attempt is accepted in 1 second") == true, "\(fifth?.message ?? "")")
            // While the delay runs even the right passphrase is refused, unchecked and uncounted.
            let refused = failure { try fx.service.unlock(passphrase: pass("right")) }
            #expect(refused?.status == .authFailed && refused?.message.contains("try again in 1 second") == true)
            #expect(fx.service.protectionStatus.failedUnlocks == 5)
            #expect(fx.service.isLocked)
            fx.clock.advance(1.01)
            #expect(failure { try fx.service.unlock(passphrase: pass("wrong")) }?.message.contains("5 seconds") == true)
            try fx.reopen()
            let afterRestart = fx.service.protectionStatus
            #expect(afterRestart.failedUnlocks == 6 && afterRestart.unlockDelay > 4.9)
            #expect(
                failure { try fx.service.unlock(passphrase: pass("right")) }?.message.contains("try again in 5 seconds")
                    == true)
            // A wrong old passphrase in passwd is refused by the same delay.
            #expect(
                failure { try fx.service.changePassphrase(old: pass("right"), new: pass("x")) }?.message.contains(
                    "try again") == true)
            fx.clock.advance(5)
            try fx.service.unlock(passphrase: pass("right"))
            #expect(fx.service.protectionStatus.failedUnlocks == 0 && fx.service.protectionStatus.unlockDelay == 0)
        }
    }

    @Test func aClockSetBackDoesNotStretchTheDelay() {
        let f = ItemService.Failures(count: 6, last: 1000)
        #expect(f.remaining(now: 1002) == 3)
        #expect(f.remaining(now: 10) == 5)
        #expect(f.remaining(now: 2000) == 0)
    }

    // MARK: Keyring

    @Test func storedKDFParametersAreBoundedAndTheKeyringRecordsThem() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            let params = try #require(fx.service.vault.kdfParameters)
            #expect(
                params.opsLimit == KDFProfile.interactive.opsLimit && params.memLimit == KDFProfile.interactive.memLimit
            )
            #expect(params.salt.count == 16)
            #expect(throws: KeychainError.self) { try KDFParameters(opsLimit: 3, memLimit: 8 << 30, salt: params.salt) }
            #expect(throws: KeychainError.self) {
                try KDFParameters(opsLimit: 1000, memLimit: 1 << 20, salt: params.salt)
            }
            // Each change draws a fresh salt.
            try fx.service.changePassphrase(old: pass("pw"), new: pass("pw"))
            #expect(fx.service.vault.kdfParameters?.salt != params.salt)
        }
    }

    @Test func theKeyringNeedsTheDeviceKeyEvenWithTheRightPassphrase() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            try fx.add("svc", "a", pdmn: "ak")
            fx.service.close()
            // Another device's key file: the keyring's index key no longer opens.
            let keyPath = fx.directory + "/" + ItemService.deviceKeyName
            try FileManager.default.removeItem(atPath: keyPath)
            _ = try DeviceKeyFile.create(path: keyPath)
            #expect(failure { try ItemService(directory: fx.directory, kdfProfile: .interactive) }?.status == .decode)
        }
    }

    /// The default profile stores libsodium's moderate Argon2id costs and unlocks with them. How long
    /// that takes is a benchmark figure (`scripts/bench`, docs/performance.md), not a test assertion.
    @Test func moderateProfileStoresLibsodiumsModerateCostsAndUnlocks() throws {
        try withProtectedKeychain(profile: .moderate) { fx in
            try fx.service.changePassphrase(old: nil, new: pass("a fairly long passphrase"))
            try fx.reopen()
            let params = try #require(fx.service.vault.kdfParameters)
            #expect(params.opsLimit == KDFProfile.moderate.opsLimit && params.memLimit == KDFProfile.moderate.memLimit)
            #expect(params.memLimit == 256 << 20, "moderate is 256 MiB of Argon2id memory")
            #expect(fx.service.isLocked)
            try fx.service.unlock(passphrase: pass("a fairly long passphrase"))
            #expect(!fx.service.isLocked)
        }
    }
}

@Suite("PassphraseLogRules")
struct PassphraseLogTests {
    @Test func changingThePassphraseLeavesNoOldKeyringInTheWriteAheadLog() throws {
        try withProtectedKeychain { fx in
            try fx.add("svc", "a", secret: "s", pdmn: "ck")
            try fx.service.changePassphrase(old: nil, new: pass("first"))
            try fx.service.changePassphrase(old: pass("first"), new: pass("second"))
            var st = stat()
            let wal = fx.directory + "/" + ItemService.databaseName + "-wal"
            #expect(stat(wal, &st) != 0 || st.st_size == 0, "the WAL still holds frames after a passphrase change")
        }
    }
}
