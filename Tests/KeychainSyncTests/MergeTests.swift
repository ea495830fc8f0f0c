import KeychainCore
import KeychainCrypto
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainSync

/// SplitMix64: the same "random" operations on every run.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Signing key pairs of simulated devices 0 to 63, made once.
let simSigners: [(publicKey: [UInt8], secretKey: SecureBytes)] = (0..<64).map { _ in try! Signature.keyPair() }

/// A simulated device: its state, clock and the files it has written. It knows the signing keys of
/// `paired` (devices 1, 2 and 3 unless told) and its own.
struct SimDevice {
    let id: [UInt8]
    let n: UInt8
    var state = SyncState()
    var clock: HybridClock
    var sequence: UInt64 = 0
    init(_ n: UInt8, paired: [UInt8] = [1, 2, 3]) {
        self.n = n
        id = [UInt8](repeating: n, count: 16)
        clock = HybridClock(device: id)
        for p in paired + [n] { state.keys[[UInt8](repeating: p, count: 16)] = simSigners[Int(p)].publicKey }
    }

    mutating func write(_ itemID: [UInt8], secret: String?, now: UInt64) {
        let stamp = clock.tick(now: now)
        let attributes: [String: Value] = [
            "svce": .text("svc-\(itemID[0])"), "acct": .text("me"), "agrp": .text("TEAM.app"),
        ]
        state.merge(
            SyncEntry(
                id: itemID, stamp: stamp, deleted: secret == nil, attributes: attributes,
                secret: SecretBytes(Array((secret ?? "").utf8)), origin: sequence + 1))
    }

    mutating func file(_ key: SyncKey) -> [UInt8] {
        sequence += 1
        state.devices[id, default: .init()].sequence = sequence
        state.devices[id]!.included = sequence
        return SyncFile.seal(
            state, header: .init(epoch: key.epoch, device: id, sequence: sequence), key: key,
            signingKey: simSigners[Int(n)].secretKey)
    }

    /// Drops the tombstones every paired device holds, as a cycle does after reading.
    @discardableResult
    mutating func collect() -> Int { state.collectTombstones(this: id) }

    /// Reads `files` as a device's cycle reads its folder: all together, under names in a shuffled
    /// order.
    mutating func readFolder(_ files: [[UInt8]], _ key: SyncKey, _ rng: inout SeededGenerator) throws {
        let folder = try TemporaryDirectory(prefix: "kc-sync-merge")
        for (i, f) in files.enumerated() {
            let name = String(UInt64.random(in: 0..<UInt64.max, using: &rng), radix: 16) + "-\(i).kcsync"
            try SyncFolder.writeAtomically(f, to: folder.appending(name))
        }
        _ = SyncFolder.read(folder: folder.path, key: key, into: &state)
        if let l = state.latestStamp { clock.observe(l) }
    }

    mutating func read(_ files: [[UInt8]], _ key: SyncKey) {
        var adopted = Set<[UInt8]>()
        for f in files {
            _ = SyncFolder.merge(f, key: key, into: &state, adopted: &adopted)
        }
        if let l = state.latestStamp { clock.observe(l) }
    }
}

/// A 32-byte item identity.
func iid(_ n: UInt8) -> [UInt8] { [UInt8](repeating: n, count: 32) }

/// The live items and their values, comparable across states whatever tombstones each still keeps.
func live(_ s: SyncState) -> [String] {
    s.liveEntries.map { e in
        "\(SyncHex.encode(e.id.prefix(2))) \(String(decoding: e.secret.unprotectedArray, as: UTF8.self))"
    }.sorted()
}

/// The winning version of each item, comparable across states.
func summary(_ s: SyncState) -> [String] {
    s.entries.values.map { e in
        "\(SyncHex.encode(e.id)) \(e.stamp) \(e.deleted) \(String(decoding: e.secret.unprotectedArray, as: UTF8.self))"
    }.sorted()
}

@Suite struct MergeTests {
    let key = try! SyncKey.fresh(epoch: 1)

