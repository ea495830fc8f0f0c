import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import Testing

@testable import KeychainItems

@Suite struct UpdateRules {
    @Test func updateChangesEveryMatch() throws {
        try withKeychain { (fx) throws in
            for a in ["a", "b", "c"] { try fx.add("svc", a) }
            try fx.add("other", "a")
            try fx.service.update(
                ["class": .text("genp"), "svce": .text("svc")], attributes: ["labl": .text("new")], caller: Fixture.app)
            for a in ["a", "b", "c"] { #expect(try fx.attributes("svc", a)["labl"] == .text("new")) }
            #expect(try fx.attributes("other", "a")["labl"] == nil)
        }
    }

    @Test func updateChangesTheSecret() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "old")
            try fx.service.update(query("svc", "alice"), attributes: ["v_Data": bytes("new")], caller: Fixture.app)
            #expect(try fx.secret("svc", "alice") == "new")
        }
    }

    @Test func updateMayChangeKeyAttributes() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "s")
            try fx.service.update(
                query("svc", "alice"),
                attributes: [
                    "svce": .text("svc2"), "acct": .text("bob"), "agrp": .text("TEAM.shared"), "sync": .bool(true),
                ], caller: Fixture.app)
            #expect(status { try fx.copy(query("svc", "alice")) } == .itemNotFound)
            #expect(try fx.secret("svc2", "bob", ["sync": .bool(true), "agrp": .text("TEAM.shared")]) == "s")
            // The old key is free again.
            try fx.add("svc", "alice")
        }
    }

    @Test func updateCollisionRollsBackEverythingWithDuplicateItem() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "1")
            try fx.add("svc", "b", secret: "2")
            let error = try #require(
                failure {
                    try fx.service.update(
                        ["class": .text("genp"), "svce": .text("svc")],
                        attributes: ["acct": .text("same"), "labl": .text("x")], caller: Fixture.app)
                })
            #expect(error.status == .duplicateItem)
            #expect(try fx.secret("svc", "a") == "1")
            #expect(try fx.secret("svc", "b") == "2")
            #expect(try fx.attributes("svc", "a")["labl"] == nil)
            #expect(status { try fx.copy(query("svc", "same")) } == .itemNotFound)
        }
    }

    @Test func updateQueryMayNotHoldReturnOrMatchKeys() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            for extra: [String: Value] in [
                ["r_Data": .bool(true)], ["r_Attributes": .bool(false)], ["m_Limit": .text("m_LimitAll")],
                ["m_CaseInsensitive": .bool(true)],
            ] {
                #expect(
                    status {
                        try fx.service.update(
                            query("svc", "alice", extra), attributes: ["labl": .text("x")], caller: Fixture.app)
                    } == .param)
            }
        }
    }

    @Test func attributesToUpdateHoldingNonAttributesIsNoSuchAttr() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            for bad: [String: Value] in [
                ["class": .text("genp")], ["m_Limit": .text("m_LimitAll")], ["r_Data": .bool(true)],
                ["v_PersistentRef": .bytes([])], ["srvr": .text("x")],
            ] {
                #expect(
                    status { try fx.service.update(query("svc", "alice"), attributes: bad, caller: Fixture.app) }
                        == .noSuchAttr)
            }
        }
    }

    @Test func changingAccessibilityRewrapsUnderTheNewClass() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "s")
            try fx.service.update(query("svc", "alice"), attributes: ["pdmn": .text("dk")], caller: Fixture.app)
            fx.service.vault.lock([.whenUnlocked])
            #expect(try fx.secret("svc", "alice") == "s")
            #expect(try fx.attributes("svc", "alice")["pdmn"] == .text("dk"))
        }
    }

    @Test func updateSetsModificationDateStrictlyLaterAndKeepsCreationDate() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let before = try fx.attributes("svc", "alice")
            try fx.service.update(
                query("svc", "alice"), attributes: ["labl": .text("1"), "mdat": .date(5)], caller: Fixture.app)
            let middle = try fx.attributes("svc", "alice")
            try fx.service.update(query("svc", "alice"), attributes: ["labl": .text("2")], caller: Fixture.app)
            let after = try fx.attributes("svc", "alice")
            #expect(middle["cdat"] == before["cdat"] && after["cdat"] == before["cdat"])
            let m0 = try #require(before["mdat"]?.date)
            let m1 = try #require(middle["mdat"]?.date)
            let m2 = try #require(after["mdat"]?.date)
            #expect(m0 < m1 && m1 < m2)
        }
    }

    @Test func updateWithNoMatchIsItemNotFound() throws {
        try withKeychain { (fx) throws in
            #expect(
                status {
                    try fx.service.update(query("svc", "nobody"), attributes: ["labl": .text("x")], caller: Fixture.app)
                } == .itemNotFound)
        }
    }

    @Test func updateIntoAGroupTheCallerLacksIsMissingEntitlement() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            #expect(
                status {
                    try fx.service.update(
                        query("svc", "alice"), attributes: ["agrp": .text("TEAM.other")], caller: Fixture.app)
                } == .missingEntitlement)
        }
    }
}

