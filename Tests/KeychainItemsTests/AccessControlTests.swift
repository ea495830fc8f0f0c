import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainSystem
import Testing

@testable import KeychainItems
@testable import KeychainStore

/// Items whose access control (`accc`) needs the person: their data is read or changed only under a
/// grant naming them; the class column's presence bit says so without opening anything, and is bound
/// into the row's sealed parts.
@Suite struct AccessControlRules {
    static let presence: Value = .map(["flags": .int(AccessControl.userPresence), "pdmn": .text("aku")])

    func guarded(_ fx: ProtectedFixture) throws -> [UInt8] {
        try fx.service.changePassphrase(old: nil, new: pass("pw"))
        try fx.service.add(item("svc", "a", secret: "guarded", ["accc": Self.presence]), caller: Fixture.app)
        let row = try #require(try fx.rawColumns().first)
        #expect(
            row.protectionClass == ProtectionClass.whenUnlockedThisDeviceOnly.rawValue | ProtectionClass.presenceBit)
        return row.ref
    }

    func read(_ fx: ProtectedFixture, _ extra: [String: Value] = [:], grant: PresenceGrant? = nil) throws -> Value? {
        var q = query("svc", "a", extra)
        q["r_Data"] = .bool(true)
        return try fx.service.copy(fx.service.compileCopy(q, caller: Fixture.app), presence: grant)
    }

    @Test func dataNeedsAGrantAttributesDoNot() throws {
        try withProtectedKeychain { fx in
            let ref = try guarded(fx)
            for extra: [String: Value] in [[:], ["r_Attributes": .bool(true)], ["m_Limit": .text("m_LimitAll")]] {
                let error = try #require(failure { try read(fx, extra) })
                #expect(error.status == .interactionNotAllowed && error.needsPresence)
            }
            var grant = PresenceGrant()
            grant.refs.insert(ref)
            #expect(try read(fx, grant: grant)?.secretBytes?.unprotectedArray == Array("guarded".utf8))
            var skip = PresenceGrant()
            skip.skipOthers = true
            #expect(failure { try read(fx, grant: skip) }?.status == .itemNotFound)
            var q = query("svc", "a")
            q["r_Attributes"] = .bool(true)
            let attributes = try #require(try fx.service.copyMatching(q, caller: Fixture.app)?.map)
            #expect(attributes["accc"] == .map(["flags": .int(AccessControl.userPresence)]))
            #expect(attributes["pdmn"] == .text("aku"))
            let needing = try fx.service.itemsNeedingPresence(
                query("svc", "a"), for: .copy, caller: Fixture.app)
            #expect(needing.map(\.ref) == [ref] && needing.first?.description == "service=svc account=a")
            // A passphrase change re-wraps the item key with the bit in its associated data.
            try fx.service.changePassphrase(old: pass("pw"), new: pass("pw2"))
            #expect(try read(fx, grant: grant)?.secretBytes?.unprotectedArray == Array("guarded".utf8))
            #expect(failure { try read(fx) }?.needsPresence == true)
            // Deleting does not ask.
            try fx.service.delete(query("svc", "a"), caller: Fixture.app)
        }
    }

    @Test func clearingThePresenceBitInTheDatabaseLeavesTheItemUnreadable() throws {
        try withProtectedKeychain { fx in
            _ = try guarded(fx)
            fx.service.close()
            let db = try SQLiteConnection(path: fx.directory + "/" + ItemService.databaseName, create: false)
            try db.execute("UPDATE items SET class = class & 127")
            db.close()
            // The row-state record refuses the file; accepted anyway, the row does not open.
            #expect(failure { try fx.reopen() }?.status == .decode)
            fx.service = try ItemService(
                directory: fx.directory, kdfProfile: .interactive, acceptCurrentRows: true, wallClock: fx.clock.read)
            try fx.service.unlock(passphrase: pass("pw"))
            #expect(failure { try read(fx) }?.status == .decode)
        }
    }

    @Test func unsupportedConstraintsAreUnimplementedAndOthersChecked() throws {
        try withProtectedKeychain { fx in
            func add(_ accc: Value, _ extra: [String: Value] = [:]) -> KeychainError? {
                failure {
                    try fx.service.add(item("svc", "x", ["accc": accc].merging(extra) { $1 }), caller: Fixture.app)
                }
            }
            #expect(add(Self.presence)?.status == .authFailed, "no passphrase set")
            try fx.service.changePassphrase(old: nil, new: pass("pw"))
            let biometry = add(.map(["flags": .int(1 << 1 | AccessControl.userPresence)]))
            #expect(biometry?.status == .unimplemented && biometry?.message.contains("biometryAny") == true)
            #expect(add(.map(["flags": .int(1 << 31)]))?.status == .unimplemented)
            #expect(add(.map(["flags": .int(AccessControl.or | AccessControl.and | 1)]))?.status == .param)
            #expect(add(.map(["flags": .int(0)]))?.status == .param)
            #expect(add(.map(["flags": .int(1)]), ["pdmn": .text("ak")]) == nil, "accc without pdmn, pdmn beside")
            #expect(add(Self.presence, ["pdmn": .text("ak"), "acct": .text("y")])?.status == .param)
            #expect(add(Self.presence, ["sync": .bool(true), "acct": .text("z")])?.status == .param)
        }
    }
}
