import Foundation
import KeychainCore
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import Testing

@testable import KeychainCrypto
@testable import KeychainItems

@Suite struct BackupTests {
    static let marker = "Quagmire"

    /// A keychain with one item per class (service `svc-<marker>-<code>`, secret `secret-<marker>-<code>`).
    func populated(_ fx: ProtectedFixture) throws {
        try fx.service.changePassphrase(old: nil, new: pass("kc"))
        for code in allCodes {
            _ = try fx.service.add(
                item(
                    "svc-\(Self.marker)-\(code)", "acct", secret: "secret-\(Self.marker)-\(code)",
                    [
                        "pdmn": .text(code), "labl": .text("label-\(Self.marker)"), "gena": .bytes([1, 2, 3]),
                        "crtr": .int(42),
                    ]),
                caller: Fixture.app)
        }
    }

    @Test func theFileHoldsEveryItemButThisDeviceOnlyOnesAndNoPlaintext() throws {
        try withProtectedKeychain { fx in
            try populated(fx)
            let file = try fx.service.backup(passphrase: pass("bk"))
            let data = Data(file)
            for needle in [Self.marker, "secret-", "label-", "TEAM.app"] {
                #expect(data.range(of: Data(needle.utf8)) == nil, "\(needle)")
            }
            let contents = try BackupFile.open(file, passphrase: pass("bk"))
            let codes = Set(contents.items.compactMap { $0.attributes["pdmn"]?.text })
            #expect(codes == ["ak", "ck", "dk"])
            #expect(contents.metadata["items"]?.int == 3)
            #expect(contents.parameters.opsLimit == KDFProfile.interactive.opsLimit)
            for item in contents.items {
                let code = item.attributes["pdmn"]!.text!
                #expect(item.secret.unprotectedArray == Array("secret-\(Self.marker)-\(code)".utf8))
                #expect(item.attributes["crtr"] == .int(42) && item.attributes["gena"] == .bytes([1, 2, 3]))
                if case .date? = item.attributes["cdat"] {} else { Issue.record("cdat missing") }
            }
        }
    }

    @Test func theHeaderCarriesVersionKDFParametersAndSalt() throws {
        try withProtectedKeychain { fx in
            try populated(fx)
            let file = try fx.service.backup(passphrase: pass("bk"))
            #expect(Array(file[0..<8]) == Array("KCBACKUP".utf8))
            #expect(file[8] == 1 && file[9] == 2)
            let p = try BackupFile.parameters(of: file)
            #expect(p.opsLimit == 2 && p.memLimit == 64 << 20 && p.salt.count == 16)
            #expect(Array(file[22..<38]) == p.salt)
            // Two backups never share salt or stream header.
            let other = try fx.service.backup(passphrase: pass("bk"))
            #expect(Array(other[22..<BackupFile.headerBytes]) != Array(file[22..<BackupFile.headerBytes]))
        }
    }

    func openStatus(_ bytes: [UInt8], _ passphrase: String = "bk") -> Status? {
        failure { try BackupFile.open(bytes, passphrase: pass(passphrase)) }?.status
    }

    @Test func wrongPassphraseTamperingTruncationAndTrailingBytesAreRefused() throws {
        let fx = try ProtectedFixture()
        defer { fx.cleanup() }
        try populated(fx)
        let file = try fx.service.backup(passphrase: pass("bk"))
        #expect(openStatus(file, "bK") == .authFailed)
        // Every flipped byte is caught: in the header (it is the first record's associated data), in
        // a length, or in a ciphertext.
        for offset in stride(from: 0, to: file.count, by: max(1, file.count / 40)) {
            var bad = file
            bad[offset] ^= 0x20
            let status = openStatus(bad)
            #expect(status == .decode || status == .authFailed, "flip at \(offset): \(String(describing: status))")
        }
        #expect(openStatus(Array(file.dropLast(1))) == .decode)
        #expect(openStatus(file + [0]) == .decode)
        // Dropping the final record (a truncation at a record boundary) is caught too.
        let last = lastRecordOffset(file)
        #expect(last != nil)
        #expect(openStatus(Array(file[..<(last ?? 0)])) == .decode)
        // A forged header asking for 8 GiB of Argon2id memory is refused before any derivation.
        var greedy = file
        greedy.replaceSubrange(14..<22, with: BackupFile.bigEndian(8 << 30, bytes: 8))
        #expect(openStatus(greedy) == .decode)
        #expect(openStatus(Array("not a backup".utf8)) == .decode)
    }

