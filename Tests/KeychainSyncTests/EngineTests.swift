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
        try Self.pair(syncB, with: syncA)
    }

    /// What pairing does (the code's part aside): `existing` records the new device's signing key,
    /// the new device takes the sync key and the recorded signing keys.
    static func pair(_ new: SyncEngine, with existing: SyncEngine) throws {
        try existing.admit(device: new.device, publicKey: new.signingPublicKey())
        try new.adopt(existing.key!, devices: existing.state.keys)
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
        try TwoDevices.pair(t.syncB, with: t.syncA)
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

    /// A device put back from an older copy deletes an item: its tombstone is carried from the file it
    /// writes next, newer than the files it wrote before the copy was put back. So a device that read
    /// those newer files, then went offline with the item, still holds the tombstone back: the item
    /// does not come back when it returns.
    @Test func aTombstoneOfARestoredDeviceWaitsForEveryDevice() throws {
        let t = try TwoDevices()
        let c = try ItemService(directory: t.temporary.appending("c"))
        let syncC = try SyncEngine(service: c, folder: t.folder, stateDirectory: t.temporary.appending("c/sync"))
        try TwoDevices.pair(syncC, with: t.syncA)
        try t.add(t.b, "item", "v1")
        for e in [t.syncB, t.syncA, syncC, t.syncB] { try e.cycle() }
        t.a.close()
        let saved = t.temporary.appending("a-saved")
        try copyDirectory(t.temporary.appending("a"), to: saved)
        t.a = try ItemService(directory: t.temporary.appending("a"))
        t.syncA = try SyncEngine(service: t.a, folder: t.folder, stateDirectory: t.temporary.appending("a/sync"))
        try t.add(t.a, "other", "newer file of A")
        for e in [t.syncA, syncC, t.syncB] { try e.cycle() }
        #expect(try t.secret(c, "other") == "newer file of A")
        // C goes offline. A is put back to the saved copy and deletes the item.
        t.a.close()
        try removeDirectory(t.temporary.appending("a"))
        try copyDirectory(saved, to: t.temporary.appending("a"))
        t.a = try ItemService(directory: t.temporary.appending("a"))
        t.syncA = try SyncEngine(service: t.a, folder: t.folder, stateDirectory: t.temporary.appending("a/sync"))
        try t.delete(t.a, "item")
        for e in [t.syncA, t.syncB, t.syncA, t.syncB] { try e.cycle() }
        #expect(try t.secret(t.b, "item") == nil)
        #expect(t.syncB.state.entries.values.contains { $0.deleted }, "B dropped the tombstone C has not seen")
        // C returns, then changes something else; everyone reads everyone.
        try syncC.cycle()
        try t.add(c, "from c", "later")
        for e in [syncC, t.syncA, t.syncB, syncC, t.syncA, t.syncB] { try e.cycle() }
        for s in [t.a, t.b, c] { #expect(try t.secret(s, "item") == nil) }
        #expect(try t.secret(t.a, "from c") == "later")
        c.close()
    }

    /// A device left out of a rotation while offline, holding an item the others then deleted (and,
    /// being the only paired devices, dropped the tombstone of), pairs again: its old version does
    /// not come back — not on the others when its file arrives before it has read theirs, and not on
    /// it once it has.
    @Test func aDevicePairedAgainAfterARotationDoesNotBringBackWhatWasDeleted() throws {
        let t = try TwoDevices()
        let c = try ItemService(directory: t.temporary.appending("c"))
        let syncC = try SyncEngine(service: c, folder: t.folder, stateDirectory: t.temporary.appending("c/sync"))
        try TwoDevices.pair(syncC, with: t.syncA)
        try t.add(t.b, "item", "v1")
        try t.add(t.b, "kept", "stays")
        for e in [t.syncB, t.syncA, syncC, t.syncB] { try e.cycle() }
        #expect(try t.secret(c, "item") == "v1")
        // C is offline. A rotates the key and pairs B again; A deletes the item; A and B drop the tombstone.
        try t.syncA.makeKey()
        try TwoDevices.pair(t.syncB, with: t.syncA)
        try t.delete(t.a, "item")
        for e in [t.syncA, t.syncB, t.syncA, t.syncB] { try e.cycle() }
        #expect(try t.secret(t.b, "item") == nil)
        #expect(t.syncA.state.entries.values.allSatisfy { !$0.deleted } && t.syncA.tombstonesCollected > 0)
        // C pairs again and writes its file before A's and B's have reached it.
        try TwoDevices.pair(syncC, with: t.syncA)
        let away = t.temporary.appending("away")
        try FileSystem.makeDirectory(away)
        let others = [SyncFile.fileName(device: t.syncA.device), SyncFile.fileName(device: t.syncB.device)]
        for name in others { try FileSystem.rename(t.folder + "/" + name, to: away + "/" + name) }
        try syncC.cycle()
        for name in others { try FileSystem.rename(away + "/" + name, to: t.folder + "/" + name) }
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.a, "item") == nil)
        #expect(try t.secret(t.b, "item") == nil)
        try syncC.cycle()
        #expect(try t.secret(c, "item") == nil)
        #expect(try t.secret(c, "kept") == "stays")
        for e in [t.syncA, t.syncB, syncC] { try e.cycle() }
        for s in [t.a, t.b, c] { #expect(try t.secret(s, "item") == nil) }
        c.close()
    }
}

