import KeychainCore
import KeychainItemsTestSupport
import KeychainSystem
import Testing

@testable import KeychainItems

/// A `kSecClassInternetPassword` item as an app adds it.
private func inet(
    _ server: String, _ account: String, secret: String = "pw", _ extra: [String: Value] = [:]
) -> [String: Value] {
    var q: [String: Value] = [
        "class": .text("inet"), "srvr": .text(server), "acct": .text(account), "ptcl": .text("htps"),
        "v_Data": .bytes(Array(secret.utf8)),
    ]
    for (k, v) in extra { q[k] = v }
    return q
}

private func inetQuery(_ server: String, _ account: String, _ extra: [String: Value] = [:]) -> [String: Value] {
    var q: [String: Value] = ["class": .text("inet"), "srvr": .text(server), "acct": .text(account)]
    for (k, v) in extra { q[k] = v }
    return q
}

@Suite struct ItemClassDescriptions {
    @Test func classesAreFoundByTheirCodes() {
        #expect(ItemClass(code: "genp") == .genericPassword)
        #expect(ItemClass(code: "inet") == .internetPassword)
        #expect(ItemClass(code: "cert") == nil)
        #expect(ItemClass.internetPassword.constant == "kSecClassInternetPassword")
    }

    @Test func attributeTypesAreTheClassDescriptions() {
        var described: Set<String> = []
        for itemClass in ItemClass.all {
            for spec in itemClass.attributes {
                let attribute = Attribute(rawValue: spec.key)
                #expect(attribute?.kind == spec.type, "\(itemClass.code) \(spec.key)")
                described.insert(spec.key)
            }
        }
        // Every attribute the parser knows belongs to some class.
        #expect(Set(Attribute.allCases.map(\.rawValue)) == described)
    }

    @Test func uniquenessIsApples() {
        #expect(ItemClass.genericPassword.uniqueness.sorted() == ["acct", "agrp", "svce", "sync"])
        #expect(
            ItemClass.internetPassword.uniqueness.sorted()
                == ["acct", "agrp", "atyp", "path", "port", "ptcl", "sdmn", "srvr", "sync"])
    }

    @Test func attributesBelongToTheirClass() {
        #expect(Attribute("svce", of: .genericPassword) == .service)
        #expect(Attribute("svce", of: .internetPassword) == nil)
        #expect(Attribute("srvr", of: .internetPassword) == .server)
        #expect(Attribute("srvr", of: .genericPassword) == nil)
        #expect(Attribute("gena", of: .internetPassword) == nil)
        #expect(Attribute("labl", of: .internetPassword) == .label)
        #expect(Attribute.port.kind == .uint32)
        #expect(Attribute.protocol.kind == .text)
    }

    @Test func persistentReferencesNameTheirClass() throws {
        let id = [UInt8](repeating: 7, count: PersistentRef.idLength)
        let ref = PersistentRef.make(id: id, of: .internetPassword)
        #expect(Array(ref.prefix(4)) == Array("inet".utf8))
        let (itemClass, parsed) = try #require(PersistentRef.parse(ref))
        #expect(itemClass == .internetPassword)
        #expect(parsed == id)
        #expect(PersistentRef.parse(Array("cert".utf8) + id) == nil)
    }

    @Test func apple_protocolAndAuthenticationValues() {
        let protocols = Dictionary(uniqueKeysWithValues: InternetProtocol.all.map { ($0.name, $0.code) })
        #expect(protocols["HTTPS"] == "htps")
        #expect(protocols["FTP"] == "ftp ")
        #expect(protocols["SSH"] == "ssh ")
        #expect(protocols.values.allSatisfy { $0.utf8.count == 4 })
        let auth = Dictionary(uniqueKeysWithValues: AuthenticationType.all.map { ($0.name, $0.code) })
        #expect(auth["HTMLForm"] == "form")
        #expect(auth["Default"] == "dflt")
        #expect(auth["HTTPBasic"] == "http")
    }
}

