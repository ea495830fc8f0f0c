import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// Whole-file tampering with a stopped daemon's data directory, then the real daemon on it: flipped
/// bytes, a truncated or emptied database, rows swapped or replayed from an older copy, a deleted or
/// wrong key file. Each must give a clear error (errSecDecode on the item, or a refusal to start that
/// says why) — never another item's secret and never a silent reset to an empty keychain.
/// (Row-level cases on the store alone are in KeychainItemsTests/ProtectionAtRestTests.swift.)
final class TamperTests: XCTestCase {
    static let service = "com.example.tamper"
    static let sqlite = "/usr/bin/sqlite3"

    func secret(_ i: Int) -> [UInt8] { Array("secret-\(i)-".utf8) + Array(repeating: UInt8(i & 0xFF), count: 40) }

    /// A daemon holding `count` items (accounts a0…), stopped cleanly so the WAL is checkpointed.
    func stoppedKeychain(count: Int = 60) throws -> DaemonHarness {
        let d = try DaemonHarness()
        let c = try d.connect()
        for i in 0..<count {
            let r = try c.call(
                "add",
                query: [
                    "class": .text("genp"), "svce": .text(Self.service), "acct": .text("a\(i)"),
                    "v_Data": .bytes(secret(i)),
                ])
            XCTAssertEqual(r.status, .success, r.message ?? "")
        }
        XCTAssertEqual(d.stop(), 0)
        return d
    }

    var dbName: String { "keychain.db" }
    func db(_ d: DaemonHarness) -> String { d.dataDirectory + "/keychain.db" }

    /// Starts the daemon; nil (and the daemon's reason in `reason`) when it refuses to start.
    func startOrReason(_ d: DaemonHarness) -> (started: Bool, reason: String) {
        do {
            try d.start()
            return (true, "")
        } catch { return (false, d.log) }
    }

