import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainSync

/// Two keychains of one user (two data directories) and a folder they share, in one process: the
/// folder is shared by reference here, Syncthing copies it between machines in the integration test.
final class TwoDevices {
    let temporary: TemporaryDirectory
    var folder: String { temporary.appending("folder") }
    var a: ItemService
    var b: ItemService
    var syncA: SyncEngine
    var syncB: SyncEngine
    static let app = Caller(accessGroups: ["TEAM.app"])

    init() throws {
        temporary = try TemporaryDirectory(prefix: "kc-sync")
        try FileSystem.makeDirectory(temporary.appending("folder"))
        a = try ItemService(directory: temporary.appending("a"))
        b = try ItemService(directory: temporary.appending("b"))
        syncA = try SyncEngine(
            service: a, folder: temporary.appending("folder"), stateDirectory: temporary.appending("a/sync"))
        syncB = try SyncEngine(
            service: b, folder: temporary.appending("folder"), stateDirectory: temporary.appending("b/sync"))
        try syncA.makeKey()
        try syncB.adopt(syncA.key!)
    }

    deinit {
        a.close()
        b.close()
    }

    func add(_ s: ItemService, _ svce: String, _ secret: String, _ extra: [String: Value] = ["sync": .bool(true)])
        throws
    {
        var q: [String: Value] = [
            "class": .text("genp"), "svce": .text(svce), "acct": .text("me"), "v_Data": .bytes(Array(secret.utf8)),
        ]
        for (k, v) in extra { q[k] = v }
        _ = try s.add(q, caller: Self.app)
    }

    func secret(_ s: ItemService, _ svce: String) throws -> String? {
        let q: [String: Value] = [
            "class": .text("genp"), "svce": .text(svce), "acct": .text("me"), "sync": .text("syna"),
            "r_Data": .bool(true),
        ]
        do {
            guard let v = try s.copyMatching(q, caller: Self.app)?.secretBytes else { return nil }
            return String(decoding: v.unprotectedArray, as: UTF8.self)
        } catch  where error.status == .itemNotFound { return nil }
    }

    func update(_ s: ItemService, _ svce: String, _ secret: String) throws {
        try s.update(
            ["class": .text("genp"), "svce": .text(svce), "acct": .text("me"), "sync": .bool(true)],
            attributes: ["v_Data": .bytes(Array(secret.utf8))], caller: Self.app)
    }

    func delete(_ s: ItemService, _ svce: String) throws {
        try s.delete(
            ["class": .text("genp"), "svce": .text(svce), "acct": .text("me"), "sync": .bool(true)], caller: Self.app)
    }
}