@Suite struct InternetPasswordRules {
    @Test func parsingTakesTheClassAttributes() throws {
        let parsed = try ParsedQuery(
            inetQuery("example.com", "alice", ["port": .int(443), "path": .text("/login"), "atyp": .text("form")]),
            for: .copy)
        #expect(parsed.itemClass == .internetPassword)
        #expect(parsed.attributes[.port] == .int(443))
        #expect(parsed.attributes[.server] == .text("example.com"))
        // A generic password's attribute is not one of an internet password, and the reverse.
        #expect(throws: KeychainError.self) { try ParsedQuery(inetQuery("h", "a", ["svce": .text("s")]), for: .copy) }
        let error = try #require(failure { try ParsedQuery(inetQuery("h", "a", ["gena": .bytes([1])]), for: .add) })
        #expect(error.status == .noSuchAttr)
        #expect(error.message.contains("internet password"))
        #expect(status { try ParsedQuery(inetQuery("h", "a", ["port": .text("https")]), for: .copy) } == .param)
        #expect(status { try ParsedQuery(inetQuery("h", "a", ["port": .int(-1)]), for: .copy) } == .param)
    }

    @Test func addCopyUpdateDelete() throws {
        try withKeychain { (fx) throws in
            _ = try fx.service.add(
                inet("example.com", "alice", ["port": .int(443), "path": .text("/")]), caller: Fixture.app)
            var q = inetQuery("example.com", "alice")
            q["r_Data"] = .bool(true)
            #expect(try fx.copy(q)?.secretBytes?.unprotectedArray == Array("pw".utf8))
            q["r_Data"] = nil
            q["r_Attributes"] = .bool(true)
            let attributes = try #require(try fx.copy(q)?.map)
            #expect(attributes["srvr"] == .text("example.com"))
            #expect(attributes["ptcl"] == .text("htps"))
            #expect(attributes["port"] == .int(443))
            #expect(attributes["path"] == .text("/"))
            #expect(attributes["class"] == nil)
            #expect(attributes["svce"] == nil)
            // By a persistent reference: the class is in it.
            q["r_Attributes"] = nil
            q["r_PersistentRef"] = .bool(true)
            let ref = try #require(try fx.copy(q)?.bytes)
            #expect(Array(ref.prefix(4)) == Array("inet".utf8))
            #expect(
                try fx.copy(["v_PersistentRef": .bytes(ref), "r_Attributes": .bool(true)])?.map?["srvr"]
                    == .text("example.com"))
            #expect(status { try fx.copy(["class": .text("genp"), "v_PersistentRef": .bytes(ref)]) } == .param)

            try fx.service.update(
                inetQuery("example.com", "alice"), attributes: ["v_Data": bytes("new"), "sdmn": .text("realm")],
                caller: Fixture.app)
            var read = inetQuery("example.com", "alice", ["sdmn": .text("realm"), "r_Data": .bool(true)])
            #expect(try fx.copy(read)?.secretBytes?.unprotectedArray == Array("new".utf8))
            #expect(
                status {
                    try fx.service.update(
                        inetQuery("example.com", "alice"), attributes: ["svce": .text("x")], caller: Fixture.app)
                } == .noSuchAttr)