func copyDirectory(_ from: String, to: String) throws {
    try FileManager.default.copyItem(atPath: from, toPath: to)
}

func removeDirectory(_ path: String) throws {
    try FileManager.default.removeItem(atPath: path)
}

/// Internet passwords are one item per their class's uniqueness key (server, account, protocol,
/// authentication type, port, path, security domain, group): two that differ only by port or path
/// stay two items on the other device, and an update or a delete of one follows to that one alone.
@Suite struct InternetPasswordSyncTests {
    func inet(_ port: Int64, _ path: String) -> [String: Value] {
        [
            "class": .text("inet"), "srvr": .text("mail.example.com"), "acct": .text("me"), "ptcl": .text("imap"),
            "port": .int(port), "path": .text(path), "sync": .bool(true),
        ]
    }

    func secret(_ s: ItemService, _ port: Int64, _ path: String) throws -> String? {
        let q = inet(port, path).merging(["r_Data": .bool(true)]) { $1 }
        let found: Value?
        do throws(KeychainError) { found = try s.copyMatching(q, caller: TwoDevices.app) } catch {
            if error.status == .itemNotFound { return nil }
            throw error
        }
        guard let v = found?.secretBytes else { return nil }
        return String(decoding: v.unprotectedArray, as: UTF8.self)
    }

    func add(_ s: ItemService, _ port: Int64, _ path: String, _ value: String) throws {
        var q = inet(port, path)
        q["v_Data"] = .bytes(Array(value.utf8))
        _ = try s.add(q, caller: TwoDevices.app)
    }

    @Test func itemsDifferingByPortOrPathStayTwoItems() throws {
        let t = try TwoDevices()
        let ports: [Int64] = [993, 143, 993]
        let paths = ["/", "/", "/archive"]
        let values = ["tls port", "plain port", "other path"]
        for i in 0..<3 { try add(t.a, ports[i], paths[i], values[i]) }
        try t.syncA.cycle()
        try t.syncB.cycle()
        for i in 0..<3 {
            let got = try secret(t.b, ports[i], paths[i])
            #expect(got == values[i])
        }
        #expect(t.syncB.state.liveEntries.count == 3)

        try t.b.update(inet(143, "/"), attributes: ["v_Data": .bytes(Array("changed".utf8))], caller: TwoDevices.app)
        try t.syncB.cycle()
        try t.syncA.cycle()
        #expect(try secret(t.a, 143, "/") == "changed")
        #expect(try secret(t.a, 993, "/") == "tls port")
        #expect(try secret(t.a, 993, "/archive") == "other path")

        try t.a.delete(inet(993, "/archive"), caller: TwoDevices.app)
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try secret(t.b, 993, "/archive") == nil)
        #expect(try secret(t.b, 993, "/") == "tls port")
        #expect(try secret(t.b, 143, "/") == "changed")
    }
}

/// Each device signs its file; the others read it only when it is signed by the key recorded for the
/// device it names (recorded at pairing, or from the signed file of a device that paired it).
@Suite struct DeviceSignatureTests {
    /// A holder of the sync key (here: a third device, paired) writes a file claiming to be B, with a
    /// change of B's item: A changes nothing and reports the file. The same change under the third
    /// device's own name is read.
    @Test func aFileClaimingAnotherDeviceChangesNothing() throws {
        let t = try TwoDevices()
        try t.add(t.a, "shared", "base")
        try t.syncA.cycle()
        try t.syncB.cycle()
        let m = try ItemService(directory: t.temporary.appending("m"))
        let syncM = try SyncEngine(service: m, folder: t.folder, stateDirectory: t.temporary.appending("m/sync"))
        try TwoDevices.pair(syncM, with: t.syncA)
        try syncM.cycle()
        #expect(try t.secret(m, "shared") == "base")
        try t.update(m, "shared", "forged")
        try syncM.cycle()
        // M's file, relabelled as B's: the header names B, signed again with a key of M's choosing.
        let fileM = FileSystem.contents(of: t.folder + "/" + SyncFile.fileName(device: syncM.device))!
        let (_, stateM) = try SyncFile.open(fileM, key: t.syncA.key!)
        let (_, otherKey) = try Signature.keyPair()
        let forged = SyncFile.seal(
            stateM, header: .init(epoch: t.syncA.key!.epoch, device: t.syncB.device, sequence: UInt64.max / 2),
            key: t.syncA.key!, signingKey: otherKey)
        FileSystem.removeIfPresent(t.folder + "/" + SyncFile.fileName(device: syncM.device))
        try SyncFolder.writeAtomically(forged, to: t.folder + "/" + SyncFile.fileName(device: t.syncB.device))
        try t.syncA.cycle()
        #expect(try t.secret(t.a, "shared") == "base")
        let nameB = SyncFile.fileName(device: t.syncB.device)
        let reported = t.syncA.problems.filter { $0.name == nameB && $0.reason.contains("not signed by the key") }
        #expect(reported.count == 1)
        // Under its own name M's change is read: M is paired.
        try SyncFolder.writeAtomically(fileM, to: t.folder + "/" + SyncFile.fileName(device: syncM.device))
        try t.syncA.cycle()
        #expect(try t.secret(t.a, "shared") == "forged")
        m.close()
    }

