import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainSystem
import Testing

@testable import KeychainItems
@testable import KeychainStore

let app1 = ApprovedRegistration(
    applicationIdentifier: "ABCDE12345.com.example.app1",
    accessGroups: ["ABCDE12345.com.example.app1", "ABCDE12345.com.example.shared"],
    executables: ["/usr/local/bin/app1"])
let tool = ApprovedRegistration(
    applicationIdentifier: "ABCDE12345.com.example.tool", accessGroups: ["ABCDE12345.tool"],
    executables: ["/usr/local/bin/tool", "/opt/tool/bin/tool"], admin: true)

extension ProtectedFixture {
    /// Replaces a meta value in place (the row state follows, as for any write of keychaind's own).
    func setMeta(_ name: String, _ value: [UInt8]) throws {
        try service.store.write { (w) throws(KeychainError) in try w.setMeta(name, value) }
    }
}

/// The approved registrations: sealed under a registry key that only the passphrase reaches once one
/// is set, readable from the first time the passphrase is given until the keychain closes.
@Suite("ApprovedRegistrationRules")
struct RegistrationTests {
    @Test func withoutAPassphraseTheListIsWhateverWasStored() throws {
        try withProtectedKeychain { fx in
            #expect(try fx.service.approvedRegistrations() == [])
            try fx.service.setApprovedRegistrations([app1, tool], passphrase: nil)
            #expect(try fx.service.approvedRegistrations() == [app1, tool])
            try fx.service.setApprovedRegistrations([tool], passphrase: pass("ignored: none is set"))
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            #expect(try fx.service.approvedRegistrations() == [tool])
            try fx.service.setApprovedRegistrations([], passphrase: nil)
            #expect(try fx.service.approvedRegistrations() == [])
        }
    }

    /// Setting the first passphrase seals the list passed (the registrations trusted until then);
    /// after a reopen it cannot be read (nil) until the passphrase is given; `lock` does not make it
    /// unreadable again.
    @Test func theFirstPassphraseSealsTheListPassedWhichNeedsAnUnlockAfterAReopen() throws {
        try withProtectedKeychain { fx in
            try fx.service.setApprovedRegistrations([tool], passphrase: nil)
            try fx.service.changePassphrase(old: nil, new: pass("pw"), approving: [app1])
            #expect(try fx.service.approvedRegistrations() == [app1])
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            #expect(try fx.service.approvedRegistrations() == nil)
            #expect(failure { try fx.service.unlock(passphrase: pass("wrong")) }?.status == .authFailed)
            #expect(try fx.service.approvedRegistrations() == nil)
            try fx.service.unlock(passphrase: pass("pw"))
            #expect(try fx.service.approvedRegistrations() == [app1])
            try fx.service.lock()
            #expect(fx.service.isLocked)
            #expect(try fx.service.approvedRegistrations() == [app1], "lock keeps the registrations readable")
        }
    }

