import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItemsTestSupport
import KeychainSystem
import Testing

@testable import KeychainItems
@testable import KeychainSecretService
@testable import KeychainStore

/// Secret Service items are keychain items (ItemService+SecretService.swift, docs/secret-service.md):
/// how they look through SecItem and the reverse, search through the keyed attribute index (exact
/// also while locked), replace, the row state covering the index, the schema migration, backups, and
/// nothing in plaintext at rest.
@Suite struct SecretServiceStore {
    static let shared = Caller(accessGroups: ["secret-service"])

    func attrs(_ pairs: [(String, String)]) -> SecretServiceAttributes { SecretServiceAttributes(strings: pairs) }

    func create(
        _ fx: Fixture, _ pairs: [(String, String)], secret: String = "s", label: String = "L",
        group: String = "TEAM.app", replace: Bool = false, caller: Caller = Fixture.app
    ) throws -> [UInt8] {
        try fx.service.secretServiceCreate(
            group: group, label: label, attributes: attrs(pairs), secret: SecretBytes(Array(secret.utf8)),
            contentType: "text/plain", replace: replace, caller: caller
        ).id
    }

    func search(_ fx: Fixture, _ pairs: [(String, String)], caller: Caller = Fixture.app) throws -> (
        unlocked: [[UInt8]], locked: [[UInt8]]
    ) {
        let found = try fx.service.secretServiceSearch(attrs(pairs), groups: caller.accessGroups, caller: caller)
        return (found.unlocked.map(\.id), found.locked.map(\.id))
    }

    func secret(_ fx: Fixture, _ id: [UInt8], caller: Caller = Fixture.app) throws -> String? {
        try fx.service.secretServiceSecret(id: id, groups: caller.accessGroups, caller: caller).map {
            String(decoding: $0.secret.unprotectedArray, as: UTF8.self)
        }
    }

