import KeychainCore
import KeychainItemsTestSupport
import Testing

@testable import KeychainItems

@Suite struct ParsingRules {
    @Test func missingClassIsParam() throws {
        try withKeychain { (fx) throws in
            var q = item("svc", "alice")
            q["class"] = nil
            #expect(status { try fx.service.add(q, caller: Fixture.app) } == .param)
            #expect(status { try fx.copy(["svce": .text("svc")]) } == .param)
            #expect(status { try fx.service.delete(["svce": .text("svc")], caller: Fixture.app) } == .param)
            #expect(
                status {
                    try fx.service.update(["svce": .text("svc")], attributes: ["labl": .text("x")], caller: Fixture.app)
                } == .param)
        }
    }

    @Test func unknownClassIsNoSuchClass() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.add("svc", "alice", ["class": .text("cert")]) } == .noSuchClass)
            #expect(status { try fx.copy(["class": .text("keys")]) } == .noSuchClass)
            // The class decides, though the attributes of that class sort before `class`.
            #expect(status { try fx.copy(["class": .text("cert"), "ctyp": .int(1)]) } == .noSuchClass)
            #expect(status { try fx.copy(["class": .text("keys"), "atag": .bytes([1])]) } == .noSuchClass)
        }
    }

    @Test func classOfWrongTypeIsParam() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.add("svc", "alice", ["class": .int(1)]) } == .param)
        }
    }

    @Test func unknownFourCharacterKeyIsNoSuchAttr() throws {
        try withKeychain { (fx) throws in
            let error = try #require(failure { try fx.add("svc", "alice", ["srvr": .text("host")]) })
            #expect(error.status == .noSuchAttr)
            #expect(error.message.contains("srvr"))
            #expect(status { try fx.copy(query("svc", "alice", ["port": .int(1)])) } == .noSuchAttr)
        }
    }

    @Test func unknownNonAttributeKeysAreParam() throws {
        try withKeychain { (fx) throws in
            #expect(status { try fx.copy(query("svc", "alice", ["r_Ref": .bool(true)])) } == .param)
            #expect(status { try fx.copy(query("svc", "alice", ["v_Whatever": .bool(true)])) } == .param)
            #expect(status { try fx.copy(query("svc", "alice", ["m_Policy": .bool(true)])) } == .param)
            #expect(status { try fx.copy(query("svc", "alice", ["someLongKey": .bool(true)])) } == .param)
        }
    }

    @Test func dataProtectionKeychainFlagIsANoOp() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice", ["nleg": .bool(true)])
            #expect(try fx.secret("svc", "alice", ["nleg": .bool(true)]) == "pw")
            // kSecUseNoAuthenticationUI as Apple spells it on the wire, from clients other than ours.
            #expect(try fx.secret("svc", "alice", ["u_NoAuthUI": .bool(true)]) == "pw")
        }
    }

    @Test func wrongTypeIsParamNamingTheKeyNotTheValue() throws {
        try withKeychain { (fx) throws in
            let cases: [(String, Value)] = [
                ("svce", .int(7)), ("agrp", bytes("TEAM.app")), ("labl", .bool(true)),
                ("crtr", .text("not-a-number-zz")), ("invi", .text("maybe-zz")),
                ("cdat", .text("yesterday-zz")), ("gena", .int(3)), ("pdmn", .int(6)),
            ]
            for (key, value) in cases {
                let error = try #require(failure { try fx.add("svc", "alice", [key: value]) })
                #expect(error.status == .param, "\(key)")
                #expect(error.message.contains(key), "\(key)")
                #expect(!error.message.contains("zz"), "\(key)")
            }
        }
    }

    @Test func returnFlagsMustBeBooleans() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            #expect(status { try fx.copy(query("svc", "alice", ["r_Data": .int(1)])) } == .param)
            #expect(status { try fx.copy(query("svc", "alice", ["r_Attributes": .text("yes")])) } == .param)
        }
    }

    @Test func numbersAndFlagsAreCoercedAsApple() throws {
        try withKeychain { (fx) throws in
            try fx.add(
                "svc", "a", ["crtr": .int(0x61626364), "type": .text("42"), "invi": .int(1), "nega": .text("0")])
            let attrs = try fx.attributes("svc", "a")
            #expect(attrs["crtr"] == .int(0x61626364))
            #expect(attrs["type"] == .int(42))
            #expect(attrs["invi"] == .bool(true))
            #expect(attrs["nega"] == .bool(false))
            #expect(status { try fx.add("svc", "b", ["crtr": .int(-1)]) } == .param)
            #expect(status { try fx.add("svc", "c", ["type": .int(1 << 32)]) } == .param)
            // Queries coerce the same way.
            #expect(try fx.secret("svc", "a", ["type": .int(42), "invi": .bool(true)]) == "pw")
        }
    }

    @Test func attributesReadBackWithTheTypeTheyWereWritten() throws {
        try withKeychain { (fx) throws in
            var q = item("svc", "x")
            q["acct"] = bytes("raw-account")
            q["gena"] = .bytes([0, 1, 2, 255])
            _ = try fx.service.add(q, caller: Fixture.app)
            let attrs = try fx.copy(["class": .text("genp"), "acct": bytes("raw-account"), "r_Attributes": .bool(true)]
            )?.map
            #expect(attrs?["acct"] == bytes("raw-account"))
            #expect(attrs?["svce"] == .text("svc"))
            #expect(attrs?["gena"] == .bytes([0, 1, 2, 255]))
        }
    }

    @Test func matchLimitMustBeOneAllOrPositive() throws {
        try withKeychain { (fx) throws in
            try fx.add("svc", "alice")
            for bad: Value in [.int(0), .int(-3), .text("m_LimitSome"), .bool(true)] {
                #expect(status { try fx.copy(query("svc", "alice", ["m_Limit": bad])) } == .param)
            }
        }
    }
}