    /// Every item's outcome: its own secret, or a clear error. Never another item's secret, never a
    /// successful empty answer where items were.
    func checkNoWrongSecrets(_ d: DaemonHarness, count: Int, file: StaticString = #filePath, line: UInt = #line) throws
        -> [Status: Int]
    {
        let c = try d.connect()
        var outcomes: [Status: Int] = [:]
        for i in 0..<count {
            let r = try c.call(
                "copy",
                query: [
                    "class": .text("genp"), "svce": .text(Self.service), "acct": .text("a\(i)"),
                    "r_Data": .bool(true),
                ])
            outcomes[r.status, default: 0] += 1
            if r.status == .success {
                XCTAssertEqual(
                    r.result, .bytes(secret(i)), "item a\(i) returned a secret that is not its own", file: file,
                    line: line)
            } else {
                XCTAssertNotNil(r.message, file: file, line: line)
                XCTAssertTrue(
                    [.decode, .notAvailable, .itemNotFound, .io].contains(r.status),
                    "a\(i): unexpected \(r.status) \(r.message ?? "")", file: file, line: line)
            }
        }
        // A listing either fails clearly or returns items paired with their own secrets.
        let all = try c.call(
            "copy",
            query: [
                "class": .text("genp"), "svce": .text(Self.service), "m_Limit": .text("m_LimitAll"),
                "r_Attributes": .bool(true), "r_Data": .bool(true),
            ])
        if all.status == .success {
            for entry in all.result?.array ?? [] {
                guard case .text(let acct)? = entry.map?["acct"], let i = Int(acct.dropFirst()) else { continue }
                XCTAssertEqual(
                    entry.map?["v_Data"], .bytes(secret(i)), "listing paired \(acct) with another secret", file: file,
                    line: line)
            }
        } else {
            XCTAssertNotNil(all.message, file: file, line: line)
        }
        return outcomes
    }

    func sql(_ d: DaemonHarness, _ statement: String, database: String? = nil) throws -> String {
        guard FileManager.default.isExecutableFile(atPath: Self.sqlite) else {
            struct Missing: Error, CustomStringConvertible {
                let description = "sqlite3 CLI missing (scripts/deps installs it)"
            }
            throw Missing()
        }
        let out = try d.run(Self.sqlite, [database ?? db(d), statement])
        XCTAssertEqual(out.status, 0, out.stderr)
        return out.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    // MARK: Key file

    func testADeletedKeyFileRefusesToStartSayingWhyAndRestoringItBringsEverythingBack() throws {
        let d = try stoppedKeychain(count: 5)
        let key = d.dataDirectory + "/device.key"
        try FileManager.default.moveItem(atPath: key, toPath: d.root + "/device.key.saved")
        let (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "started without its key file: a silent reset")
        XCTAssertTrue(reason.contains("device key file") && reason.contains("missing"), reason)
        XCTAssertFalse(FileManager.default.fileExists(atPath: key), "a new key file was created")
        try FileManager.default.moveItem(atPath: d.root + "/device.key.saved", toPath: key)
        try d.start()
        XCTAssertEqual(try checkNoWrongSecrets(d, count: 5), [.success: 5])
    }

    func testAWrongOrTruncatedKeyFileRefusesToStartSayingWhy() throws {
        let d = try stoppedKeychain(count: 5)
        let key = d.dataDirectory + "/device.key"
        let original = try Data(contentsOf: URL(fileURLWithPath: key))
        for bad in [Data((0..<32).map { _ in UInt8.random(in: 0...255) }), original.prefix(16), Data()] {
            try bad.write(to: URL(fileURLWithPath: key))
            let (started, reason) = startOrReason(d)
            if started {
                // Only acceptable if nothing is served from a different key: every item errors clearly.
                let outcomes = try checkNoWrongSecrets(d, count: 5)
                XCTAssertNil(outcomes[.success], "items readable with a wrong key file")
                d.stop()
                XCTFail("started with a \(bad.count)-byte wrong key file; items: \(outcomes)")
            } else {
                XCTAssertTrue(reason.contains("cannot start"), reason)
            }
        }
        try original.write(to: URL(fileURLWithPath: key))
        try d.start()
        XCTAssertEqual(try checkNoWrongSecrets(d, count: 5), [.success: 5])
    }

    // MARK: Database file

    func testAnEmptiedOrDeletedDatabaseBesideItsKeyIsRefusedNotAFreshKeychain() throws {
        let d = try stoppedKeychain(count: 3)
        let original = try Data(contentsOf: URL(fileURLWithPath: db(d)))
        XCTAssertEqual(truncate(db(d), 0), 0)
        var (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "an emptied database came up as an empty keychain")
        XCTAssertTrue(reason.contains("is empty") && reason.contains("Refusing"), reason)
        try FileManager.default.removeItem(atPath: db(d))
        (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "a deleted database came up as an empty keychain")
        XCTAssertTrue(reason.contains("is missing"), reason)
        try original.write(to: URL(fileURLWithPath: db(d)))
        try d.start()
        XCTAssertEqual(try checkNoWrongSecrets(d, count: 3), [.success: 3])
    }

    func testATruncatedDatabaseIsRefusedOrErrSecDecodeNeverEmptyNeverWrong() throws {
        let d = try stoppedKeychain(count: 60)
        let original = try Data(contentsOf: URL(fileURLWithPath: db(d)))
        let size = original.count
        var seen: [String] = []
        for cut in [100, 4096, size / 2, size - 4096, size - 1000, size - 100] {
            try original.write(to: URL(fileURLWithPath: db(d)))
            XCTAssertEqual(truncate(db(d), off_t(cut)), 0)
            let (started, reason) = startOrReason(d)
            if !started {
                XCTAssertTrue(reason.contains("damaged") || reason.contains("malformed"), "cut \(cut): \(reason)")
                seen.append("\(cut): refused")
                continue
            }
            let outcomes = try checkNoWrongSecrets(d, count: 60)
            XCTAssertNotEqual(outcomes[.itemNotFound], 60, "cut \(cut): every item silently gone")
            seen.append("\(cut): served \(outcomes)")
            d.stop()
        }
        print("truncation outcomes: \(seen)")
    }

    func testFlippedBytesAnywhereNeverRevealAnotherItemsSecret() throws {
        let d = try stoppedKeychain(count: 60)
        let original = try Data(contentsOf: URL(fileURLWithPath: db(d)))
        var generator = SystemRandomNumberGenerator()
        var refused = 0
        var served = 0
        var decode = 0
        for round in 0..<12 {
            var bytes = [UInt8](original)
            // Several flips per round: in the header page, in the middle, near the end.
            let offsets =
                round == 0 ? [100] : (0..<4).map { _ in Int.random(in: 4096..<bytes.count, using: &generator) }
            for o in offsets { bytes[o] ^= UInt8.random(in: 1...255, using: &generator) }
            try Data(bytes).write(to: URL(fileURLWithPath: db(d)))
            let (started, reason) = startOrReason(d)
            if !started {
                XCTAssertTrue(reason.contains("cannot start"), reason)
                refused += 1
                continue
            }
            served += 1
            let outcomes = try checkNoWrongSecrets(d, count: 60)
            decode += outcomes[.decode] ?? 0
            d.stop()
        }
        print("flipped bytes: refused \(refused), served \(served), item errSecDecode \(decode)")
    }

    // MARK: Rows

    /// `keychaind --accept-database` with the harness's paths: trusts the rows as they are and exits.
    func acceptDatabase(_ d: DaemonHarness) throws -> String {
        let out = try d.run(DaemonHarness.daemonPath, d.arguments + ["--accept-database"])
        XCTAssertEqual(out.status, 0, out.stderr)
        return out.stdout
    }

    func testRowsSwappedBetweenItemsRefuseToStartAndOnceAcceptedAreErrSecDecode() throws {
        let d = try stoppedKeychain(count: 4)
        // Swap everything sealed between rows 1 and 2 (keeping each row's ref and digests).
        _ = try sql(
            d,
            """
            CREATE TEMP TABLE t AS SELECT rowid AS r, item_key, attributes, secret FROM items WHERE rowid IN (1, 2);
            UPDATE items SET item_key = (SELECT item_key FROM t WHERE r = 3 - items.rowid),
                             attributes = (SELECT attributes FROM t WHERE r = 3 - items.rowid),
                             secret = (SELECT secret FROM t WHERE r = 3 - items.rowid) WHERE rowid IN (1, 2);
            """)
        let (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "started over swapped rows")
        XCTAssertTrue(
            reason.contains("cannot start") && reason.contains("swapped") && reason.contains("--accept-database"),
            reason)
        // The user accepts the file anyway: the swapped items are errSecDecode, never each other's secret.
        XCTAssertTrue(try acceptDatabase(d).contains("as it is now (4 items)"))
        try d.start()
        XCTAssertEqual(try checkNoWrongSecrets(d, count: 4), [.decode: 2, .success: 2])
    }

    /// Copy the database, change an item, then put back (1) only its old secret column, (2) its whole
    /// old row and a deleted item's row. AEAD alone cannot tell an item's older self from its current
    /// one; the row-state record can: the daemon refuses to start, saying why and how to accept.
    func testARowReplayedFromAnOlderCopyRefusesToStartSayingWhy() throws {
        let d = try stoppedKeychain(count: 4)
        let old = d.root + "/old.db"
        try FileManager.default.copyItem(atPath: db(d), toPath: old)
        try d.start()
        let c = try d.connect()
        let newSecret: [UInt8] = Array("changed-after-the-copy".utf8)
        XCTAssertEqual(
            try c.call(
                "update", query: ["class": .text("genp"), "svce": .text(Self.service), "acct": .text("a0")],
                attributes: ["v_Data": .bytes(newSecret), "labl": .text("new label")]
            ).status, .success)
        XCTAssertEqual(
            try c.call("delete", query: ["class": .text("genp"), "svce": .text(Self.service), "acct": .text("a1")])
                .status, .success)
        XCTAssertEqual(d.stop(), 0)
        let current = try Data(contentsOf: URL(fileURLWithPath: db(d)))

        // 1. Only the old secret column put back into the updated row.
        _ = try sql(
            d,
            "ATTACH '\(old)' AS old; UPDATE items SET secret = (SELECT secret FROM old.items WHERE old.items.rowid = 1) WHERE rowid = 1;"
        )
        var (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "started with an item's secret replayed from an older copy")
        XCTAssertTrue(
            reason.contains("not the versions of its items or settings keychaind last wrote")
                && reason.contains("older copy"), reason)

        // 2. The whole old row of a0 back, and the deleted a1 resurrected from the copy.
        try current.write(to: URL(fileURLWithPath: db(d)))
        _ = try sql(
            d,
            """
            ATTACH '\(old)' AS old;
            DELETE FROM items WHERE rowid = 1;
            INSERT INTO items SELECT * FROM old.items WHERE rowid IN (1, 2);
            """)
        (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "started with rows replayed from an older copy")
        XCTAssertTrue(reason.contains("holds 4 items where keychaind last recorded 3"), reason)
        XCTAssertEqual(try sql(d, "PRAGMA integrity_check;"), "ok")

        // Putting the current file back is all it takes: nothing was changed by the refusals.
        try current.write(to: URL(fileURLWithPath: db(d)))
        try d.start()
        let c2 = try d.connect()
        for (i, expected) in [(0, Value.bytes(newSecret)), (1, nil), (2, .bytes(secret(2))), (3, .bytes(secret(3)))] {
            let r = try c2.call(
                "copy",
                query: [
                    "class": .text("genp"), "svce": .text(Self.service), "acct": .text("a\(i)"), "r_Data": .bool(true),
                ])
            XCTAssertEqual(r.status, expected == nil ? .itemNotFound : .success, "a\(i)")
            XCTAssertEqual(r.result, expected, "a\(i)")
        }
    }

    func testAWholeOlderCopyOfTheDatabaseRefusesToStartUntilAccepted() throws {
        let d = try stoppedKeychain(count: 3)
        let old = try Data(contentsOf: URL(fileURLWithPath: db(d)))
        try d.start()
        XCTAssertEqual(
            try d.connect().call(
                "delete", query: ["class": .text("genp"), "svce": .text(Self.service), "acct": .text("a2")]
            ).status, .success)
        XCTAssertEqual(d.stop(), 0)
        try old.write(to: URL(fileURLWithPath: db(d)))
        let (started, reason) = startOrReason(d)
        XCTAssertFalse(started, "started on an older copy of the whole database")
        XCTAssertTrue(
            reason.contains("cannot start") && reason.contains("is an older copy")
                && reason.contains("--accept-database"), reason)
        XCTAssertTrue(try acceptDatabase(d).contains("as it is now (3 items)"))
        try d.start()
        // The deleted a2 is back, by the user's choice.
        XCTAssertEqual(try checkNoWrongSecrets(d, count: 3), [.success: 3])
    }

    func testAcceptDatabaseRefusesWhileTheDaemonRunsAndSaysWhenThereIsNothingToAccept() throws {
        let d = try stoppedKeychain(count: 2)
        try d.start()
        let busy = try d.run(DaemonHarness.daemonPath, d.arguments + ["--accept-database"])
        XCTAssertEqual(busy.status, 1)
        XCTAssertTrue(busy.stderr.contains("stop it first"), busy.stderr)
        XCTAssertEqual(d.stop(), 0)
        XCTAssertTrue(try acceptDatabase(d).contains("already matches"))
        // A mistyped --data-dir does not create a keychain to "accept".
        let elsewhere = d.root + "/no-such-data"
        let missing = try d.run(
            DaemonHarness.daemonPath, ["--data-dir", elsewhere, "--config", d.configFile, "--accept-database"])
        XCTAssertEqual(missing.status, 1)
        XCTAssertTrue(missing.stderr.contains("nothing to accept"), missing.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: elsewhere + "/device.key"))
    }
}