            try fx.service.delete(inetQuery("example.com", "alice"), caller: Fixture.app)
            read["sdmn"] = nil
            #expect(status { try fx.copy(read) } == .itemNotFound)
        }
    }

    @Test func uniquenessIsApples() throws {
        try withKeychain { (fx) throws in
            _ = try fx.service.add(inet("example.com", "alice"), caller: Fixture.app)
            let error = try #require(failure { try fx.service.add(inet("example.com", "alice"), caller: Fixture.app) })
            #expect(error.status == .duplicateItem)
            #expect(error.message.contains("internet password"))
            // Another port, protocol, path, security domain or authentication type is another item.
            for extra: [String: Value] in [
                ["port": .int(8443)], ["ptcl": .text("http")], ["path": .text("/a")], ["sdmn": .text("r")],
                ["atyp": .text("form")],
            ] {
                _ = try fx.service.add(inet("example.com", "alice", extra), caller: Fixture.app)
            }
            #expect(
                status { try fx.service.add(inet("example.com", "alice", ["port": .int(8443)]), caller: Fixture.app) }
                    == .duplicateItem)
            // Port 0 is an absent port, as Apple's default.
            _ = try fx.service.add(inet("b.example", "alice"), caller: Fixture.app)
            #expect(
                status { try fx.service.add(inet("b.example", "alice", ["port": .int(0)]), caller: Fixture.app) }
                    == .duplicateItem)
            // A generic password with the server as its service is no duplicate.
            try fx.add("example.com", "alice")
            // An update that would make two internet passwords one is refused.
            #expect(
                status {
                    try fx.service.update(
                        inetQuery("example.com", "alice", ["port": .int(8443)]), attributes: ["port": .int(0)],
                        caller: Fixture.app)
                } == .duplicateItem)
        }
    }

    @Test func aQueryOfOneClassNeverReturnsTheOther() throws {
        try withKeychain { (fx) throws in
            try fx.add("example.com", "alice", secret: "generic")
            _ = try fx.service.add(inet("example.com", "alice", secret: "internet"), caller: Fixture.app)
            // Point lookup, by account alone, by group alone.
            #expect(try fx.secret("example.com", "alice") == "generic")
            let byAccount = try #require(
                try fx.copy([
                    "class": .text("genp"), "acct": .text("alice"), "m_Limit": .text("m_LimitAll"),
                    "r_Data": .bool(true),
                ])?.array)
            #expect(byAccount.map { $0.secretBytes?.unprotectedArray } == [Array("generic".utf8)])
            let all = try #require(
                try fx.copy(["class": .text("inet"), "m_Limit": .text("m_LimitAll"), "r_Data": .bool(true)])?.array)
            #expect(all.map { $0.secretBytes?.unprotectedArray } == [Array("internet".utf8)])
            let generic = try #require(
                try fx.copy(["class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true)])?
                    .array)
            #expect(generic.count == 1)
            #expect(generic.first?.map?["srvr"] == nil)
            // A delete of all generic passwords leaves the internet password.
            try fx.service.delete(["class": .text("genp")], caller: Fixture.app)
            #expect(
                try fx.copy(["class": .text("inet"), "srvr": .text("example.com"), "r_Data": .bool(true)])?.secretBytes?
                    .unprotectedArray == Array("internet".utf8))
            #expect(status { try fx.copy(["class": .text("genp"), "acct": .text("alice")]) } == .itemNotFound)
        }
    }

    @Test func survivesAReopen() throws {
        try withKeychain { (fx) throws in
            _ = try fx.service.add(
                inet("example.com", "alice", ["port": .int(21), "ptcl": .text("ftp ")]), caller: Fixture.app)
            try fx.reopen()
            #expect(
                try fx.copy(inetQuery("example.com", "alice", ["ptcl": .text("ftp "), "r_Data": .bool(true)]))?
                    .secretBytes != nil)
        }
    }

    /// A passphrase re-keys every row's digests (docs/security.md §3): an internet password's, under
    /// its own domains, too. A backup carries the class, and a restore puts it back as it was.
    @Test func passphraseChangesAndBackupsKeepTheClass() throws {
        try withProtectedKeychain { fx in
            let login = inetQuery("example.com", "alice", ["ptcl": .text("htps"), "port": .int(443)])
            _ = try fx.service.add(
                login.merging(["v_Data": bytes("pw"), "pdmn": .text("ck")]) { $1 }, caller: Fixture.app)
            try fx.service.changePassphrase(old: nil, new: pass("one"))
            #expect(
                status { try fx.service.add(login.merging(["v_Data": bytes("again")]) { $1 }, caller: Fixture.app) }
                    == .duplicateItem)
            let read = login.merging(["r_Data": .bool(true)]) { $1 }
            #expect(
                try fx.service.copyMatching(read, caller: Fixture.app)?.secretBytes?.unprotectedArray
                    == Array("pw".utf8))
            #expect(
                status {
                    try fx.service.copyMatching(["class": .text("genp"), "acct": .text("alice")], caller: Fixture.app)
                } == .itemNotFound)

            let file = try fx.service.backup(passphrase: pass("bk"))
            let target = try ProtectedFixture()
            defer { target.cleanup() }
            let result = try target.service.restore(passphrase: pass("bk"), data: file)
            #expect(result.restored == 1)
            #expect(
                try target.service.copyMatching(read, caller: Fixture.app)?.secretBytes?.unprotectedArray
                    == Array("pw".utf8))
            let ref = try #require(
                try target.service.copyMatching(
                    login.merging(["r_PersistentRef": .bool(true)]) { $1 }, caller: Fixture.app)?.bytes)
            #expect(Array(ref.prefix(4)) == Array("inet".utf8))
            #expect(
                status { try target.service.add(login.merging(["v_Data": bytes("again")]) { $1 }, caller: Fixture.app) }
                    == .duplicateItem)
        }
    }
}
