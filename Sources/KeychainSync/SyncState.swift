import KeychainCore
import KeychainSystem

/// What one device knows of the synchronizable items: the winning version of every item (tombstones
/// included) and, per device, the newest file read from it. Merging is commutative, associative and
/// idempotent (a join of per-item last-writer-wins registers), so devices that have read the same
/// files hold the same entries whatever order the files came in.
public struct SyncState: Sendable {
    /// The winning version of each item, by item identity.
    public var entries: [[UInt8]: SyncEntry] = [:]
    /// Per device: the newest file sequence accepted, and the latest stamp seen from it.
    public var devices: [[UInt8]: DeviceProgress] = [:]
    /// The paired devices' signing public keys (Ed25519), by device: recorded when a device is paired
    /// with this one, or taken from the signed file of a device already recorded. A file is read only
    /// when it is signed by the key recorded for the device it names.
    public var keys: [[UInt8]: [UInt8]] = [:]
    /// Versions written without knowledge of the version that won (concurrent writes of one item),
    /// discarded by this device.
    public var conflictsResolved: Int = 0

    /// An empty state.
    public init() {}

    /// What this device knows of another.
    public struct DeviceProgress: Sendable, Equatable {
        /// The sequence of the newest file accepted from the device (0: none).
        public var sequence: UInt64 = 0
        /// The latest stamp written by the device, among the versions seen.
        public var latest: SyncStamp?
        /// The sequence of the newest file of the device whose versions this state holds (read here,
        /// or through another device's file that held them): a file of the device with a lower
        /// sequence brings nothing new and is not read.
        public var included: UInt64 = 0
        /// What the device's own last file read here said it held: per device, its `included`. A
        /// tombstone can be dropped once every paired device holds it (`collectTombstones`).
        public var holds: [[UInt8]: UInt64] = [:]
        /// Progress with `sequence` and `latest`.
        public init(sequence: UInt64 = 0, latest: SyncStamp? = nil) {
            self.sequence = sequence
            self.latest = latest
        }
    }

    /// What merging one version did.
    public enum Outcome: Equatable, Sendable {
        /// The version is new or won: it replaced what was here (the store must follow).
        case adopted
        /// The version lost to the one here (a conflict resolved, or an old version seen again).
        case discarded
        /// The same version was already here.
        case same
    }

    /// Merges one version by the rule (`SyncEntry.wins`).
    @discardableResult
    public mutating func merge(_ incoming: SyncEntry) -> Outcome {
        // A version newer than any seen from its writer, that loses: its writer had not seen the
        // winner (had it, its clock would have stamped it later) — a conflict, resolved here.
        let known = devices[incoming.stamp.device]?.latest
        let unseen = known == nil || known! < incoming.stamp
        note(incoming.stamp)
        guard let present = entries[incoming.id] else {
            entries[incoming.id] = incoming
            return .adopted
        }
        if present.stamp == incoming.stamp && present.sameContent(as: incoming) { return .same }
        if incoming.wins(over: present) {
            entries[incoming.id] = incoming
            return .adopted
        }
        if unseen { conflictsResolved += 1 }
        return .discarded
    }

    /// Merges every version of another state (another device's file); returns the items adopted and
    /// the items the other state shows were deleted (their tombstone collected) while this state
    /// still holds an older version.
    ///
    /// A version is known to a state that holds the file of its writer that first carried it
    /// (`origin` ≤ `included` of the writer): such a state holds it, a newer version, or — when it
    /// has none — has deleted the item and dropped the tombstone. So a version for an item absent
    /// here that this state already held is not taken back, and a live version here that the other
    /// state held but no longer has is gone.
    @discardableResult
    public mutating func merge(_ other: SyncState) -> (adopted: [[UInt8]], gone: [[UInt8]]) {
        var adopted: [[UInt8]] = []
        for id in other.entries.keys.sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            let e = other.entries[id]!
            if entries[id] == nil, e.origin > 0, devices[e.stamp.device]?.included ?? 0 >= e.origin {
                note(e.stamp)
                continue
            }
            if merge(e) == .adopted { adopted.append(id) }
        }
        var gone: [[UInt8]] = []
        for (id, e) in entries where !e.deleted && e.origin > 0 && other.entries[id] == nil {
            if other.devices[e.stamp.device]?.included ?? 0 >= e.origin { gone.append(id) }
        }
        for id in gone { entries[id] = nil }
        for (d, progress) in other.devices {
            if let latest = progress.latest { note(latest) }
            if progress.included > (devices[d]?.included ?? 0) {
                devices[d, default: .init()].included = progress.included
            }
        }
        return (adopted, gone)
    }

    /// Takes in the signing keys another device's file lists for devices not recorded here (a device
    /// it paired); a key recorded here is never replaced that way. Returns the devices whose key the
    /// file gives otherwise than recorded here.
    @discardableResult
    public mutating func learnKeys(from other: SyncState) -> [[UInt8]] {
        var disputed: [[UInt8]] = []
        for (d, k) in other.keys {
            if let known = keys[d] {
                if known != k { disputed.append(d) }
            } else {
                keys[d] = k
            }
        }
        return disputed
    }

    /// Whether every paired device (`keys`) is known to hold the tombstone `entry`: its last file read
    /// here (this device: this state) holds the file of the tombstone's writer that first carried it.
    /// Such a device has deleted the item, so no version older than the tombstone can come from it.
    public func everyDeviceHolds(_ entry: SyncEntry, this: [UInt8]) -> Bool {
        guard entry.deleted, entry.origin > 0, !keys.isEmpty else { return false }
        let writer = entry.stamp.device
        for d in keys.keys {
            let held = d == this ? devices[writer]?.included ?? 0 : devices[d]?.holds[writer] ?? 0
            if held < entry.origin { return false }
        }
        return true
    }

    /// Drops the tombstones every paired device holds (docs/sync.md, "Collecting tombstones").
    /// Returns how many were dropped.
    @discardableResult
    public mutating func collectTombstones(this: [UInt8]) -> Int {
        let done = entries.values.filter { everyDeviceHolds($0, this: this) }.map(\.id)
        for id in done { entries[id] = nil }
        return done.count
    }

    /// The latest stamp seen, from any device (a clock restarted from this state observes it).
    public var latestStamp: SyncStamp? {
        var best: SyncStamp?
        for e in entries.values where best == nil || best! < e.stamp { best = e.stamp }
        return best
    }

    private mutating func note(_ stamp: SyncStamp) {
        var p = devices[stamp.device] ?? DeviceProgress()
        if p.latest == nil || p.latest! < stamp { p.latest = stamp }
        devices[stamp.device] = p
    }

    /// The live (not deleted) entries.
    public var liveEntries: [SyncEntry] { entries.values.filter { !$0.deleted } }
}