    /// Three devices edit and delete the same few items concurrently, with skewed clocks, reading each
    /// other's files at random moments. Every file any of them ever wrote (old versions included, as a
    /// replay or a slow copy would bring them) is then read by fresh devices in many shuffled orders:
    /// all end with the same version of every item, the one the rule picks.
    @Test func shuffledOrdersConverge() throws {
        var rng = SeededGenerator(state: 42)
        var devices = [SimDevice(1), SimDevice(2), SimDevice(3)]
        let skew: [UInt64] = [0, 5_000, 0]  // device 2's clock runs 5 s ahead
        let items: [[UInt8]] = (0..<6).map { [UInt8](repeating: $0, count: 32) }
        var allFiles: [[UInt8]] = []
        var latest: [[UInt8]] = [[], [], []]
        var now: UInt64 = 1_700_000_000_000
        for step in 0..<200 {
            now += UInt64.random(in: 0...3, using: &rng)  // often the same millisecond
            let d = Int.random(in: 0..<3, using: &rng)
            if Bool.random(using: &rng) {
                devices[d].read(latest.filter { !$0.isEmpty }.shuffled(using: &rng), key)
            }
            let item = items.randomElement(using: &rng)!
            let delete = Int.random(in: 0..<4, using: &rng) == 0
            devices[d].write(item, secret: delete ? nil : "v\(step)-d\(d)", now: now + skew[d])
            let file = devices[d].file(key)
            latest[d] = file
            allFiles.append(file)
        }
        var reference = SimDevice(9)
        reference.read(allFiles, key)
        let expected = summary(reference.state)
        #expect(expected.count == items.count)
        for round in 0..<25 {
            var reader = SimDevice(UInt8(10 + round))
            reader.read(allFiles.shuffled(using: &rng), key)
            #expect(summary(reader.state) == expected, "order \(round)")
        }
        // The devices themselves, once each has read the others' last files, agree too.
        for d in devices.indices {
            devices[d].read(latest.shuffled(using: &rng), key)
            #expect(summary(devices[d].state) == expected, "device \(d + 1)")
        }
    }

    /// The rule itself: the later stamp wins; a write made after seeing a version from a device whose
    /// clock runs ahead still wins over it; equal stamps are broken by content, the same way on both sides.
    @Test func lastWriterWinsOnTheHybridClock() {
        var fast = SimDevice(1)
        var slow = SimDevice(2)
        fast.write(iid(7), secret: "from the fast clock", now: 10_000)
        slow.read([fast.file(key)], key)
        slow.write(iid(7), secret: "later, on the slow clock", now: 1_000)
        fast.read([slow.file(key)], key)
        #expect(summary(fast.state) == summary(slow.state))
        #expect(
            fast.state.entries[iid(7)].map { String(decoding: $0.secret.unprotectedArray, as: UTF8.self) }
                == "later, on the slow clock")