@Suite struct DeleteRules {
    @Test func deleteRemovesEveryMatch() throws {
        try withKeychain { (fx) throws in
            for a in ["a", "b", "c"] { try fx.add("svc", a) }
            try fx.add("keep", "a")
            try fx.service.delete(["class": .text("genp"), "svce": .text("svc")], caller: Fixture.app)
            #expect(try fx.count() == 1)
            #expect(try fx.secret("keep", "a") == "pw")
        }
    }

    @Test func aMatchLimitInDeleteIsParamUnlessItIsAll() throws {
        try withKeychain { (fx) throws in
            for a in ["a", "b"] { try fx.add("svc", a) }
            try fx.add("other", "a")
            for limit: Value in [.text("m_LimitOne"), .int(1), .int(5)] {
                #expect(
                    status { try fx.service.delete(query("svc", "a", ["m_Limit": limit]), caller: Fixture.app) }
                        == .param)
            }
            #expect(try fx.count() == 3)
            // kSecMatchLimitAll says what a delete does anyway (macOS accepts it; KeychainAccess adds it).
            try fx.service.delete(
                ["class": .text("genp"), "svce": .text("svc"), "m_Limit": .text("m_LimitAll")], caller: Fixture.app)
            #expect(try fx.count() == 1)
            #expect(try fx.secret("other", "a") == "pw")
        }
    }

    @Test func returnKeysInDeleteAreParam() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            #expect(
                status { try fx.service.delete(query("svc", "a", ["r_Data": .bool(true)]), caller: Fixture.app) }
                    == .param)
        }
    }

    @Test func deleteWithNoMatchIsItemNotFound() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.service.delete(query("svc", "a"), caller: Fixture.app) } == .itemNotFound)
        }
    }

    @Test func deleteLeavesSynchronizableItemsUnlessAsked() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a")
            try fx.add("svc", "a", ["sync": .bool(true)])
            try fx.service.delete(query("svc", "a"), caller: Fixture.app)
            #expect(try fx.count() == 1)
            try fx.service.delete(query("svc", "a", ["sync": .text("syna")]), caller: Fixture.app)
            #expect(try fx.count() == 0)
        }
    }
}

@Suite struct PersistentRefRules {
    func ref(_ fx: Fixture, _ svce: String, _ acct: String) throws -> Value {
        try #require(try fx.copy(query(svce, acct, ["r_PersistentRef": .bool(true)])))
    }

    @Test func persistentRefFindsTheItemAcrossRestarts() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "s", ["sync": .bool(true)])
            let r = try #require(
                try fx.copy(query("svc", "alice", ["sync": .bool(true), "r_PersistentRef": .bool(true)])))
            try fx.reopen()
            // Without class, and although the item is synchronizable (no implicit sync filter).
            #expect(try fx.copy(["v_PersistentRef": r, "r_Data": .bool(true)]) == bytes("s"))
            #expect(
                try fx.copy(["class": .text("genp"), "v_PersistentRef": r, "r_Attributes": .bool(true)])?.map?["acct"]
                    == .text("alice"))
        }
    }

    @Test func persistentRefStaysValidThroughUpdates() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let r = try ref(fx, "svc", "alice")
            try fx.service.update(
                ["v_PersistentRef": r], attributes: ["acct": .text("bob"), "pdmn": .text("ck"), "v_Data": bytes("n")],
                caller: Fixture.app)
            #expect(try fx.copy(["v_PersistentRef": r, "r_Data": .bool(true)]) == bytes("n"))
            try fx.service.delete(["v_PersistentRef": r], caller: Fixture.app)
            #expect(status { try fx.copy(["v_PersistentRef": r]) } == .itemNotFound)
        }
    }

    @Test func persistentRefWithAttributeFiltersIsParam() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let r = try ref(fx, "svc", "alice")
            #expect(status { try fx.copy(["v_PersistentRef": r, "svce": .text("svc")]) } == .param)
            #expect(status { try fx.copy(["v_PersistentRef": r, "agrp": .text("TEAM.app")]) } == .param)
            #expect(
                status { try fx.service.delete(["v_PersistentRef": r, "acct": .text("alice")], caller: Fixture.app) }
                    == .param)
        }
    }

    @Test func malformedPersistentRefIsParam() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.copy(["v_PersistentRef": .bytes([1, 2, 3])]) } == .param)
            #expect(status { try fx.copy(["v_PersistentRef": .text("genp0123456789abcdef")]) } == .param)
            #expect(
                status {
                    try fx.copy(["v_PersistentRef": .bytes(Array("cert".utf8) + [UInt8](repeating: 0, count: 16))])
                } == .param)
            // An internet password's reference is one; it names no item here.
            #expect(
                status {
                    try fx.copy(["v_PersistentRef": .bytes(Array("inet".utf8) + [UInt8](repeating: 0, count: 16))])
                } == .itemNotFound)
        }
    }

    @Test func persistentRefOfAnotherAppsItemIsNotFound() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            let r = try ref(fx, "svc", "alice")
            #expect(status { try fx.copy(["v_PersistentRef": r], caller: Fixture.other) } == .itemNotFound)
            #expect(status { try fx.service.delete(["v_PersistentRef": r], caller: Fixture.other) } == .itemNotFound)
            #expect(
                status {
                    try fx.service.update(
                        ["v_PersistentRef": r], attributes: ["labl": .text("x")], caller: Fixture.other)
                } == .itemNotFound)
        }
    }
}

