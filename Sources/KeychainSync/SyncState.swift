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

    /// Merges every version of another state (another device's file); returns the items adopted.
    @discardableResult
    public mutating func merge(_ other: SyncState) -> [[UInt8]] {
        var adopted: [[UInt8]] = []
        for id in other.entries.keys.sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            if merge(other.entries[id]!) == .adopted { adopted.append(id) }
        }
        for progress in other.devices.values {
            if let latest = progress.latest { note(latest) }
        }
        return adopted
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
