public import KeychainCore
public import KeychainCrypto
import KeychainSystem

/// The sync key of a set of paired devices, with its generation (`epoch`: raised each time a device
/// is removed), and the keys derived from it.
public final class SyncKey: Sendable {
    /// Length of the sync key (32 bytes).
    public static let length = 32
    /// Raised at each rotation; files of another epoch are not read.
    public let epoch: UInt32
    /// The key itself: what pairing hands to a new device.
    public let raw: SecureBytes
    private let fileKey: SecureBytes

    /// A key of `SyncKey.length` bytes, of generation `epoch`.
    public init(raw: SecureBytes, epoch: UInt32) throws(KeychainError) {
        guard raw.count == Self.length else { throw KeychainError(.decode, "a sync key must be \(Self.length) bytes") }
        self.raw = raw
        self.epoch = epoch
        fileKey = try KeyedHash.deriveKey(from: raw, label: "keychaind sync file v1")
    }

    /// A new random key.
    public static func fresh(epoch: UInt32) throws(KeychainError) -> SyncKey {
        try SyncKey(raw: try SecureBytes(random: length), epoch: epoch)
    }

    /// An item's identity across devices: BLAKE2b of its class and the values of its class's
    /// uniqueness key (`ItemService.SyncedItem.identity`). It is only ever inside the sealed payload,
    /// and the same under every key (a rotation keeps every item's identity, so no item looks deleted
    /// and added again).
    public static func itemID(_ identity: [[UInt8]]) -> [UInt8] {
        idLabel.withUnsafeBytes { k in KeyedHash.hash(key: k, domain: 0x53, parts: identity, length: 32) }
    }

    /// The fixed BLAKE2b key of item identities (a label, not a secret).
    private static let idLabel: [UInt8] = Array("keychaind sync item identity v1.".utf8)

    func withFileKey<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try fileKey.withUnsafeBytes(body)
    }
}

/// One device's file in the sync folder (docs/sync.md): a clear header — magic, format version, key
/// epoch, device identifier, sequence — then one XChaCha20-Poly1305 box under a key derived from the
/// sync key, with the header as associated data, then the writing device's Ed25519 signature of all
/// that. Inside: the device's whole merged state (every
/// synchronizable item's winning version and the tombstones), padded to a power of two of at least
/// 4 KiB, so the file's size tells the item count only to within a factor of two.
public enum SyncFile {
    /// The first eight bytes of every sync file.
    public static let magic: [UInt8] = Array("KCSYNC\r\n".utf8)
    /// The format version this keychaind writes and reads.
    public static let version: UInt8 = 2
    /// Magic, version, epoch (4), device (16), sequence (8).
    public static let headerBytes = 8 + 1 + 4 + 16 + 8
    /// Device identifiers are 16 random bytes.
    public static let deviceBytes = 16
    /// Smallest padded plaintext.
    public static let minimumPadded = 4096
    /// Largest file read (bigger is refused unread): 256 MiB.
    public static let maximumBytes = 256 << 20
    /// File name suffix in the folder.
    public static let suffix = ".kcsync"

    /// What the clear header says.
    public struct Header: Equatable, Sendable {
        /// The sync key generation the file is sealed under.
        public var epoch: UInt32
        /// The writing device's identifier.
        public var device: [UInt8]
        /// The writer's file sequence: a newer file has a greater one.
        public var sequence: UInt64
        /// A header with these fields.
        public init(epoch: UInt32, device: [UInt8], sequence: UInt64) {
            self.epoch = epoch
            self.device = device
            self.sequence = sequence
        }

        var bytes: [UInt8] {
            magic + [version] + bigEndian(UInt64(epoch), 4) + device + bigEndian(sequence, 8)
        }
    }

    /// The file name a device writes: `<device hex>.kcsync`.
    public static func fileName(device: [UInt8]) -> String { SyncHex.encode(device) + suffix }

    /// The header alone (no key needed). errSecDecode when it is not one of ours.
    public static func header(of data: [UInt8]) throws(KeychainError) -> Header {
        guard data.count >= headerBytes, Array(data[0..<8]) == magic else {
            throw KeychainError(.decode, "not a keychaind sync file")
        }
        guard data[8] == version else {
            throw KeychainError(
                .decode,
                data[8] < version
                    ? "sync file format version \(data[8]) (without device signatures) is no longer read: pair its device again"
                    : "sync file format version \(data[8]) is not supported (this keychaind reads \(version))")
        }
        return Header(
            epoch: UInt32(readBigEndian(data, 9, 4)), device: Array(data[13..<29]), sequence: readBigEndian(data, 29, 8)
        )
    }