@Suite struct AccessGroupRules {
    @Test func queryWithoutGroupSearchesAllCallerGroups() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", ["agrp": .text("TEAM.shared")])
            #expect(try fx.secret("svc", "a") == "pw")
            #expect(try fx.copy(["class": .text("genp"), "m_Limit": .text("m_LimitAll")]) == nil)
        }
    }

    @Test func namingAGroupTheCallerLacksIsMissingEntitlement() throws {
        try withKeychain { (fx) throws in
            let foreign: [String: Value] = ["agrp": .text("TEAM.other")]
            #expect(status { try fx.add("svc", "a", foreign) } == .missingEntitlement)
            #expect(status { try fx.copy(query("svc", "a", foreign)) } == .missingEntitlement)
            #expect(
                status {
                    try fx.service.update(
                        query("svc", "a", foreign), attributes: ["labl": .text("x")], caller: Fixture.app)
                } == .missingEntitlement)
            #expect(
                status { try fx.service.delete(query("svc", "a", foreign), caller: Fixture.app) } == .missingEntitlement
            )
        }
    }

    @Test func emptyGroupListIsMissingEntitlement() throws {
        try withKeychain { (fx) throws in
            let none = Caller(accessGroups: [])
            #expect(status { try fx.add("svc", "a", caller: none) } == .missingEntitlement)
            #expect(status { try fx.copy(query("svc", "a"), caller: none) } == .missingEntitlement)
            #expect(status { try fx.service.delete(query("svc", "a"), caller: none) } == .missingEntitlement)
        }
    }

    @Test func otherAppsItemsDoNotExist() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "mine")
            #expect(status { try fx.copy(query("svc", "a"), caller: Fixture.other) } == .itemNotFound)
            #expect(status { try fx.service.delete(query("svc", "a"), caller: Fixture.other) } == .itemNotFound)
            // The other app has its own item under the same service and account.
            try fx.add("svc", "a", secret: "theirs", caller: Fixture.other)
            #expect(try fx.secret("svc", "a", caller: Fixture.other) == "theirs")
            #expect(try fx.secret("svc", "a") == "mine")
        }
    }

    @Test func appsListingTheSameGroupShareItsItems() throws {
        try withKeychain { (fx) throws in
            let second = Caller(accessGroups: ["TEAM.second", "TEAM.shared"])
            try fx.add("device", "id", secret: "UUID", ["agrp": .text("TEAM.shared")])
            #expect(try fx.secret("device", "id", caller: second) == "UUID")
        }
    }

    @Test func adminMayNameAnyGroupAndSearchAllGroups() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "a", secret: "app")
            try fx.add("svc", "b", secret: "other", caller: Fixture.other)
            #expect(
                try fx.copy(
                    ["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Data": .bool(true)],
                    caller: Fixture.admin)?.array?.count == 2)
            #expect(try fx.secret("svc", "a", ["agrp": .text("TEAM.app")], caller: Fixture.admin) == "app")
            try fx.add("svc", "c", ["agrp": .text("TEAM.other")], caller: Fixture.admin)
            #expect(try fx.secret("svc", "c", caller: Fixture.other) == "pw")
            // The admin's own default group for adds.
            let attrs = try fx.add("svc", "d", ["r_Attributes": .bool(true)], caller: Fixture.admin)
            #expect(attrs?.map?["agrp"] == .text("keychainctl"))
        }
    }
}
