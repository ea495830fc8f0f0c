import KeychainCore
import KeychainItemsTestSupport
import Testing

@testable import KeychainItems

@Suite struct AddRules {
    @Test func addedSecretReadsBack() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "s3cret")
            #expect(try fx.secret("svc", "alice") == "s3cret")
        }
    }

    @Test func secondAddWithSameKeyIsDuplicateItem() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            #expect(status { try fx.add("svc", "alice", secret: "other") } == .duplicateItem)
            #expect(try fx.secret("svc", "alice") == "pw")
        }
    }

    @Test func uniquenessIgnoresNonKeyAttributes() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", ["labl": .text("one"), "pdmn": .text("ak")])
            #expect(
                status { try fx.add("svc", "alice", ["labl": .text("two"), "pdmn": .text("dk"), "gena": bytes("g")]) }
                    == .duplicateItem)
        }
    }

    @Test func itemsDifferingOnlyInSyncCoexist() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "local")
            try fx.add("svc", "alice", secret: "synced", ["sync": .bool(true)])
            #expect(try fx.secret("svc", "alice") == "local")
            #expect(try fx.secret("svc", "alice", ["sync": .bool(true)]) == "synced")
        }
    }

    @Test func itemsDifferingOnlyInAccessGroupCoexist() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", secret: "a", ["agrp": .text("TEAM.app")])
            try fx.add("svc", "alice", secret: "b", ["agrp": .text("TEAM.shared")])
            #expect(try fx.secret("svc", "alice", ["agrp": .text("TEAM.shared")]) == "b")
        }
    }

    @Test func textAndDataWithTheSameBytesAreTheSameKey() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            var q = item("svc", "x")
            q["acct"] = bytes("alice")
            #expect(status { try fx.service.add(q, caller: Fixture.app) } == .duplicateItem)
        }
    }

    @Test func defaultAccessibilityIsWhenUnlocked() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            #expect(try fx.attributes("svc", "alice")["pdmn"] == .text("ak"))
        }
    }

    @Test func addWithoutGroupGoesToCallersFirstGroup() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            #expect(try fx.attributes("svc", "alice")["agrp"] == .text("TEAM.app"))
        }
    }

    @Test func omittedServiceAndAccountAreEmptyStrings() throws {
        try withKeychain { (fx) throws in
            _ = try fx.service.add(["class": .text("genp"), "v_Data": bytes("x")], caller: Fixture.app)
            let attrs = try fx.copy(["class": .text("genp"), "r_Attributes": .bool(true)])?.map
            #expect(attrs?["svce"] == .text(""))
            #expect(attrs?["acct"] == .text(""))
        }
    }

    @Test func callerDatesAreOverwrittenOnAdd() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", ["cdat": .date(1000), "mdat": .date(2000)])
            let attrs = try fx.attributes("svc", "alice")
            let cdat = try #require(attrs["cdat"]?.date)
            #expect(cdat > 1_600_000_000)
            #expect(attrs["mdat"] == attrs["cdat"])
        }
    }

    @Test func addWithoutReturnKeysReturnsNothing() throws {
        try withKeychain { (fx) throws in
            let result = try fx.add("svc", "alice")
            #expect(result == nil)
        }
    }

    @Test func addWithReturnAttributesReturnsTheDefaultsChosen() throws {
        try withKeychain { (fx) throws in
            let result = try fx.add("svc", "alice", ["r_Attributes": .bool(true), "labl": .text("L")])
            let attrs = try #require(result?.map)
            #expect(attrs["agrp"] == .text("TEAM.app"))
            #expect(attrs["pdmn"] == .text("ak"))
            #expect(attrs["sync"] == .bool(false))
            #expect(attrs["labl"] == .text("L"))
            #expect(attrs["cdat"]?.date != nil && attrs["mdat"]?.date != nil)
            #expect(attrs["v_Data"] == nil && attrs["class"] == nil)
        }
    }

    @Test func addWithReturnDataAndRefReturnsOneMap() throws {
        try withKeychain { (fx) throws in
            let result = try fx.add(
                "svc", "alice", secret: "s", ["r_Data": .bool(true), "r_PersistentRef": .bool(true)])
            let map = try #require(result?.map)
            #expect(map["v_Data"] == bytes("s"))
            #expect(map["v_PersistentRef"]?.bytes?.count == 20)
            #expect(map["svce"] == nil)
        }
    }

    @Test func persistentRefInAddIsParam() throws {
        try withKeychain { (fx) throws in
            #expect(
                status {
                    try fx.add(
                        "svc", "alice",
                        ["v_PersistentRef": .bytes(Array("genp".utf8) + [UInt8](repeating: 0, count: 16))])
                } == .param)
        }
    }

    @Test func matchKeysInAddAreParam() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.add("svc", "alice", ["m_Limit": .text("m_LimitOne")]) } == .param)
            let count = try fx.count()
            #expect(count == 0)
        }
    }

    @Test func synchronizableAnyInAddIsParam() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.add("svc", "alice", ["sync": .text("syna")]) } == .param)
        }
    }

    @Test func valueDataMustBeData() throws {
        try withKeychain { (fx) throws in
            var q = item("svc", "alice")
            q["v_Data"] = .text("hunter2-plain")
            let error = try #require(failure { try fx.service.add(q, caller: Fixture.app) })
            #expect(error.status == .param)
            #expect(error.message.contains("v_Data"))
            #expect(!error.message.contains("hunter2"))
        }
    }

    @Test func invalidAccessibilityIsParam() throws {
        try withKeychain { (fx) throws in
            let error = try #require(failure { try fx.add("svc", "alice", ["pdmn": .text("sometimes-secret")]) })
            #expect(error.status == .param)
            #expect(error.message.contains("pdmn") && !error.message.contains("sometimes-secret"))
        }
    }

    @Test func whenPasscodeSetItemsNeedAPassphrase() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.add("svc", "alice", ["pdmn": .text("akpu")]) } == .authFailed)
        }
    }

    @Test func absentDataReadsBackAsEmptyData() throws {
        try withKeychain { (fx) throws in
            _ = try fx.service.add(query("svc", "alice"), caller: Fixture.app)
            #expect(try fx.copy(query("svc", "alice", ["r_Data": .bool(true)])) == .bytes([]))
        }
    }
}