    /// A file under a newer key epoch that the device it names did not sign does not make a device
    /// believe it was left out of a rotation; one its device signed does.
    @Test func onlyAPairedDevicesFileTellsOfANewerKey() throws {
        let t = try TwoDevices()
        try t.syncA.cycle()
        let fileA = FileSystem.contents(of: t.folder + "/" + SyncFile.fileName(device: t.syncA.device))!
        var forged = fileA
        forged[12] = 9  // key epoch 9 in the clear header
        try SyncFolder.writeAtomically(forged, to: t.folder + "/newer.kcsync")
        try t.syncB.cycle()
        #expect(t.syncB.newerKeyEpoch == nil)
        #expect(t.syncB.problems.contains { $0.name == "newer.kcsync" })
        FileSystem.removeIfPresent(t.folder + "/newer.kcsync")
        try t.syncA.makeKey()
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(t.syncB.newerKeyEpoch == 2)
    }

    /// A file of a device no paired device recorded changes nothing and is reported; a device paired
    /// by A is read on B once A's file (which lists its key) is, whatever order the names come in.
    @Test func unknownDevicesAreNotReadAndIntroducedOnesAre() throws {
        let t = try TwoDevices()
        let stranger = try ItemService(directory: t.temporary.appending("s"))
        let other = try TemporaryDirectory(prefix: "kc-sync-other")
        try FileSystem.makeDirectory(other.appending("folder"))
        let syncS = try SyncEngine(
            service: stranger, folder: other.appending("folder"), stateDirectory: t.temporary.appending("s/sync"))
        try syncS.adopt(t.syncA.key!, devices: [:])  // holds the key, but no device recorded its signing key
        try t.add(stranger, "planted", "by a stranger")
        try syncS.cycle()
        let fileS = FileSystem.contents(of: other.appending("folder") + "/" + SyncFile.fileName(device: syncS.device))!
        try SyncFolder.writeAtomically(fileS, to: t.folder + "/" + SyncFile.fileName(device: syncS.device))
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "planted") == nil)
        let unknown = t.syncB.problems.filter { $0.reason.contains("not paired with this one") }
        #expect(unknown.count == 1)

        // A pairs C; C's file is in the folder before A's new file, under a name that sorts first.
        let c = try ItemService(directory: t.temporary.appending("c"))
        let syncC = try SyncEngine(service: c, folder: t.folder, stateDirectory: t.temporary.appending("c/sync"))
        try TwoDevices.pair(syncC, with: t.syncA)
        try t.add(c, "from c", "introduced")
        try syncC.cycle()
        let nameC = t.folder + "/" + SyncFile.fileName(device: syncC.device)
        try FileSystem.rename(nameC, to: t.folder + "/00-c.kcsync")
        try t.syncA.cycle()
        try t.syncB.cycle()
        #expect(try t.secret(t.b, "from c") == "introduced")
        #expect(t.syncB.state.keys[syncC.device] != nil)
        // C's own file was read in the same cycle as A's (not only C's versions through A's file).
        #expect((t.syncB.state.devices[syncC.device]?.sequence ?? 0) > 0)
        #expect(t.syncB.problems.allSatisfy { $0.name != "00-c.kcsync" })
        stranger.close()
        c.close()
    }
}

/// A device whose sync key was stored before device signatures holds no usable key: status says to
/// pair it again, a cycle says so and changes nothing, and pairing (here: starting a new set) works.
@Suite struct EarlierFormatTests {
    @Test func aSyncKeyOfTheEarlierFormatAsksForPairingAgain() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-sync-old")
        try FileSystem.makeDirectory(temporary.appending("folder"))
        let service = try ItemService(directory: temporary.appending("a"))
        let old = try SyncKey.fresh(epoch: 3)
        try service.setSyncKeyRecord(SecretBytes([0, 0, 0, 3] + old.raw.withUnsafeBytes { Array($0) }))
        let engine = try SyncEngine(
            service: service, folder: temporary.appending("folder"), stateDirectory: temporary.appending("a/sync"))
        #expect(engine.status["repairNeeded"]?.bool == true)
        #expect(engine.status["paired"]?.bool == false)
        var message = ""
        do { try engine.cycle() } catch { message = error.message }
        #expect(message.contains("pair it again"))
        #expect(FileSystem.contentsOfDirectory(temporary.appending("folder"))?.isEmpty == true)
        try engine.makeKey()
        #expect(engine.status["repairNeeded"] == nil)
        #expect(try engine.cycle().wrote)
        service.close()
    }
}
