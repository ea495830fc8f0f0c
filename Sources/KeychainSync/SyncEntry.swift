public import KeychainCore
public import KeychainSystem

/// When and where a version of an item was written: a hybrid logical clock reading (milliseconds of
/// wall time, and a counter for writes within one millisecond or after seeing a clock ahead of ours)
/// and the writing device. Versions are ordered by (wall, counter, device): the total order the merge
/// rule uses (docs/sync.md).
public struct SyncStamp: Comparable, Hashable, Sendable, CustomStringConvertible {
    /// Milliseconds since the Unix epoch (or the largest seen, when a peer's clock runs ahead).
    public var wall: UInt64
    /// Orders writes within one `wall` value.
    public var counter: UInt32
    /// The writing device's identifier (16 bytes).
    public var device: [UInt8]

    /// A stamp of `wall` milliseconds, `counter` and `device`.
    public init(wall: UInt64, counter: UInt32, device: [UInt8]) {
        self.wall = wall
        self.counter = counter
        self.device = device
    }

    /// The total order: wall time, then counter, then device bytes.
    public static func < (a: SyncStamp, b: SyncStamp) -> Bool {
        if a.wall != b.wall { return a.wall < b.wall }
        if a.counter != b.counter { return a.counter < b.counter }
        return a.device.lexicographicallyPrecedes(b.device)
    }

    /// `wall.counter@device-prefix`: no item content.
    public var description: String { "\(wall).\(counter)@\(SyncHex.encode(device.prefix(4)))" }
}

/// A hybrid logical clock (Kulkarni et al.): never goes backwards, stays close to wall time, and is
/// ahead of every stamp this device has seen, so a write made after seeing another device's version
/// always orders after it, whatever the two wall clocks say.
public struct HybridClock: Sendable {
    /// The largest wall time (milliseconds) stamped or seen.
    public private(set) var wall: UInt64 = 0
    /// The counter within `wall`.
    public private(set) var counter: UInt32 = 0
    /// The device this clock stamps for.
    public let device: [UInt8]

    /// A clock for `device` that has seen nothing yet.
    public init(device: [UInt8]) { self.device = device }

    /// A stamp for a write made now (`now`: wall time in milliseconds).
    public mutating func tick(now: UInt64) -> SyncStamp {
        if now > wall {
            wall = now
            counter = 0
        } else if counter == UInt32.max {
            wall += 1
            counter = 0
        } else {
            counter += 1
        }
        return SyncStamp(wall: wall, counter: counter, device: device)
    }

    /// Takes in a stamp seen in another device's file (or this device's own, from before a restart).
    public mutating func observe(_ stamp: SyncStamp) {
        if stamp.wall > wall || (stamp.wall == wall && stamp.counter > counter) {
            wall = stamp.wall
            counter = stamp.counter
        }
    }
}

/// One version of one synchronizable item: its attributes (as the store keeps them, without the
/// persistent reference) and secret, or a tombstone when it was deleted.
public struct SyncEntry: Sendable, CustomStringConvertible {
    /// The item's identity: a keyed hash of its class, access group, service and account (32 bytes).
    public var id: [UInt8]
    /// When and where this version was written.
    public var stamp: SyncStamp
    /// Whether this version is a tombstone (the item was deleted).
    public var deleted: Bool
    /// The stored attributes (`agrp`, `svce`, `acct`, `pdmn`, dates, …); empty for a tombstone.
    public var attributes: [String: Value]
    /// The secret; empty for a tombstone.
    public var secret: SecretBytes
    /// The sequence of the writer's file that first carried this version (set when that file is
    /// written; 0 until then): every later file of the writer carries it, a newer version of the item,
    /// or nothing when a tombstone of it was collected. A device that holds that file of the writer
    /// and has no version of the item has therefore deleted it.
    public var origin: UInt64

    /// A version; a tombstone keeps no attributes or secret.
    public init(
        id: [UInt8], stamp: SyncStamp, deleted: Bool, attributes: [String: Value], secret: SecretBytes,
        origin: UInt64 = 0
    ) {
        self.id = id
        self.stamp = stamp
        self.deleted = deleted
        self.origin = origin
        self.attributes = deleted ? [:] : attributes
        self.secret = deleted ? SecretBytes() : secret
    }

    /// The entry's content (not its stamp) as bytes: what the tie-break compares and what says whether
    /// two versions hold the same item.
    public var content: SecretBytes {
        var out = SecretBytes(capacity: 64 + secret.count)
        CBOR.encode(
            .array([.bool(deleted), .map(attributes), .secret(secret)]), into: &out)
        return out
    }

    /// Whether `other` holds the same content (the stamps aside).
    public func sameContent(as other: SyncEntry) -> Bool {
        deleted == other.deleted && attributes == other.attributes && secret == other.secret
    }

    /// The merge rule: whether `self` wins over `other` (another version of the same item). The later
    /// stamp wins; equal stamps (only a cloned device writes two versions with one stamp) are broken
    /// by the content bytes, the greater winning — so every device picks the same version.
    public func wins(over other: SyncEntry) -> Bool {
        if stamp != other.stamp { return other.stamp < stamp }
        let a = content
        let b = other.content
        return a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in pb.lexicographicallyPrecedes(pa) } }
    }

    /// The identity prefix and stamp: never an attribute or the secret.
    public var description: String {
        "sync entry \(SyncHex.encode(id.prefix(4))) \(stamp)\(deleted ? " (deleted)" : "")"
    }
}

/// Lower-case hexadecimal, for device identifiers in file names and status output.
public enum SyncHex {
    /// `bytes` in lower-case hexadecimal.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of lower-case hexadecimal `text`; nil when it is not that.
    public static func decode(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
            default: return nil
            }
        }
        var out: [UInt8] = []
        var i = 0
        while i < chars.count {
            guard let h = nibble(chars[i]), let l = nibble(chars[i + 1]) else { return nil }
            out.append(h << 4 | l)
            i += 2
        }
        return out
    }
}