    @Test func laterChangesKeepOrReplaceTheListAndRemovingThePassphraseKeepsItReadable() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("one"), approving: [app1])
            try fx.service.changePassphrase(old: pass("one"), new: pass("two"))
            #expect(try fx.service.approvedRegistrations() == [app1])
            try fx.reopen()
            // A change made with the passphrase, the keychain never unlocked: the list is readable.
            try fx.service.changePassphrase(old: pass("two"), new: pass("three"), approving: [app1, tool])
            #expect(fx.service.isLocked)
            #expect(try fx.service.approvedRegistrations() == [app1, tool])
            try fx.service.changePassphrase(old: pass("three"), new: nil)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed && !fx.service.hasPassphrase)
            #expect(try fx.service.approvedRegistrations() == [app1, tool])
        }
    }

    /// With a passphrase set, approving needs it: none is errSecAuthFailed (not counted, nothing was
    /// guessed), a wrong one is errSecAuthFailed and counts towards the delays, which then refuse even
    /// the right one until they run out; the right one clears the count. The list is unchanged by
    /// every refusal.
    @Test func approvingNeedsThePassphraseAndAWrongOneCountsAsAFailedUnlock() throws {
        try withProtectedKeychain { fx in
            try fx.service.changePassphrase(old: nil, new: pass("right"), approving: [app1])
            try fx.reopen()
            let missing = failure { try fx.service.setApprovedRegistrations([tool], passphrase: nil) }
            #expect(missing?.status == .authFailed && fx.service.protectionStatus.failedUnlocks == 0)
            for n in 1...5 {
                let wrong = failure { try fx.service.setApprovedRegistrations([tool], passphrase: pass("wrong")) }
                #expect(
                    wrong?.status == .authFailed && wrong?.message.contains("\(n) failed attempt") == true,
                    "\(wrong?.message ?? "")")
            }
            #expect(fx.service.protectionStatus.failedUnlocks == 5)
            let delayed = failure { try fx.service.setApprovedRegistrations([tool], passphrase: pass("right")) }
            #expect(delayed?.status == .authFailed && delayed?.message.contains("try again in 1 second") == true)
            #expect(try fx.service.approvedRegistrations() == nil)
            fx.clock.advance(1.01)
            try fx.service.setApprovedRegistrations([tool], passphrase: pass("right"))
            #expect(fx.service.protectionStatus.failedUnlocks == 0)
            #expect(fx.service.isLocked, "approving does not unlock the items")
            #expect(try fx.service.approvedRegistrations() == [tool], "the passphrase was given: the list is readable")
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            try fx.service.unlock(passphrase: pass("right"))
            #expect(try fx.service.approvedRegistrations() == [tool])
        }
    }

    /// Presence checks change nothing (still locked, registrations still unreadable) but count and
    /// are delayed exactly as unlocks are.
    @Test func verifyPresenceChecksThePassphraseAndChangesNothingElse() throws {
        try withProtectedKeychain { fx in
            try fx.service.verifyPresence(passphrase: nil)
            try fx.service.verifyPresence(passphrase: pass("anything: none is set"))
            try fx.service.changePassphrase(old: nil, new: pass("right"), approving: [app1])
            try fx.reopen()
            #expect(failure { try fx.service.verifyPresence(passphrase: nil) }?.status == .authFailed)
            #expect(fx.service.protectionStatus.failedUnlocks == 0)
            for _ in 1...5 {
                #expect(failure { try fx.service.verifyPresence(passphrase: pass("wrong")) }?.status == .authFailed)
            }
            #expect(fx.service.protectionStatus.failedUnlocks == 5)
            #expect(
                failure { try fx.service.verifyPresence(passphrase: pass("right")) }?.message.contains("try again")
                    == true)
            #expect(
                failure { try fx.service.unlock(passphrase: pass("right")) }?.message.contains("try again") == true,
                "presence failures delay unlocks too: one counter")
            fx.clock.advance(1.01)
            try fx.service.verifyPresence(passphrase: pass("right"))
            #expect(fx.service.protectionStatus.failedUnlocks == 0)
            #expect(fx.service.isLocked)
            #expect(try fx.service.approvedRegistrations() == nil)
        }
    }

    /// A list flipped by one byte, or one sealed under another key, is errSecDecode, never another list.
    @Test func aTamperedListIsDecode() throws {
        try withProtectedKeychain { fx in
            try fx.service.setApprovedRegistrations([app1], passphrase: nil)
            let sealed = try #require(try fx.service.store.meta("apps"))
            var flipped = sealed
            flipped[flipped.count / 2] ^= 0x01
            try fx.setMeta("apps", flipped)
            let error = failure { try fx.service.approvedRegistrations() }
            #expect(error?.status == .decode && error?.message.contains("approve the registrations again") == true)
            // Sealed under a key of someone's choosing: refused the same way.
            try fx.setMeta(
                "apps", Vault.sealRegistry(ApprovedRegistration.encode([tool]), key: try SecureBytes(random: 32)))
            #expect(failure { try fx.service.approvedRegistrations() }?.status == .decode)
            // Approving again replaces it.
            try fx.service.setApprovedRegistrations([tool], passphrase: nil)
            #expect(try fx.service.approvedRegistrations() == [tool])
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
        }
    }

    /// The keyring from before a change (or before an approval) does not open the list sealed after
    /// it: every change and every approval draws a fresh registry key.
    @Test func anOlderKeyringCannotOpenAListSealedAfterAChange() throws {
        try withProtectedKeychain { fx in
            try fx.service.setApprovedRegistrations([app1], passphrase: nil)
            let beforePassphrase = try fx.keyring()
            try fx.service.changePassphrase(old: nil, new: pass("pw"), approving: [app1, tool])
            let afterPassphrase = try fx.keyring()
            try fx.service.setApprovedRegistrations([tool], passphrase: pass("pw"))
            let sealed = try #require(try fx.service.store.meta("apps"))
            for (keyring, passphrase) in [(beforePassphrase, nil), (afterPassphrase, "pw")] as [([UInt8], String?)] {
                let old = try fx.vault(fromKeyring: keyring, passphrase: passphrase)
                guard case .available(let key) = old.registryKey else {
                    Issue.record("the older keyring has no registry key")
                    continue
                }
                #expect(failure { try Vault.openRegistry(sealed, key: key) }?.status == .decode)
            }
            #expect(try fx.service.approvedRegistrations() == [tool])
        }
    }

    /// A keyring written before registry keys existed keeps opening: nothing is approved ([]), and
    /// the key is created by the first approval or passphrase change.
    @Test(arguments: [false, true])
    func aKeyringWithoutARegistryKeyOpensAndGetsOneWhenFirstNeeded(withPassphrase: Bool) throws {
        try withProtectedKeychain { fx in
            if withPassphrase { try fx.service.changePassphrase(old: nil, new: pass("pw")) }
            try fx.add("svc", "a", secret: "kept", pdmn: "ck")
            guard case .map(var map) = try CBOR.decode(try fx.keyring()) else {
                throw KeychainError(.decode, "keyring")
            }
            #expect(map.removeValue(forKey: "apps") != nil)
            try fx.setMeta("keyring", CBOR.encode(.map(map)))
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            if withPassphrase {
                #expect(try fx.service.approvedRegistrations() == nil)
                try fx.service.unlock(passphrase: pass("pw"))
            }
            #expect(try fx.service.approvedRegistrations() == [])
            #expect(try fx.secret("svc", "a") == "kept")
            try fx.service.setApprovedRegistrations([app1], passphrase: withPassphrase ? pass("pw") : nil)
            try fx.reopen()
            if withPassphrase { try fx.service.unlock(passphrase: pass("pw")) }
            #expect(try fx.service.approvedRegistrations() == [app1])
            #expect(try CBOR.decode(try fx.keyring()).map?["apps"]?.bytes != nil)
        }
    }

    /// Strings are compared byte for byte: "é" precomposed and decomposed are different groups,
    /// and each comes back from the database with the bytes it went in with.
    @Test func registrationsCompareByteForByteAndRoundTripExactly() throws {
        let composed = ApprovedRegistration(
            applicationIdentifier: "T.caf\u{E9}", accessGroups: ["caf\u{E9}"], executables: ["/bin/caf\u{E9}"])
        let decomposed = ApprovedRegistration(
            applicationIdentifier: "T.cafe\u{301}", accessGroups: ["cafe\u{301}"], executables: ["/bin/cafe\u{301}"])
        #expect("caf\u{E9}" == "cafe\u{301}", "Swift's String equality is Unicode equivalence")
        #expect(composed != decomposed)
        #expect(Set([composed, decomposed]).count == 2)
        var admin = composed
        admin.admin = true
        #expect(admin != composed)
        try withProtectedKeychain { fx in
            try fx.service.setApprovedRegistrations([composed, decomposed], passphrase: nil)
            try fx.reopen()
            let back = try #require(try fx.service.approvedRegistrations())
            #expect(back == [composed, decomposed])
            #expect(Array(back[1].accessGroups[0].utf8) == Array("cafe\u{301}".utf8))
        }
    }
}
