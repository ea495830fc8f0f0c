/// A `copy` query's bytes with the values of its service (`svce`) and account (`acct`) cut out: the
/// query's shape. An app that reads many items asks the same query again and again with another
/// service or account each time (one token per user, say); every such query has the same template.
///
/// Found by scanning the encoded map, without decoding it: a map of at most 23 entries whose keys are
/// short text strings and whose values are integers, byte strings, text strings, booleans or null
/// (anything else — arrays, maps, tags, floats — is nil, and the query takes the full path), with
/// `svce` and `acct` each present once as a text string, and no `v_Data` (a query carrying a secret
/// is never remembered, so it has no template to find; and the scan, which copies the query's bytes
/// into a key, must not copy a secret into a buffer that outlives the request). The key is the query's bytes with each of
/// those two values (head and content) replaced by the one byte 0xFF, which never starts a data item
/// the decoder accepts; reading the key from its start, every head says where the next one is, so
/// two queries with the same key differ in nothing but those two values.
///
/// The scan validates nothing else (not the UTF-8 of the values, not the key names): the caller uses
/// a template only to find the compiled form of a query that was decoded, parsed and checked in full
/// before, and reads the two values with `CBOR.text`, as the decoder would.
public struct QueryTemplate: Sendable {
    /// The query's bytes with the service and account values replaced by 0xFF each.
    public let key: [UInt8]
    /// Where the service's text (its content, without the head) is in the query's bytes.
    public let service: Range<Int>
    /// Where the account's text is.
    public let account: Range<Int>
    /// Where in `key` its two 0xFF bytes stand for the values (`match` needs them: other bytes of
    /// the key may be 0xFF too, inside a byte string).
    public let markers: Markers

    /// The positions of the two values' stand-in bytes in a template's key, in order.
    public struct Markers: Sendable, Equatable {
        /// The first one's position.
        public let first: Int
        /// The second one's position.
        public let second: Int
        /// Whether the first is the service's (else the account's).
        public let serviceFirst: Bool
    }

    /// The template of `query` (the encoded map), or nil when it is not of the kind described above.
    public static func scan(_ query: UnsafeRawBufferPointer) -> QueryTemplate? {
        var key = [UInt8](repeating: 0, count: query.count)
        guard let found = key.withUnsafeMutableBytes({ scan(query, into: $0) }) else { return nil }
        key.removeLast(key.count - found.count)
        return QueryTemplate(key: key, service: found.service, account: found.account, markers: found.markers)
    }

    /// Where `query`'s service and account texts are when its template's key is `key` (whose
    /// markers are `markers`, as `scan` found them), else nil: exactly when `scan(query)` would give
    /// this key, without scanning the query or writing its key. The bytes before, between and after
    /// the two values must be the key's, and each value a text string (definite length, within the
    /// query): every CBOR item of those stretches then parses as it did in the query the key was made
    /// from (each lies wholly inside its stretch), so the scan would find the same map, the same two
    /// values and nothing after it. A connection asking many items in one shape matches its last
    /// template so.
    public static func match(_ query: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, markers: Markers) -> (
        service: Range<Int>, account: Range<Int>
    )? {
        let (first, second) = (markers.first, markers.second)
        precondition(0 <= first && first < second && second < key.count, "markers outside the key")
        // Before the first value.
        guard query.count >= first, same(query, 0, key, 0, first) else { return nil }
        guard let one = text(query, at: first) else { return nil }
        // Between the two.
        let middle = second - first - 1
        guard query.count - one.upperBound >= middle, same(query, one.upperBound, key, first + 1, middle) else {
            return nil
        }
        guard let two = text(query, at: one.upperBound + middle) else { return nil }
        // After the second, to the end of both.
        let tail = key.count - second - 1
        guard query.count - two.upperBound == tail, same(query, two.upperBound, key, second + 1, tail) else {
            return nil
        }
        return markers.serviceFirst ? (one, two) : (two, one)
    }

    /// The content of the definite-length text string whose head is at `at` in `bytes`, else nil.
    private static func text(_ bytes: UnsafeRawBufferPointer, at: Int) -> Range<Int>? {
        guard at < bytes.count, bytes[at] >> 5 == 3 else { return nil }
        var next = at + 1
        guard let length = RawCBOR.argument(bytes, bytes[at] & 0x1F, &next), length <= UInt64(bytes.count - next)
        else { return nil }
        return next..<next + Int(length)
    }