    /// Offset of the final record's length field.
    func lastRecordOffset(_ file: [UInt8]) -> Int? {
        var offset = BackupFile.headerBytes
        var last: Int?
        while offset + 4 <= file.count {
            last = offset
            offset += 4 + Int(BackupFile.readBigEndian(file, at: offset, bytes: 4))
        }
        return offset == file.count ? last : nil
    }

    @Test func restoreOnAnotherDeviceKeepsAttributesDatesAndReferencesAndSkipsExistingItems() throws {
        let source = try ProtectedFixture()
        defer { source.cleanup() }
        let target = try ProtectedFixture()
        defer { target.cleanup() }
        try populated(source)
        let file = try source.service.backup(passphrase: pass("bk"))
        let all: [String: Value] = [
            "class": .text("genp"), "m_Limit": .text("m_LimitAll"), "r_Attributes": .bool(true),
            "r_PersistentRef": .bool(true),
        ]
        let before = (try source.service.copyMatching(all, caller: Fixture.app)?.array ?? []).compactMap(\.map)
        #expect(before.count == 7)
        _ = try target.service.add(
            item("svc-\(Self.marker)-dk", "acct", secret: "mine", ["pdmn": .text("dk")]), caller: Fixture.app)
        let result = try target.service.restore(passphrase: pass("bk"), data: file)
        #expect(result.restored == 2 && result.skipped == 1)
        #expect(try target.secret("svc-\(Self.marker)-dk", "acct") == "mine")
        #expect(try target.secret("svc-\(Self.marker)-ak", "acct") == "secret-\(Self.marker)-ak")
        let after = (try target.service.copyMatching(all, caller: Fixture.app)?.array ?? []).compactMap(\.map)
        #expect(after.count == 3)
        for restored in after where restored["svce"] != .text("svc-\(Self.marker)-dk") {
            let original = before.first { $0["svce"] == restored["svce"] }
            #expect(original != nil && restored == original!, "attributes, dates and persistent reference survive")
        }
        // A locked target refuses.
        try target.service.changePassphrase(old: nil, new: pass("t"))
        try target.service.lock()
        #expect(
            failure { try target.service.restore(passphrase: pass("bk"), data: file) }?.status == .interactionNotAllowed
        )
    }

    @Test func restoreRejectsItemsThatDoNotLookLikeStoredOnes() {
        let good: [String: Value] = [
            "svce": .text("s"), "acct": .text("a"), "agrp": .text("g"), "pdmn": .text("ak"),
            "sync": .bool(false), "cdat": .date(1), "mdat": .date(2),
        ]
        #expect((try? ItemService.validatedBackupAttributes(good, index: 0)) != nil)
        for (key, value) in [
            ("pdmn", Value.text("aku")), ("pdmn", .text("akpu")), ("agrp", .text("")), ("cdat", .int(1)),
            ("zzzz", .text("x")), ("crtr", .int(-1)), ("sync", .int(1)),
        ] {
            var bad = good
            bad[key] = value
            #expect(failure { try ItemService.validatedBackupAttributes(bad, index: 0) }?.status == .decode, "\(key)")
        }
        var missing = good
        missing["mdat"] = nil
        #expect(failure { try ItemService.validatedBackupAttributes(missing, index: 0) }?.status == .decode)
    }
}