@Suite struct EngineTests {
    /// Added, updated and deleted on one keychain, the synchronizable items follow on the other;
    /// items not marked synchronizable, and ThisDeviceOnly ones, never leave.
    @Test func changesFollowAndLocalItemsStay() throws {
        let t = try TwoDevices()
        try t.add(t.a, "synced", "one")
        try t.add(t.a, "local", "stays", [:])
        try t.add(t.a, "ck item", "travels", ["sync": .bool(true), "pdmn": .text("ck")])
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "synced") == "one")
        #expect(try t.secret(t.b, "ck item") == "travels")
        #expect(try t.secret(t.b, "local") == nil)

        try t.update(t.b, "synced", "two")
        try t.syncB.cycle()
        try t.syncA.cycle()
        #expect(try t.secret(t.a, "synced") == "two")

        try t.delete(t.a, "synced")
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "synced") == nil)
        #expect(try t.secret(t.b, "ck item") == "travels")
        // Nothing more to do: a further cycle changes nothing and writes nothing.
        let quiet = try t.syncB.cycle()
        #expect(quiet.exported == 0 && quiet.imported == 0 && !quiet.wrote)
    }

    /// Both change the same item before either reads the other: after both cycle twice they hold the
    /// same version (the later stamp's), and the status counts the conflict.
    @Test func concurrentWritesEndTheSameOnBoth() throws {
        let t = try TwoDevices()
        try t.add(t.a, "shared", "base")
        try t.syncA.cycle()
        try t.syncB.cycle()
        try t.update(t.a, "shared", "from a")
        try t.update(t.b, "shared", "from b")
        try t.syncA.cycle()
        try t.syncB.cycle()
        try t.syncA.cycle()
        let onA = try t.secret(t.a, "shared")
        #expect(onA == (try t.secret(t.b, "shared")))
        #expect(onA == "from b")  // B's write has the later stamp: its cycle ran after A's file existed
        #expect(t.syncA.state.conflictsResolved + t.syncB.state.conflictsResolved >= 1)
    }

    /// A half-written or damaged file in the folder changes nothing and is reported; the good files
    /// are still read.
    @Test func damagedFilesAreReportedAndChangeNothing() throws {
        let t = try TwoDevices()
        try t.add(t.a, "good", "yes")
        try t.syncA.cycle()
        let fileA = t.folder + "/" + SyncFile.fileName(device: t.syncA.device)
        let bytes = FileSystem.contents(of: fileA)!
        let half = t.folder + "/" + SyncFile.fileName(device: [UInt8](repeating: 7, count: 16))
        try SyncFolder.writeAtomically(Array(bytes.prefix(bytes.count / 2)), to: half)
        // A FIFO would make a plain read wait for ever, a link to /dev/zero read without end.
        #expect(mkfifo(t.folder + "/fifo.kcsync", 0o600) == 0)
        try FileManager.default.createSymbolicLink(atPath: t.folder + "/zero.kcsync", withDestinationPath: "/dev/zero")
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "good") == "yes")
        #expect(
            Set(t.syncB.problems.map(\.name))
                == [SyncFile.fileName(device: [UInt8](repeating: 7, count: 16)), "fifo.kcsync", "zero.kcsync"])
        #expect(t.syncB.status["problems"]?.array?.count == 3)
    }

    /// After a rotation the device left out reads nothing written under the new key and says a newer
    /// key exists; paired again (given the new key) it writes its file under it and both converge.
    @Test func aRotationLeavesOutTheDevicesNotPairedAgain() throws {
        let t = try TwoDevices()
        try t.add(t.a, "before", "both see it")
        try t.syncA.cycle()
        try t.syncB.cycle()
        try t.syncA.makeKey()
        // Nothing changed but the key: the file is written again under it all the same.
        let rotated = try t.syncA.cycle()
        #expect(rotated.exported == 0 && rotated.wrote)  // identities do not change with the key
        let fileA = t.folder + "/" + SyncFile.fileName(device: t.syncA.device)
        #expect(try SyncFile.header(of: FileSystem.contents(of: fileA)!).epoch == 2)
        try t.add(t.a, "after", "only paired devices")
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "after") == nil)
        #expect(t.syncB.newerKeyEpoch == 2)
        #expect(t.syncB.status["newerKeyEpoch"]?.int == 2)
        try t.syncB.adopt(t.syncA.key!)
        try t.update(t.b, "before", "changed after pairing again")
        try t.syncB.cycle()
        try t.syncA.cycle()
        #expect(try t.secret(t.b, "after") == "only paired devices")
        #expect(try t.secret(t.a, "before") == "changed after pairing again")
        let header = try SyncFile.header(
            of: FileSystem.contents(of: t.folder + "/" + SyncFile.fileName(device: t.syncB.device))!)
        #expect(header.epoch == 2)
    }

    /// A device whose data directory is put back from an older copy catches up from the folder and
    /// does not roll the others back.
    @Test func aDeviceRestoredFromAnOlderCopyCatchesUp() throws {
        let t = try TwoDevices()
        try t.add(t.b, "item", "v1")
        try t.syncB.cycle()
        try t.syncA.cycle()
        // Copy of A's data directory now.
        t.a.close()
        let saved = t.temporary.appending("a-saved")
        try copyDirectory(t.temporary.appending("a"), to: saved)
        t.a = try ItemService(directory: t.temporary.appending("a"))
        t.syncA = try SyncEngine(service: t.a, folder: t.folder, stateDirectory: t.temporary.appending("a/sync"))
        try t.update(t.a, "item", "v2")
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "item") == "v2")
        // A is put back to the saved copy (item at v1) and restarts.
        t.a.close()
        try removeDirectory(t.temporary.appending("a"))
        try copyDirectory(saved, to: t.temporary.appending("a"))
        t.a = try ItemService(directory: t.temporary.appending("a"))
        t.syncA = try SyncEngine(service: t.a, folder: t.folder, stateDirectory: t.temporary.appending("a/sync"))
        #expect(try t.secret(t.a, "item") == "v1")
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.a, "item") == "v2")
        #expect(try t.secret(t.b, "item") == "v2")
    }
}

func copyDirectory(_ from: String, to: String) throws {
    try FileManager.default.copyItem(atPath: from, toPath: to)
}

func removeDirectory(_ path: String) throws {
    try FileManager.default.removeItem(atPath: path)
}
