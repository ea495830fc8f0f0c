public import KeychainCore
import KeychainCrypto
public import KeychainItems
public import KeychainSystem

/// Keeps the synchronizable items of one keychain and a sync folder in step (docs/sync.md). One
/// `cycle` exports the local changes (items added, changed or deleted since the last cycle get a new
/// stamp), reads every device's file in the folder, makes the winning versions local, and writes this
/// device's file. Its own state lives in `<data>/sync/`: the device identifier and the merged state,
/// sealed exactly as the folder file is; the sync key is a keychain item (`ItemService.syncKeyRecord`).
///
/// Not thread-safe: the daemon runs cycles on one thread and reads `status` under its own lock.
public final class SyncEngine {
    /// The sync folder (replicated by Syncthing or another engine).
    public let folder: String
    /// `<data>/sync`: this device's identifier, sync key and state.
    public let stateDirectory: String
    /// This device's identifier (16 random bytes, made once).
    public let device: [UInt8]
    /// The sync key; nil until this device makes one or is paired.
    public private(set) var key: SyncKey?
    /// The merged state: what this device last wrote.
    public private(set) var state = SyncState()
    private var clock: HybridClock
    private let service: ItemService
    private let now: () -> UInt64
    /// Files the last cycle could not read, with why.
    public private(set) var problems: [(name: String, reason: String)] = []
    /// Devices whose files are under a newer key than ours (this device was left out of a rotation).
    public private(set) var newerKeyEpoch: UInt32?
    /// This device's file must be written again (a new key: the folder holds it under the old one).
    private var mustWrite = false
    /// This device's signing key (Ed25519), once read or made; its public key is what the other
    /// devices record for this one.
    private var signingKey: SecureBytes?
    /// Set when the stored sync key is of an earlier format (without device signatures): this device
    /// holds no key until it is paired again.
    public private(set) var earlierFormat = false
    /// Tombstones dropped since the daemon started (every paired device held them).
    public private(set) var tombstonesCollected = 0
    /// What this device's last file said it held of each device (`DeviceProgress.included`).
    private var written: [[UInt8]: UInt64] = [:]

    static let identityName = "device-id"
    static let stateName = "state" + SyncFile.suffix

    /// Opens (or starts) the sync state in `stateDirectory` for `folder`. errSecIO when the state
    /// directory cannot be made or read; a damaged state file is errSecDecode.
    public init(
        service: ItemService, folder: String, stateDirectory: String,
        now: @escaping () -> UInt64 = { UInt64(max(0, WallClock.now()) * 1000) }
    ) throws(KeychainError) {
        self.service = service
        self.folder = folder
        self.stateDirectory = stateDirectory
        self.now = now
        if !FileSystem.exists(stateDirectory) {
            do { try FileSystem.makeDirectory(stateDirectory, permissions: 0o700) } catch {
                throw KeychainError(.io, "cannot make \(stateDirectory)", error)
            }
        }
        let idPath = stateDirectory + "/" + Self.identityName
        if let id = FileSystem.contents(of: idPath), id.count == SyncFile.deviceBytes {
            device = id
        } else {
            device = Sodium.randomBytes(SyncFile.deviceBytes)
            try SyncFolder.writeAtomically(device, to: idPath)
        }
        clock = HybridClock(device: device)
        try? loadKey()
    }

    /// Reads the sync key (kept as a keychain item: readable once unlocked) and the state sealed
    /// under it, when not read yet. errSecInteractionNotAllowed while locked.
    public func loadKey() throws(KeychainError) {
        guard key == nil, !earlierFormat, let record = try service.syncKeyRecord() else { return }
        if record.count == 4 + SyncKey.length {
            earlierFormat = true
            return
        }
        let loaded = try record.withUnsafeBytes { (b) throws(KeychainError) in try Self.decodeKey(Array(b)) }
        let publicKey = try signingPublicKey()
        key = loaded
        if let data = FileSystem.contents(of: stateDirectory + "/" + Self.stateName),
            SyncFile.verify(data, publicKey: publicKey), let (_, s) = try? SyncFile.open(data, key: loaded)
        {
            state = s
        }
        state.keys[device] = publicKey
        written = state.devices.mapValues(\.included)
        if let l = state.latestStamp { clock.observe(l) }
    }

    /// This device's signing public key, making the key pair (kept as a keychain item beside the sync
    /// key) the first time. errSecInteractionNotAllowed while locked.
    public func signingPublicKey() throws(KeychainError) -> [UInt8] {
        if let signingKey { return try Signature.publicKey(of: signingKey) }
        if let stored = try service.syncSigningKeyRecord(), stored.count == Signature.secretKeyBytes {
            let secret = try stored.withUnsafeBytes { (b) throws(KeychainError) in try SecureBytes(copying: b) }
            signingKey = secret
            return try Signature.publicKey(of: secret)
        }
        let (publicKey, secret) = try Signature.keyPair()
        let record = secret.withUnsafeBytes { SecretBytes(copying: $0) }
        try service.setSyncSigningKeyRecord(record)
        signingKey = secret
        return publicKey
    }