    /// `count` bytes of `a` at `i` are those of `b` at `j` (both in range; the caller checked).
    private static func same(
        _ a: UnsafeRawBufferPointer, _ i: Int, _ b: UnsafeRawBufferPointer, _ j: Int, _ count: Int
    ) -> Bool {
        func word(_ k: Int) -> Bool {
            a.loadUnaligned(fromByteOffset: i + k, as: UInt64.self)
                == b.loadUnaligned(fromByteOffset: j + k, as: UInt64.self)
        }
        guard count >= 8 else {
            guard count >= 4 else {
                for k in 0..<count where a[i + k] != b[j + k] { return false }
                return true
            }
            // Four to seven bytes: the first four and the last four (overlapping).
            func half(_ k: Int) -> Bool {
                a.loadUnaligned(fromByteOffset: i + k, as: UInt32.self)
                    == b.loadUnaligned(fromByteOffset: j + k, as: UInt32.self)
            }
            return half(0) && half(count - 4)
        }
        // Eight bytes at a time, the last eight overlapping the word before when the count is not
        // a multiple of eight.
        var k = 0
        while k + 8 < count {
            if !word(k) { return false }
            k += 8
        }
        return word(count - 8)
    }

    /// `scan` with the key written into `key` (room for `query.count` bytes) instead of a new array:
    /// how many bytes of it the key is, and where the two texts are. A connection's memo looks up the
    /// template of nearly every request of a client that reads many items, in one buffer it keeps.
    public static func scan(_ query: UnsafeRawBufferPointer, into key: UnsafeMutableRawBufferPointer) -> (
        count: Int, service: Range<Int>, account: Range<Int>, markers: Markers
    )? {
        let count = query.count
        precondition(key.count >= count, "no room for the key")
        guard count > 0, query[0] >> 5 == 5, query[0] & 0x1F < 24 else { return nil }
        let entries = Int(query[0] & 0x1F)
        var at = 1
        // Each of the two values: where its head starts and where its content starts and ends.
        var service: (head: Int, content: Range<Int>)?
        var account: (head: Int, content: Range<Int>)?
        for _ in 0..<entries {
            // The key: a text string shorter than 24 bytes.
            guard at < count, query[at] >> 5 == 3 else { return nil }
            let keyLength = Int(query[at] & 0x1F)
            guard keyLength < 24, count - at - 1 >= keyLength else { return nil }
            let keyStart = at + 1
            if keyLength == 6 && same(query, keyStart, "v_Data") { return nil }
            at = keyStart + keyLength
            // The value.
            guard at < count else { return nil }
            let head = at
            let major = query[at] >> 5
            let info = query[at] & 0x1F
            at += 1
            // (No indefinite lengths; nor break, reserved or simple values of major 7, refused below anyway.)
            guard let argument = RawCBOR.argument(query, info, &at) else { return nil }
            switch major {
            case 0, 1:
                break
            case 2, 3:
                guard argument <= UInt64(count - at) else { return nil }
                let content = at..<at + Int(argument)
                at = content.upperBound
                if major == 3 && keyLength == 4 {
                    if same(query, keyStart, "svce") {
                        guard service == nil else { return nil }
                        service = (head, content)
                    } else if same(query, keyStart, "acct") {
                        guard account == nil else { return nil }
                        account = (head, content)
                    }
                }
            case 7:
                // false, true, null only.
                guard info == 20 || info == 21 || info == 22 else { return nil }
            default:
                return nil
            }
        }
        guard at == count, let service, let account else { return nil }
        // The key: every byte but the two values, each value one 0xFF.
        let (first, second) = service.head < account.head ? (service, account) : (account, service)
        var written = 0
        func append(_ range: Range<Int>) {
            UnsafeMutableRawBufferPointer(rebasing: key[written..<written + range.count])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: query[range]))
            written += range.count
        }
        append(0..<first.head)
        let firstMarker = written
        key[written] = 0xFF
        written += 1
        append(first.content.upperBound..<second.head)
        let secondMarker = written
        key[written] = 0xFF
        written += 1
        append(second.content.upperBound..<count)
        let markers = Markers(first: firstMarker, second: secondMarker, serviceFirst: service.head < account.head)
        return (written, service.content, account.content, markers)
    }

    /// The bytes at `at` are those of `name` (ASCII; the caller has checked that they are in `bytes`).
    private static func same(_ bytes: UnsafeRawBufferPointer, _ at: Int, _ name: StaticString) -> Bool {
        let n = name.utf8Start
        for i in 0..<name.utf8CodeUnitCount where bytes[at + i] != n[i] { return false }
        return true
    }
}