    /// The padded size of a plaintext of `count` bytes (length prefix included).
    public static func paddedSize(_ count: Int) -> Int {
        var size = minimumPadded
        while size < count { size *= 2 }
        return size
    }

    /// Seals `state` as `header.device`'s file, signed with that device's `signingKey`.
    public static func seal(_ state: SyncState, header: Header, key: SyncKey, signingKey: SecureBytes) -> [UInt8] {
        precondition(header.device.count == deviceBytes && header.epoch == key.epoch)
        var payload = SecretBytes(capacity: 4096)
        CBOR.encode(encode(state), into: &payload)
        let padded = paddedSize(payload.count + 4)
        var plain = SecretBytes(capacity: padded)
        let length = bigEndian(UInt64(payload.count), 4)
        length.withUnsafeBytes { plain.append(contentsOf: $0) }
        payload.withUnsafeBytes { plain.append(contentsOf: $0) }
        let zeros = [UInt8](repeating: 0, count: padded - plain.count)
        zeros.withUnsafeBytes { plain.append(contentsOf: $0) }
        let h = header.bytes
        let box = key.withFileKey { k in
            plain.withUnsafeBytes { p in h.withUnsafeBytes { a in AEAD.seal(p, key: k, ad: a) } }
        }
        let signed = h + box
        return signed + signed.withUnsafeBytes { Signature.sign($0, secretKey: signingKey) }
    }

    /// Whether the file's signature (its last `Signature.bytes`) is `publicKey`'s, over everything
    /// before it.
    public static func verify(_ data: [UInt8], publicKey: [UInt8]) -> Bool {
        guard data.count > headerBytes + Signature.bytes else { return false }
        let signature = Array(data.suffix(Signature.bytes))
        return data.withUnsafeBytes { d in
            Signature.verify(
                signature, of: UnsafeRawBufferPointer(rebasing: d[0..<(d.count - Signature.bytes)]),
                publicKey: publicKey)
        }
    }

    /// Opens and checks a whole file (its signature aside: `verify`). Anything short, damaged, of
    /// another key epoch or another key is errSecDecode with a one-line reason; nothing of the file's
    /// content is in the message.
    public static func open(_ data: [UInt8], key: SyncKey) throws(KeychainError) -> (Header, SyncState) {
        guard data.count <= maximumBytes else { throw KeychainError(.decode, "the sync file is too large") }
        let header = try header(of: data)
        guard header.epoch == key.epoch else {
            throw KeychainError(
                .decode,
                "the sync file was written under sync key \(header.epoch); this device holds key \(key.epoch)")
        }
        guard data.count > headerBytes + AEAD.overhead + Signature.bytes else {
            throw KeychainError(.decode, "the sync file is truncated")
        }
        let end = data.count - Signature.bytes
        let h = Array(data[0..<headerBytes])
        let plain = try key.withFileKey { (k) throws(KeychainError) -> SecretBytes in
            try withBytes(data) { (d) throws(KeychainError) -> SecretBytes in
                try withBytes(h) { (a) throws(KeychainError) -> SecretBytes in
                    try AEAD.openSecret(
                        UnsafeRawBufferPointer(rebasing: d[headerBytes..<end]), key: k, ad: a, what: "the sync file")
                }
            }
        }
        let value = try plain.withUnsafeBytes { (p) throws(KeychainError) -> Value in
            guard p.count >= 4 else { throw KeychainError(.decode, "the sync file is damaged (no length)") }
            var n = 0
            for i in 0..<4 { n = n << 8 | Int(p[i]) }
            guard n <= p.count - 4 else { throw KeychainError(.decode, "the sync file is damaged (bad length)") }
            return try CBOR.decode(
                UnsafeRawBufferPointer(rebasing: p[4..<(4 + n)]), limits: CBOR.Limits(maxDepth: 8, maxCount: 1 << 20),
                secretKeys: ["s"])
        }
        let state = try decode(value)
        for e in state.entries.values where e.stamp.device.count != deviceBytes {
            throw KeychainError(.decode, "the sync file holds a malformed entry")
        }
        return (header, state)
    }

    // MARK: The payload

