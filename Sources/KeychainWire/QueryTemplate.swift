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

    /// The template of `query` (the encoded map), or nil when it is not of the kind described above.
    public static func scan(_ query: UnsafeRawBufferPointer) -> QueryTemplate? {
        var key = [UInt8](repeating: 0, count: query.count)
        guard let found = key.withUnsafeMutableBytes({ scan(query, into: $0) }) else { return nil }
        key.removeLast(key.count - found.count)
        return QueryTemplate(key: key, service: found.service, account: found.account)
    }

    /// `scan` with the key written into `key` (room for `query.count` bytes) instead of a new array:
    /// how many bytes of it the key is, and where the two texts are. A connection's memo looks up the
    /// template of nearly every request of a client that reads many items, in one buffer it keeps.
    public static func scan(_ query: UnsafeRawBufferPointer, into key: UnsafeMutableRawBufferPointer) -> (
        count: Int, service: Range<Int>, account: Range<Int>
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
        key[written] = 0xFF
        written += 1
        append(first.content.upperBound..<second.head)
        key[written] = 0xFF
        written += 1
        append(second.content.upperBound..<count)
        return (written, service.content, account.content)
    }

    /// The bytes at `at` are those of `name` (ASCII; the caller has checked that they are in `bytes`).
    private static func same(_ bytes: UnsafeRawBufferPointer, _ at: Int, _ name: StaticString) -> Bool {
        let n = name.utf8Start
        for i in 0..<name.utf8CodeUnitCount where bytes[at + i] != n[i] { return false }
        return true
    }
}
