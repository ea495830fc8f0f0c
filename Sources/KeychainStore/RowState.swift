import KeychainCore
import KeychainCrypto

/// The row state: a keyed digest of which version of every row the database should hold, so rows
/// removed, added, swapped or replayed from an older copy of the database are caught when the store
/// opens, instead of reading as an item's older self.
///
/// Each row has a *fingerprint*: keyed BLAKE2b-256 of its ref, class, index digests and the first 24
/// bytes of its three sealed blobs (each blob's whole random nonce, whatever the construction). Every write reseals at least one blob with a fresh random nonce, so a
/// row's fingerprint changes with each version; the AEAD tags bind each nonce to its ciphertext, so a
/// blob cannot keep a current nonce with older contents. The fingerprints are added modulo 2²⁵⁶ (an
/// incremental multiset hash), and the `meta` row `rows` holds the number of rows, a generation
/// counter and a keyed tag over (count, generation, sum). The sum itself is never stored, so copies
/// of the file taken over time show only tags, not differences an attacker could combine.
///
/// At open the store recomputes the sum from every row and checks the tag (`ItemStore.attachRowState`);
/// each write transaction then updates the sum in memory and rewrites the record in the same
/// transaction, so a crash leaves the rows and the record consistent. What this does not catch: the
/// whole database file (record included) replaced by an older copy — that needs state outside the
/// file (docs/security.md §7). Damaged ciphertext keeps its nonce, so it stays a per-item errSecDecode.
public struct RowState: Sendable, Equatable {
    /// The meta-table name the row-state record is stored under.
    public static let metaName = "rows"
    static let recordVersion: UInt8 = 1

    /// Rows in the table.
    public internal(set) var count: Int64
    /// Bumped by every transaction that changes rows (and by an accepted reseal).
    public internal(set) var generation: UInt64
    var sum: Sum256

    /// `version ‖ count (8, LE) ‖ generation (8, LE) ‖ tag (32)`.
    func record(key: SecureBytes) -> [UInt8] {
        [Self.recordVersion] + Self.littleEndian(UInt64(bitPattern: count)) + Self.littleEndian(generation)
            + tag(key: key)
    }

    func tag(key: SecureBytes) -> [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(
                key: $0, domain: 0xE1,
                parts: [Self.littleEndian(UInt64(bitPattern: count)), Self.littleEndian(generation), sum.bytes],
                length: 32)
        }
    }

    /// The fields of a stored record (its tag is checked against a recomputed sum by the caller).
    struct Record {
        var count: Int64
        var generation: UInt64
        var tag: [UInt8]

        init(_ bytes: [UInt8]) throws(KeychainError) {
            guard bytes.count == 49, bytes[0] == RowState.recordVersion else {
                throw KeychainError(
                    .decode,
                    "the database's row-state record is damaged or of an unknown version; if you trust the database, run keychaind --accept-database once"
                )
            }
            count = Int64(bitPattern: RowState.readLittleEndian(bytes[1..<9]))
            generation = RowState.readLittleEndian(bytes[9..<17])
            tag = Array(bytes[17...])
        }
    }

    static func littleEndian(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }

    static func readLittleEndian(_ b: ArraySlice<UInt8>) -> UInt64 {
        var v: UInt64 = 0
        for (i, byte) in b.enumerated() { v |= UInt64(byte) << (8 * i) }
        return v
    }
}

/// A 256-bit unsigned integer, added and subtracted modulo 2²⁵⁶ (little-endian limbs).
struct Sum256: Sendable, Equatable {
    var limbs: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)

    init() {}

    init(_ bytes: [UInt8]) {
        precondition(bytes.count == 32)
        limbs = (
            RowState.readLittleEndian(bytes[0..<8]), RowState.readLittleEndian(bytes[8..<16]),
            RowState.readLittleEndian(bytes[16..<24]), RowState.readLittleEndian(bytes[24..<32])
        )
    }

    init(_ raw: UnsafeRawBufferPointer) {
        precondition(raw.count == 32)
        limbs = (
            UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
            UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self)),
            UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: UInt64.self)),
            UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
        )
    }

    var bytes: [UInt8] {
        RowState.littleEndian(limbs.0) + RowState.littleEndian(limbs.1) + RowState.littleEndian(limbs.2)
            + RowState.littleEndian(limbs.3)
    }

    static func + (a: Sum256, b: Sum256) -> Sum256 {
        var r = Sum256()
        var carry: UInt64 = 0
        func add(_ x: UInt64, _ y: UInt64) -> UInt64 {
            let (s1, o1) = x.addingReportingOverflow(y)
            let (s2, o2) = s1.addingReportingOverflow(carry)
            carry = (o1 ? 1 : 0) + (o2 ? 1 : 0)
            return s2
        }
        r.limbs.0 = add(a.limbs.0, b.limbs.0)
        r.limbs.1 = add(a.limbs.1, b.limbs.1)
        r.limbs.2 = add(a.limbs.2, b.limbs.2)
        r.limbs.3 = add(a.limbs.3, b.limbs.3)
        return r
    }

    /// The additive inverse modulo 2²⁵⁶ (two's complement).
    var negated: Sum256 {
        var inverted = Sum256()
        inverted.limbs = (~limbs.0, ~limbs.1, ~limbs.2, ~limbs.3)
        var one = Sum256()
        one.limbs.0 = 1
        return inverted + one
    }

    static func - (a: Sum256, b: Sum256) -> Sum256 { a + b.negated }

    static func == (a: Sum256, b: Sum256) -> Bool {
        a.limbs.0 == b.limbs.0 && a.limbs.1 == b.limbs.1 && a.limbs.2 == b.limbs.2 && a.limbs.3 == b.limbs.3
    }
}