    static func encode(_ state: SyncState) -> Value {
        let ids = state.entries.keys.sorted { $0.lexicographicallyPrecedes($1) }
        let entries: [Value] = ids.map { id in
            let e = state.entries[id]!
            var m: [String: Value] = [
                "i": .bytes(e.id), "w": .int(Int64(bitPattern: e.stamp.wall)), "c": .int(Int64(e.stamp.counter)),
                "d": .bytes(e.stamp.device), "x": .bool(e.deleted), "a": .map(e.attributes), "s": .secret(e.secret),
            ]
            m["q"] = .int(Int64(bitPattern: e.origin))
            return .map(m)
        }
        let devices: [Value] = state.devices.keys.sorted { $0.lexicographicallyPrecedes($1) }.map { d in
            let p = state.devices[d]!
            var m: [String: Value] = [
                "d": .bytes(d), "q": .int(Int64(bitPattern: p.sequence)), "i": .int(Int64(bitPattern: p.included)),
            ]
            if !p.holds.isEmpty {
                m["h"] = .array(
                    p.holds.keys.sorted { $0.lexicographicallyPrecedes($1) }.map { h in
                        .array([.bytes(h), .int(Int64(bitPattern: p.holds[h]!))])
                    })
            }
            if let l = p.latest {
                m["w"] = .int(Int64(bitPattern: l.wall))
                m["c"] = .int(Int64(l.counter))
            }
            return .map(m)
        }
        let keys: [Value] = state.keys.keys.sorted { $0.lexicographicallyPrecedes($1) }.map { d in
            .array([.bytes(d), .bytes(state.keys[d]!)])
        }
        return .map([
            "entries": .array(entries), "devices": .array(devices), "conflicts": .int(Int64(state.conflictsResolved)),
            "keys": .array(keys),
        ])
    }

    static func decode(_ value: Value) throws(KeychainError) -> SyncState {
        let bad = KeychainError(.decode, "the sync file holds a malformed record")
        guard let m = value.map, let entries = m["entries"]?.array, let devices = m["devices"]?.array,
            let conflicts = m["conflicts"]?.int, let keys = m["keys"]?.array
        else { throw bad }
        var state = SyncState()
        state.conflictsResolved = Int(clamping: conflicts)
        for e in entries {
            guard let f = e.map, let id = f["i"]?.bytes, id.count == 32, let w = f["w"]?.int, let c = f["c"]?.int,
                c >= 0, c <= Int64(UInt32.max), let d = f["d"]?.bytes, d.count == deviceBytes,
                case .bool(let deleted)? = f["x"], let attributes = f["a"]?.map
            else { throw bad }
            let secret: SecretBytes
            switch f["s"] {
            case .secret(let s)?: secret = s
            case .bytes(let b)?: secret = SecretBytes(b)
            default: throw bad
            }
            let origin = f["q"]?.int.map { UInt64(bitPattern: $0) } ?? 0
            let entry = SyncEntry(
                id: id, stamp: SyncStamp(wall: UInt64(bitPattern: w), counter: UInt32(c), device: d), deleted: deleted,
                attributes: attributes, secret: secret, origin: origin)
            guard state.entries[id] == nil else { throw bad }
            state.entries[id] = entry
        }
        for d in devices {
            guard let f = d.map, let id = f["d"]?.bytes, id.count == deviceBytes, let q = f["q"]?.int else { throw bad }
            var p = SyncState.DeviceProgress(sequence: UInt64(bitPattern: q))
            p.included = f["i"]?.int.map { UInt64(bitPattern: $0) } ?? 0
            for h in f["h"]?.array ?? [] {
                guard let pair = h.array, pair.count == 2, let hd = pair[0].bytes, hd.count == deviceBytes,
                    let hq = pair[1].int
                else { throw bad }
                p.holds[hd] = UInt64(bitPattern: hq)
            }
            if let w = f["w"]?.int, let c = f["c"]?.int, c >= 0, c <= Int64(UInt32.max) {
                p.latest = SyncStamp(wall: UInt64(bitPattern: w), counter: UInt32(c), device: id)
            }
            state.devices[id] = p
        }
        for k in keys {
            guard let pair = k.array, pair.count == 2, let d = pair[0].bytes, d.count == deviceBytes,
                let pk = pair[1].bytes, pk.count == Signature.publicKeyBytes
            else { throw bad }
            state.keys[d] = pk
        }
        return state
    }

    static func bigEndian(_ v: UInt64, _ bytes: Int) -> [UInt8] {
        (0..<bytes).map { UInt8(truncatingIfNeeded: v >> (8 * UInt64(bytes - 1 - $0))) }
    }

    static func readBigEndian(_ data: [UInt8], _ offset: Int, _ bytes: Int) -> UInt64 {
        var v: UInt64 = 0
        for i in 0..<bytes { v = v << 8 | UInt64(data[offset + i]) }
        return v
    }
}