        let stamp = SyncStamp(wall: 5, counter: 0, device: [UInt8](repeating: 3, count: 16))
        let a = SyncEntry(
            id: iid(1), stamp: stamp, deleted: false, attributes: [:], secret: SecretBytes(Array("a".utf8)))
        let b = SyncEntry(
            id: iid(1), stamp: stamp, deleted: false, attributes: [:], secret: SecretBytes(Array("b".utf8)))
        #expect(b.wins(over: a) && !a.wins(over: b))
        var s1 = SyncState()
        var s2 = SyncState()
        s1.merge(a)
        s1.merge(b)
        s2.merge(b)
        s2.merge(a)
        #expect(summary(s1) == summary(s2))
    }

    /// A delete is a tombstone: an older version of the item arriving later does not bring it back.
    @Test func tombstonesKeepDeletedItemsDeleted() {
        var a = SimDevice(1)
        var b = SimDevice(2)
        a.write(iid(5), secret: "one", now: 100)
        let old = a.file(key)
        b.read([old], key)
        b.write(iid(5), secret: nil, now: 200)
        let deleted = b.file(key)
        var c = SimDevice(3)
        c.read([deleted, old], key)
        #expect(c.state.entries[iid(5)]?.deleted == true)
        #expect(c.state.liveEntries.isEmpty)
    }

    /// A replayed older file from a device is skipped (and could not roll anything back anyway); a
    /// truncated, bit-flipped or foreign file changes nothing and says why; a file of another key epoch
    /// is not read.
    @Test func replayedDamagedAndForeignFilesChangeNothing() throws {
        var a = SimDevice(1)
        a.write(iid(1), secret: "first", now: 100)
        let first = a.file(key)
        a.write(iid(1), secret: "second", now: 200)
        let second = a.file(key)
        var reader = SimDevice(2)
        var adopted = Set<[UInt8]>()
        #expect(
            SyncFolder.merge(second, key: key, into: &reader.state, adopted: &adopted)
                == .merged(device: a.id, sequence: 2, adopted: 1))
        #expect(
            SyncFolder.merge(first, key: key, into: &reader.state, adopted: &adopted)
                == .stale(device: a.id, sequence: 1, older: true))
        let before = summary(reader.state)

        var truncated = second
        truncated.removeLast(100)
        var flipped = second
        flipped[flipped.count / 2] ^= 1
        var forgedSequence = first
        forgedSequence[SyncFile.headerBytes - 1] = 9  // header is authenticated: a raised sequence fails
        for bad in [truncated, flipped, forgedSequence, Array("hello".utf8), []] {
            // Read by a device that has seen nothing yet (one that has would skip them as not newer).
            var fresh = SimDevice(4).state
            let r = SyncFolder.merge(bad, key: key, into: &fresh, adopted: &adopted)
            switch r {
            case .damaged, .badSignature: break
            default: Issue.record("accepted a bad file: \(r)")
            }
            #expect(fresh.entries.isEmpty && fresh.devices.isEmpty)
        }
        let otherKey = try SyncKey.fresh(epoch: 1)
        var c = SimDevice(3)
        c.write(iid(1), secret: "other key", now: 900)
        let foreign = SyncFile.seal(
            c.state, header: .init(epoch: 1, device: c.id, sequence: 5), key: otherKey,
            signingKey: simSigners[3].secretKey)
        guard case .damaged = SyncFolder.merge(foreign, key: key, into: &reader.state, adopted: &adopted) else {
            Issue.record("a file under another key was read")
            return
        }
        let rotated = try SyncKey.fresh(epoch: 2)
        let newer = SyncFile.seal(
            c.state, header: .init(epoch: 2, device: c.id, sequence: 6), key: rotated,
            signingKey: simSigners[3].secretKey)
        #expect(
            SyncFolder.merge(newer, key: key, into: &reader.state, adopted: &adopted)
                == .otherKey(device: c.id, epoch: 2))
        #expect(summary(reader.state) == before)
    }

    /// The folder holds no service, account, group or secret in the clear, and sizes are padded: one
    /// item and twenty small items make files of the same size.
    @Test func filesAreCiphertextAndPadded() {
        var one = SimDevice(1)
        one.write(iid(1), secret: "hunter2-secret", now: 1)
        let small = one.file(key)
        var many = SimDevice(2)
        for i in 0..<20 { many.write(iid(UInt8(i)), secret: "secret \(i)", now: UInt64(i)) }
        let big = many.file(key)
        #expect(small.count == big.count)
        for needle in ["hunter2", "svc-", "TEAM.app", "me"] where needle.count > 2 {
            #expect(!contains(small, Array(needle.utf8)), "\(needle) in clear")
        }
    }

    /// The tombstone rule (docs/sync.md): a tombstone is dropped only once every paired device's file
    /// shows it holds it. While C is offline with the deleted item's old version, A and B keep the
    /// tombstone; C, back, takes the deletion (its old version loses); then all drop it. Every file
    /// ever written — C's old one with the live version included — read again by each device in
    /// shuffled orders, or by a new reader as one folder, never brings the item back.
    @Test func aCollectedTombstoneNeverLetsAnOldVersionBack() throws {
        var rng = SeededGenerator(state: 7)
        var a = SimDevice(1)
        var b = SimDevice(2)
        var c = SimDevice(3)
        var all: [[UInt8]] = []
        a.write(iid(1), secret: "doomed", now: 1_000)
        a.write(iid(2), secret: "kept", now: 1_001)
        var fa = a.file(key)
        b.read([fa], key)
        c.read([fa], key)
        var fb = b.file(key)
        var fc = c.file(key)
        all += [fa, fb, fc]
        // C goes offline. A deletes item 1; A and B exchange files for a while.
        a.write(iid(1), secret: nil, now: 2_000)
        fa = a.file(key)
        all.append(fa)
        for _ in 0..<3 {
            b.read([fa, fc], key)
            b.collect()
            fb = b.file(key)
            a.read([fb, fc], key)
            a.collect()
            fa = a.file(key)
            all += [fa, fb]
        }
        #expect(a.state.entries[iid(1)]?.deleted == true, "A dropped the tombstone while C had not seen it")
        #expect(b.state.entries[iid(1)]?.deleted == true, "B dropped the tombstone while C had not seen it")
        // C comes back: the deletion wins over its old version.
        c.read([fa, fb], key)
        c.collect()
        #expect(!live(c.state).contains { $0.hasSuffix("doomed") })
        fc = c.file(key)
        all.append(fc)
        for _ in 0..<2 {
            a.read([fb, fc], key)
            a.collect()
            b.read([fa, fc], key)
            b.collect()
            fa = a.file(key)
            fb = b.file(key)
            all += [fa, fb]
        }
        for d in [a, b, c] {
            #expect(d.state.entries[iid(1)] == nil, "device \(d.n) still keeps the tombstone")
            #expect(live(d.state) == ["0202 kept"])
        }
        for round in 0..<10 {
            for var d in [a, b, c] {
                d.read(all.shuffled(using: &rng), key)
                #expect(live(d.state) == ["0202 kept"], "device \(d.n), order \(round)")
            }
            var reader = SimDevice(UInt8(20 + round))
            try reader.readFolder(all, key, &rng)
            #expect(live(reader.state) == ["0202 kept"], "new reader, order \(round)")
        }
    }

    /// Random writes and deletes of three devices with skewed clocks, each collecting tombstones after
    /// every read, one of them offline for a long stretch: once they have read each other's last
    /// files, all hold the live items a device that never collects would (every version ever
    /// written, merged), and reading every file ever written again, per file in shuffled orders or as
    /// one folder, changes no device's live items.
    @Test func collectingTombstonesKeepsConvergence() throws {
        var rng = SeededGenerator(state: 4242)
        var devices = [SimDevice(1), SimDevice(2), SimDevice(3)]
        var oracle = SyncState()
        let skew: [UInt64] = [0, 3_000, 0]
        var all: [[UInt8]] = []
        var latest: [[UInt8]] = [[], [], []]
        var now: UInt64 = 1_700_000_000_000
        var collected = 0
        for step in 0..<300 {
            now += UInt64.random(in: 0...3, using: &rng)
            // Device 3 is offline from step 100 to 200: it neither reads nor writes.
            let d = (100..<200).contains(step) ? Int.random(in: 0..<2, using: &rng) : Int.random(in: 0..<3, using: &rng)
            if Bool.random(using: &rng) {
                devices[d].read(latest.filter { !$0.isEmpty }.shuffled(using: &rng), key)
                collected += devices[d].collect()
            }
            let item = iid(UInt8.random(in: 0..<5, using: &rng))
            let delete = Int.random(in: 0..<3, using: &rng) == 0
            devices[d].write(item, secret: delete ? nil : "v\(step)-d\(d)", now: now + skew[d])
            oracle.merge(devices[d].state.entries[item]!)
            let file = devices[d].file(key)
            latest[d] = file
            all.append(file)
        }
        for _ in 0..<4 {
            for d in devices.indices {
                devices[d].read(latest.shuffled(using: &rng), key)
                collected += devices[d].collect()
                latest[d] = devices[d].file(key)
                all.append(latest[d])
            }
        }
        #expect(collected > 0, "no tombstone was ever collected: the test would prove nothing")
        let expected = live(oracle)
        for d in devices {
            #expect(live(d.state) == expected, "device \(d.n)")
            #expect(d.state.entries.values.allSatisfy { !$0.deleted }, "device \(d.n) keeps a tombstone all hold")
        }
        for round in 0..<10 {
            for var d in devices {
                d.read(all.shuffled(using: &rng), key)
                #expect(live(d.state) == expected, "device \(d.n), order \(round)")
            }
            var reader = SimDevice(UInt8(30 + round))
            try reader.readFolder(all, key, &rng)
            #expect(live(reader.state) == expected, "new reader, order \(round)")
        }
    }

    func contains(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= hay.count else { return false }
        for i in 0...(hay.count - needle.count) where Array(hay[i..<(i + needle.count)]) == needle { return true }
        return false
    }
}