    @Test func serviceAndAccountMakeThePlainKeychainItemAndTheReverse() throws {
        try withKeychain { (fx) throws in
            // Secret Service → SecItem: the same item, by service and account.
            let id = try create(fx, [("service", "mail"), ("account", "alice")], secret: "from-bus", label: "Mail")
            #expect(try fx.secret("mail", "alice") == "from-bus")
            let seen = try fx.attributes("mail", "alice")
            #expect(seen["labl"] == .text("Mail") && seen["agrp"] == .text("TEAM.app") && seen["pdmn"] == .text("ak"))
            #expect(seen["gena"] == nil)
            // SecItem → Secret Service: attributes service and account, found by them.
            try fx.add("web", "bob", secret: "from-secitem", ["labl": .text("Web")])
            let found = try search(fx, [("service", "web"), ("account", "bob")])
            #expect(found.unlocked.count == 1 && found.locked.isEmpty)
            let item = try #require(
                try fx.service.secretServiceItem(id: found.unlocked[0], groups: ["TEAM.app"], caller: Fixture.app))
            #expect(item.label == "Web" && !item.ownAttributes && !item.locked)
            #expect(item.attributes == attrs([("service", "web"), ("account", "bob")]))
            #expect(try secret(fx, found.unlocked[0]) == "from-secitem")
            #expect(try search(fx, [("service", "web")]).unlocked == found.unlocked)
            #expect(try search(fx, [("service", "web"), ("account", "bob"), ("extra", "1")]).unlocked.isEmpty)
            // An update through SecItem is what the bus reads next.
            try fx.service.update(query("mail", "alice"), attributes: ["v_Data": bytes("changed")], caller: Fixture.app)
            #expect(try secret(fx, id) == "changed")
        }
    }

    @Test func networkPasswordItemsAreInternetPasswordsAndTheReverse() throws {
        try withKeychain { (fx) throws in
            let schema = ("xdg:schema", "org.gnome.keyring.NetworkPassword")
            // Secret Service → SecItem: an internet password with the schema's attributes.
            let pairs = [schema, ("user", "alice"), ("server", "example.com"), ("protocol", "https"), ("port", "443")]
            let id = try create(fx, pairs, secret: "net", label: "x")
            let inet: [String: Value] = ["class": .text("inet"), "srvr": .text("example.com"), "acct": .text("alice")]
            let found = try #require(
                try fx.copy(
                    inet.merging(["ptcl": .text("htps"), "port": .int(443), "r_Attributes": .bool(true)]) { $1 }))
            guard case .map(let seen) = found else { throw KeychainError(.param, "not a map") }
            #expect(seen["labl"] == .text("x") && seen["gena"] == nil && seen["path"] == .text(""))
            #expect(throws: KeychainError.self) { try fx.copy(["class": .text("genp"), "acct": .text("alice")]) }
            let item = try #require(try fx.service.secretServiceItem(id: id, groups: ["TEAM.app"], caller: Fixture.app))
            #expect(item.attributes == attrs(pairs) && !item.ownAttributes)
            #expect(try search(fx, [("server", "example.com"), ("port", "443")]).unlocked == [id])
            #expect(try search(fx, [("server", "example.com"), ("port", "80")]).unlocked.isEmpty)
            #expect(try search(fx, [("service", "example.com"), ("account", "alice")]).unlocked.isEmpty)
            // Replace keeps the one item.
            #expect(try create(fx, pairs, secret: "renewed", label: "x", replace: true) == id)
            #expect(try secret(fx, id) == "renewed")
            // SecItem → Secret Service: the schema and every attribute that is set.
            _ = try fx.service.add(
                [
                    "class": .text("inet"), "srvr": .text("mail.example.org"), "acct": .text("bob"),
                    "ptcl": .text("imps"), "port": .int(993), "sdmn": .text("realm"), "atyp": .text("dflt"),
                    "v_Data": bytes("imap-pw"),
                ], caller: Fixture.app)
            let other = try search(fx, [("user", "bob"), ("protocol", "imaps")]).unlocked
            #expect(other.count == 1)
            let shown = try #require(
                try fx.service.secretServiceItem(id: other[0], groups: ["TEAM.app"], caller: Fixture.app))
            #expect(
                shown.attributes
                    == attrs([
                        schema, ("user", "bob"), ("server", "mail.example.org"), ("protocol", "imaps"), ("port", "993"),
                        ("domain", "realm"), ("authtype", "dflt"),
                    ]))
            #expect(try search(fx, [schema]).unlocked.count == 2)
            // Attributes set on the bus are its internet-password attributes; others are refused.
            #expect(
                try fx.service.secretServiceSetAttributes(
                    id: other[0], groups: ["TEAM.app"],
                    attributes: attrs([schema, ("user", "bob"), ("server", "imap.example.org")]),
                    caller: Fixture.app))
            #expect(
                try fx.copy([
                    "class": .text("inet"), "srvr": .text("imap.example.org"), "acct": .text("bob"),
                    "r_Attributes": .bool(true),
                ]) != nil)
            #expect(throws: KeychainError.self) {
                try fx.service.secretServiceSetAttributes(
                    id: other[0], groups: ["TEAM.app"], attributes: attrs([schema, ("colour", "blue")]),
                    caller: Fixture.app)
            }
            // Not exactly the schema's shape (a port that is no number): a Secret Service item of its own.
            let odd = try create(fx, [schema, ("server", "example.net"), ("port", "https")])
            #expect(
                try fx.service.secretServiceItem(id: odd, groups: ["TEAM.app"], caller: Fixture.app)?.ownAttributes
                    == true)
        }
    }

    @Test func otherAttributesAreTheItemsOwnAndItsAccountIsItsID() throws {
        try withKeychain { (fx) throws in
            let pairs = [("service", "svc"), ("username", "carol"), ("xdg:schema", "org.example.Schema")]
            let id = try create(fx, pairs, secret: "own")
            let item = try #require(try fx.service.secretServiceItem(id: id, groups: ["TEAM.app"], caller: Fixture.app))
            #expect(item.ownAttributes && item.attributes == attrs(pairs))
            // Through SecItem: service from the `service` attribute, account = the id in hex.
            let seen = try fx.attributes("svc", ItemService.hex(id))
            #expect(seen["labl"] == .text("L"))
            #expect(try fx.secret("svc", ItemService.hex(id)) == "own")
            // Found by any subset of its attributes, by none that it lacks.
            #expect(try search(fx, [("username", "carol")]).unlocked == [id])
            #expect(try search(fx, [("xdg:schema", "org.example.Schema"), ("service", "svc")]).unlocked == [id])
            #expect(try search(fx, [("username", "CAROL")]).unlocked.isEmpty)
            // Its account is not an attribute.
            #expect(try search(fx, [("account", ItemService.hex(id))]).unlocked.isEmpty)
            // Two items with the same attributes may exist (CreateItem without replace) …
            let second = try create(fx, pairs, secret: "own-2")
            #expect(Set(try search(fx, [("username", "carol")]).unlocked) == [id, second])
            // … and replace takes the first whose attributes are exactly these.
            let replaced = try fx.service.secretServiceCreate(
                group: "TEAM.app", label: "new", attributes: attrs(pairs),
                secret: SecretBytes(Array("replaced".utf8)), contentType: "text/plain",
                replace: true, caller: Fixture.app)
            #expect(replaced.replaced && replaced.id == id)
            #expect(try secret(fx, id) == "replaced")
            // The same attributes a second time as service+account: the second one keeps them as its own.
            _ = try create(fx, [("service", "dup"), ("account", "d")], secret: "1")
            let dup = try create(fx, [("service", "dup"), ("account", "d")], secret: "2")
            #expect(try search(fx, [("service", "dup"), ("account", "d")]).unlocked.count == 2)
            #expect(try secret(fx, dup) == "2")
        }
    }

    @Test func attributesAndLabelsChangeAndTheIndexFollows() throws {
        try withKeychain { (fx) throws in
            let id = try create(fx, [("service", "s"), ("k", "v1")])
            #expect(
                try fx.service.secretServiceSetAttributes(
                    id: id, groups: ["TEAM.app"], attributes: attrs([("service", "s"), ("k", "v2")]),
                    caller: Fixture.app))
            #expect(try search(fx, [("k", "v1")]).unlocked.isEmpty)
            #expect(try search(fx, [("k", "v2")]).unlocked == [id])
            #expect(
                try fx.service.secretServiceSetLabel(
                    id: id, groups: ["TEAM.app"], label: "renamed", caller: Fixture.app))
            #expect(
                try fx.service.secretServiceItem(id: id, groups: ["TEAM.app"], caller: Fixture.app)?.label == "renamed")
            // SecItem's update of the same item keeps its Secret Service attributes.
            try fx.service.update(
                ["class": .text("genp"), "svce": .text("s")], attributes: ["labl": .text("via SecItem")],
                caller: Fixture.app)
            #expect(try search(fx, [("k", "v2")]).unlocked == [id])
            #expect(try fx.service.secretServiceDelete(id: id, groups: ["TEAM.app"], caller: Fixture.app))
            #expect(try search(fx, [("k", "v2")]).unlocked.isEmpty)
            #expect(try !fx.service.secretServiceDelete(id: id, groups: ["TEAM.app"], caller: Fixture.app))
        }
    }

    @Test func callersReachOnlyTheirGroups() throws {
        try withKeychain { (fx) throws in
            let id = try create(fx, [("service", "private")], secret: "mine")
            #expect(try search(fx, [("service", "private")], caller: Fixture.other).unlocked.isEmpty)
            #expect(try fx.service.secretServiceSecret(id: id, groups: ["TEAM.other"], caller: Fixture.other) == nil)
            #expect(try fx.service.secretServiceItem(id: id, groups: ["TEAM.other"], caller: Fixture.other) == nil)
            #expect(try !fx.service.secretServiceDelete(id: id, groups: ["TEAM.other"], caller: Fixture.other))
            // Naming a group one does not have is the keychain's own refusal.
            #expect(
                failure { try fx.service.secretServiceSearch(attrs([]), groups: ["TEAM.app"], caller: Fixture.other) }?
                    .status == .missingEntitlement)
            #expect(
                failure { try create(fx, [("a", "b")], group: "TEAM.app", caller: Fixture.other) }?.status
                    == .missingEntitlement)
            // The shared collection of unregistered bus callers is one more group.
            let policy = AccessPolicy.secretServiceCaller(
                app: nil, unidentified: "not registered", unregistered: .shared)
            #expect(try policy.get() == Self.shared)
            #expect(
                AccessPolicy.secretServiceCaller(app: nil, unidentified: "not registered", unregistered: .refuse)
                    .failureStatus == .missingEntitlement)
            let admin = try AccessPolicy.secretServiceCaller(
                app: Fixture.admin, unidentified: "", unregistered: .refuse
            ).get()
            #expect(!admin.isAdmin)  // no reach beyond its own groups on the bus
        }
    }

    @Test func lockedItemsAreFoundThroughTheKeyedIndexAlone() throws {
        try withKeychain { (fx) throws in
            let own = try create(fx, [("service", "s"), ("kind", "token")])
            try fx.add("s", "plain")
            _ = try fx.service.changePassphrase(old: nil, new: pass("pw-ss"))
            try fx.service.lock()
            #expect(!fx.service.secretServiceUnlocked)
            let found = try search(fx, [("service", "s"), ("kind", "token")])
            #expect(found.unlocked.isEmpty && found.locked == [own])
            #expect(try search(fx, [("kind", "other")]).locked.isEmpty)
            let plain = try search(fx, [("service", "s"), ("account", "plain")])
            #expect(plain.locked.count == 1 && !plain.locked.contains(own))
            #expect(try search(fx, [("service", "s")]).locked.count == 2)
            #expect(failure { try secret(fx, own) }?.status == .interactionNotAllowed)
            #expect(
                try fx.service.secretServiceItem(id: own, groups: ["TEAM.app"], caller: Fixture.app)?.locked == true)
            #expect(failure { try create(fx, [("a", "b")]) }?.status == .interactionNotAllowed)
        }
    }

    @Test func theRowStateCoversTheAttributeIndex() throws {
        try withKeychain { (fx) throws in
            let first = try create(fx, [("service", "s"), ("k", "v")])
            let second = try create(fx, [("service", "t"), ("k", "w")])
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
            func tampered(_ sql: String) throws -> KeychainError? {
                fx.service.close()
                let db = try SQLiteConnection(path: fx.databasePath, create: false)
                try db.execute(sql)
                db.close()
                let error = failure { try fx.reopen() }
                try fx.reopen(acceptCurrentRows: true)  // back to a consistent state for the next case
                return error
            }
            let hex = { (id: [UInt8]) in ItemService.hex(id) }
            // An entry removed (the item would vanish from searches), or moved to another item.
            #expect(
                try tampered(
                    "DELETE FROM item_attributes WHERE ref = x'\(hex(first))' AND ix IN (SELECT ix FROM item_attributes WHERE ref = x'\(hex(first))' LIMIT 1)"
                )?.status == .decode)
            #expect(
                try tampered(
                    "UPDATE item_attributes SET ref = x'\(hex(second))' WHERE ref = x'\(hex(first))' AND ix = (SELECT ix FROM item_attributes WHERE ref = x'\(hex(first))' AND ix NOT IN (SELECT ix FROM item_attributes WHERE ref = x'\(hex(second))') LIMIT 1)"
                )?.status == .decode)
            #expect(
                try tampered(
                    "INSERT INTO item_attributes (ix, ref) VALUES (x'00112233445566778899aabbccddeeff', x'\(hex(first))')"
                )?.status == .decode)
            try fx.reopen()
            #expect(!fx.service.rowCheck.resealed)
        }
    }

    @Test func aVersionOneDatabaseIsMigrated() throws {
        try withKeychain { (fx) throws in
            try fx.add("before", "migration", secret: "kept")
            fx.service.close()
            // What a keychaind from before the Secret Service left: schema 1, no attribute index, the
            // three item indexes of schemas 1 and 2.
            let db = try SQLiteConnection(path: fx.databasePath, create: false)
            try db.execute("DROP TABLE item_attributes")
            try db.execute("DROP INDEX items_by_group_service_account")
            try db.execute("CREATE INDEX items_by_service_account ON items(svce_ix, acct_ix)")
            try db.execute("CREATE INDEX items_by_account ON items(acct_ix)")
            try db.execute("CREATE INDEX items_by_group ON items(agrp_ix)")
            try db.execute("PRAGMA user_version = 1")
            db.close()
            try fx.reopen()
            #expect(try indexes(fx) == ["item_attributes_by_ref", "items_by_group_service_account"])
            #expect(!fx.service.rowCheck.resealed)
            #expect(try fx.secret("before", "migration") == "kept")
            #expect(try search(fx, [("service", "before"), ("account", "migration")]).unlocked.count == 1)
            let id = try create(fx, [("service", "after"), ("x", "y")])
            #expect(try search(fx, [("x", "y")]).unlocked == [id])
        }
    }

    @Test func backupsCarrySecretServiceAttributes() throws {
        try withKeychain { (fx) throws in
            let pairs = [("service", "b"), ("kind", "backup"), ("xdg:schema", "org.example.B")]
            _ = try create(fx, pairs, secret: "backed-up")
            let file = try fx.service.backup(passphrase: pass("backup-pw"))
            _ = try fx.service.secretServiceDeleteAll(group: "TEAM.app", caller: Fixture.app)
            #expect(try search(fx, [("kind", "backup")]).unlocked.isEmpty)
            _ = try fx.service.restore(passphrase: pass("backup-pw"), data: file)
            let found = try search(fx, [("kind", "backup")])
            #expect(found.unlocked.count == 1)
            #expect(try secret(fx, found.unlocked[0]) == "backed-up")
            #expect(
                try fx.service.secretServiceItem(id: found.unlocked[0], groups: ["TEAM.app"], caller: Fixture.app)?
                    .attributes == attrs(pairs))
        }
    }

    @Test func namesAndValuesAreComparedByteForByte() throws {
        try withKeychain { (fx) throws in
            let nfc = "caf\u{E9}"
            let nfd = "cafe\u{301}"  // equal to Swift, two strings to D-Bus
            let id = try create(fx, [(nfc, nfd), ("service", "bytes")])
            #expect(try search(fx, [(nfc, nfd)]).unlocked == [id])
            #expect(try search(fx, [(nfd, nfd)]).unlocked.isEmpty)
            #expect(try search(fx, [(nfc, nfc)]).unlocked.isEmpty)
        }
    }

    @Test func hugeAttributeMapsAreRefused() throws {
        try withKeychain { (fx) throws in
            let many = (0...SecretServiceAttributes.maxCount).map { ("k\($0)", "v") }
            #expect(failure { try create(fx, many) }?.status == .param)
            #expect(failure { try search(fx, many) }?.status == .param)
            let long = [("k", String(repeating: "x", count: SecretServiceAttributes.maxFieldBytes + 1))]
            #expect(failure { try create(fx, long) }?.status == .param)
            #expect(try fx.count() == 0)
        }
    }

    @Test func nothingStoredThroughTheBusIsPlaintextAtRest() throws {
        try withKeychain { (fx) throws in
            let marks = [
                "ssname-Tamarind-8812", "ssvalue-Cobalt-4471", "sslabel-Juniper-3309", "sssecret-Saffron-1926",
                "text/x-Ochre-5521",
            ]
            _ = try fx.service.secretServiceCreate(
                group: "TEAM.app", label: marks[2], attributes: attrs([(marks[0], marks[1])]),
                secret: SecretBytes(Array(marks[3].utf8)), contentType: marks[4], replace: false, caller: Fixture.app)
            for closed in [false, true] {
                if closed { fx.service.close() }
                for name in try FileManager.default.contentsOfDirectory(atPath: fx.directory) {
                    let data = try Data(contentsOf: URL(fileURLWithPath: fx.directory + "/" + name))
                    for mark in marks {
                        #expect(data.range(of: Data(mark.utf8)) == nil, "\(name) contains \(mark)")
                        #expect(
                            data.range(of: Data(String(mark.split(separator: "-")[1]).utf8)) == nil,
                            "\(name) contains part of \(mark)")
                    }
                }
            }
        }
    }
}

extension Result {
    var failureStatus: Status? {
        if case .failure(let e as KeychainError) = self { return e.status }
        return nil
    }
}

/// The names of the database's own indexes (SQLite's automatic ones left out), sorted.
func indexes(_ fx: Fixture) throws -> [String] {
    let db = try SQLiteConnection(path: fx.databasePath, create: false)
    defer { db.close() }
    return try db.withStatement(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex_%' ORDER BY name"
    ) { (s) throws(KeychainError) -> [String] in
        var names: [String] = []
        while try s.step() { names.append(s.text(0) ?? "") }
        return names
    }
}