    /// Whether this device holds a sync key (it made one or was paired).
    public var isPaired: Bool { key != nil }

    /// Starts a new set of devices with a fresh key (`epoch` 1), or rotates to a new key one epoch
    /// higher: the devices that remain pair again, a removed device reads nothing written afterwards.
    /// The devices recorded as paired are then this one alone: the others' signing keys are dropped
    /// until they pair again.
    public func makeKey() throws(KeychainError) {
        let next = try SyncKey.fresh(epoch: (key?.epoch ?? 0) + 1)
        try adopt(next, devices: [:])
    }

    /// Takes a key received by pairing, with the paired devices' signing keys the other device sent
    /// (they replace the ones recorded). The state under the old key (if any) is kept: its versions
    /// are written again under the new key at the next cycle.
    public func adopt(_ newKey: SyncKey, devices: [[UInt8]: [UInt8]]) throws(KeychainError) {
        let publicKey = try signingPublicKey()
        let bytes =
            SyncFile.bigEndian(UInt64(newKey.epoch), 4) + newKey.raw.withUnsafeBytes { Array($0) } + [Self.recordFormat]
        try service.setSyncKeyRecord(SecretBytes(bytes))
        key = newKey
        earlierFormat = false
        mustWrite = true
        // Files read under the old key say nothing about the new one.
        for d in state.devices.keys {
            state.devices[d]!.sequence = 0
            state.devices[d]!.holds = [:]
        }
        state.keys = devices
        state.keys[device] = publicKey
        newerKeyEpoch = nil
    }

    /// Records the signing key of a device this one has just paired (the key came with the pairing
    /// request, under the one-time code). Written into this device's file at the next cycle, so the
    /// other devices learn it.
    public func admit(device other: [UInt8], publicKey: [UInt8]) throws(KeychainError) {
        guard other.count == SyncFile.deviceBytes, publicKey.count == Signature.publicKeyBytes else {
            throw KeychainError(.decode, "the pairing request is malformed")
        }
        state.keys[other] = publicKey
        // A device paired again (after a rotation) starts its files afresh.
        state.devices[other]?.sequence = 0
        mustWrite = true
    }

    /// The stored sync key record: epoch, key, then this format's byte (a record of the earlier
    /// format, without it, predates device signatures).
    static let recordFormat: UInt8 = 2

    /// Forgets the sync key and this device's state (leaving the set of devices); the folder and the
    /// items are untouched.
    public func leave() throws(KeychainError) {
        try service.setSyncKeyRecord(nil)
        FileSystem.removeIfPresent(stateDirectory + "/" + Self.stateName)
        key = nil
        earlierFormat = false
        state = SyncState()
    }

    static func decodeKey(_ stored: [UInt8]) throws(KeychainError) -> SyncKey {
        guard stored.count == 4 + SyncKey.length + 1, stored.last == recordFormat else {
            throw KeychainError(.decode, "the sync key record is damaged")
        }
        let epoch = UInt32(SyncFile.readBigEndian(stored, 0, 4))
        let raw = try withBytes(stored) { (b) throws(KeychainError) in
            try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[4..<(4 + SyncKey.length)]))
        }
        return try SyncKey(raw: raw, epoch: epoch)
    }

    /// What one cycle did.
    public struct CycleResult: Sendable {
        /// Local changes exported (new versions written by this device).
        public var exported = 0
        /// Versions from other devices made local.
        public var imported = 0
        /// Whether this device's file was written.
        public var wrote = false
    }

    /// One cycle. errSecInteractionNotAllowed while the keychain is locked (nothing done); errSecIO
    /// when the folder cannot be written. Damaged files are listed in `problems`, not thrown.
    @discardableResult
    public func cycle() throws(KeychainError) -> CycleResult {
        try loadKey()
        guard let key, let signingKey else {
            throw KeychainError(
                .notAvailable,
                earlierFormat
                    ? "this device's sync key predates device signatures: pair it again (keychainctl sync pair)"
                    : "this device is not paired for sync")
        }
        var result = CycleResult()
        let saved = state
        // 1. Local changes since the last cycle, against the state the store was last brought to.
        let (items, _) = try service.synchronizableItems()
        var local: [[UInt8]: ItemService.SyncedItem] = [:]
        // A version made now carries the sequence of the file this cycle writes (set there: a device
        // put back from an older copy learns its own newer sequences only from the folder).
        var made: [[UInt8]] = []
        for item in items {
            guard let identity = item.identity else { continue }
            local[SyncKey.itemID(identity)] = item
        }
        for (id, item) in local {
            if let e = state.entries[id], !e.deleted, e.attributes == item.attributes, e.secret == item.secret {
                continue
            }
            state.merge(
                SyncEntry(
                    id: id, stamp: clock.tick(now: now()), deleted: false, attributes: item.attributes,
                    secret: item.secret))
            made.append(id)
            result.exported += 1
        }
        for (id, e) in state.entries where !e.deleted && local[id] == nil {
            state.merge(
                SyncEntry(id: id, stamp: clock.tick(now: now()), deleted: true, attributes: [:], secret: SecretBytes()))
            made.append(id)
            result.exported += 1
        }
        // 2. Every device's file.
        let report = SyncFolder.read(folder: folder, key: key, into: &state)
        problems = report.damaged
        for d in report.disputedKeys.sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            problems.append(
                (
                    "(devices)",
                    "a paired device's file gives device \(SyncHex.encode(d)) another signing key than the one recorded here: kept the recorded one"
                ))
        }
        newerKeyEpoch = report.results.compactMap { r -> UInt32? in
            if case .otherKey(_, let epoch) = r.result, epoch > key.epoch { return epoch }
            return nil
        }.max()
        // 3. The winning versions, made local.
        var changes: [ItemService.SyncChange] = []
        for id in report.gone {
            if let identity = local[id]?.identity { changes.append(.remove(identity: identity)) }
        }
        for id in report.adopted {
            guard let e = state.entries[id] else { continue }
            let here = local[id]
            if e.deleted {
                if let identity = here?.identity { changes.append(.remove(identity: identity)) }
            } else if here == nil || here!.attributes != e.attributes || here!.secret != e.secret {
                changes.append(.put(ItemService.SyncedItem(attributes: e.attributes, secret: e.secret)))
            }
        }
        do throws(KeychainError) {
            let leftOut = try service.applySynced(changes)
            if leftOut > 0 {
                problems.append(("(items)", "\(leftOut) version(s) from other devices are not valid items: left out"))
            }
        } catch {
            state = saved
            throw error
        }
        result.imported = changes.count
        if let l = state.latestStamp { clock.observe(l) }
        // 4. Tombstones every paired device holds are dropped.
        let collected = state.collectTombstones(this: device)
        tombstonesCollected += collected
        // A tombstone this device now holds and its last file did not: its file tells the others
        // (so they can drop it in turn).
        let learned = state.entries.values.contains { e in
            e.deleted && (state.devices[e.stamp.device]?.included ?? 0) >= e.origin
                && (written[e.stamp.device] ?? 0) < e.origin
        }
        // 5. This device's file, when anything changed or none is there yet.
        let path = folder + "/" + SyncFile.fileName(device: device)
        if result.exported > 0 || !report.adopted.isEmpty || !report.gone.isEmpty || mustWrite || collected > 0
            || learned
            || !FileSystem.exists(path) || !FileSystem.exists(stateDirectory + "/" + Self.stateName)
        {
            let previous = state.devices[device]?.sequence ?? 0
            let sequence = max(previous + 1, now())
            state.devices[device, default: .init()].sequence = sequence
            state.devices[device]!.included = sequence
            for id in made where state.entries[id]?.stamp.device == device && state.entries[id]?.origin == 0 {
                state.entries[id]!.origin = sequence
            }
            let bytes = SyncFile.seal(
                state, header: .init(epoch: key.epoch, device: device, sequence: sequence), key: key,
                signingKey: signingKey)
            try SyncFolder.writeAtomically(bytes, to: stateDirectory + "/" + Self.stateName)
            try SyncFolder.writeAtomically(bytes, to: path)
            written = state.devices.mapValues(\.included)
            result.wrote = true
            mustWrite = false
        }
        return result
    }

    /// What `keychainctl sync status` shows.
    public var status: [String: Value] {
        var devices: [Value] = []
        for (id, p) in state.devices.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            var m: [String: Value] = [
                "device": .text(SyncHex.encode(id)), "this": .bool(id == device),
                "paired": .bool(state.keys[id] != nil),
            ]
            if let l = p.latest { m["lastChange"] = .date(Double(l.wall) / 1000) }
            if p.sequence > 0 { m["lastFile"] = .int(Int64(bitPattern: p.sequence)) }
            devices.append(.map(m))
        }
        var out: [String: Value] = [
            "folder": .text(folder), "device": .text(SyncHex.encode(device)), "paired": .bool(key != nil),
            "devices": .array(devices), "conflictsResolved": .int(Int64(state.conflictsResolved)),
            "items": .int(Int64(state.liveEntries.count)),
            "tombstones": .int(Int64(state.entries.count - state.liveEntries.count)),
            "problems": .array(problems.map { .text("\($0.name): \($0.reason)") }),
            "tombstonesCollected": .int(Int64(tombstonesCollected)),
        ]
        if earlierFormat { out["repairNeeded"] = .bool(true) }
        if let key { out["keyEpoch"] = .int(Int64(key.epoch)) }
        if let newerKeyEpoch { out["newerKeyEpoch"] = .int(Int64(newerKeyEpoch)) }
        return out
    }
}
