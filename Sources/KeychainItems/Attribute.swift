import KeychainCore
import KeychainCrypto

/// The attributes of every item class (KeychainCore/ItemClass.swift, docs/protocol.md §7), their
/// wire keys, and Apple's input coercions. Which class has which attribute, and each one's type, is
/// the class descriptions' data; this enum names them for the code that reads them.
///
/// Each input value is normalised once into the form it is stored and returned in:
/// strings stay text or bytes as written (Apple returns "the type it was written with"), numbers become
/// `.int`, flags become `.bool`, dates stay `.date`.
enum Attribute: String, CaseIterable, Sendable {
    case service = "svce"
    case account = "acct"
    case accessGroup = "agrp"
    case accessible = "pdmn"
    case label = "labl"
    case description = "desc"
    case comment = "icmt"
    case generic = "gena"
    case creator = "crtr"
    case type = "type"
    case isInvisible = "invi"
    case isNegative = "nega"
    case synchronizable = "sync"
    case creationDate = "cdat"
    case modificationDate = "mdat"
    // Internet passwords.
    case server = "srvr"
    case `protocol` = "ptcl"
    case authenticationType = "atyp"
    case port = "port"
    case path = "path"
    case securityDomain = "sdmn"

    typealias Kind = ItemClass.AttributeType

    /// Each attribute's type: the class descriptions' (ItemClass.attributes), spelled as a switch so
    /// that the parse and the per-row attribute check pay no lookup for it;
    /// `ItemClassDescriptions.attributeTypesAreTheClassDescriptions` checks that the two agree.
    var kind: Kind {
        switch self {
        case .service, .account, .label, .description, .comment, .server, .path, .securityDomain: return .stringOrData
        case .accessGroup, .protocol, .authenticationType: return .text
        case .accessible: return .accessibility
        case .generic: return .data
        case .creator, .type, .port: return .uint32
        case .isInvisible, .isNegative, .synchronizable: return .flag
        case .creationDate, .modificationDate: return .date
        }
    }

    /// The attribute named `key` if `itemClass` has it.
    init?(_ key: String, of itemClass: ItemClass) {
        guard let attribute = Attribute(rawValue: key), itemClass.has(key) else { return nil }
        self = attribute
    }

    /// Part of Apple's uniqueness key of generic passwords (class, acct, svce, agrp, sync).
    var isKey: Bool { ItemClass.genericPassword.isUnique(rawValue) }

    /// The stored form of an input value, or errSecParam naming the key (never the value).
    func normalize(_ value: Value) throws(KeychainError) -> Value {
        let key = rawValue
        switch kind {
        case .stringOrData:
            switch value {
            case .text, .bytes: return value
            default: throw .param("\(key) must be a string or data, not \(value.kindName)")
            }
        case .text:
            guard case .text(let text) = value else { throw .param("\(key) must be a string, not \(value.kindName)") }
            if self == .accessGroup && text.isEmpty { throw .param("\(key) must not be empty") }
            return value
        case .accessibility:
            guard case .text(let code) = value else { throw .param("\(key) must be a string, not \(value.kindName)") }
            guard ProtectionClass(code: code) != nil else {
                throw .param("\(key) must be one of ak, ck, dk, aku, cku, dku, akpu")
            }
            return value
        case .data:
            switch value {
            case .bytes, .text: return value
            default: throw .param("\(key) must be data, not \(value.kindName)")
            }
        case .uint32:
            switch value {
            case .int(let n) where n >= 0 && n <= Int64(UInt32.max): return .int(n)
            case .bool(let b): return .int(b ? 1 : 0)
            case .text(let s):
                if let n = UInt32(s) { return .int(Int64(n)) }
                throw .param("\(key) must be an unsigned 32-bit number")
            default: throw .param("\(key) must be an unsigned 32-bit number, not \(value.kindName)")
            }
        case .flag:
            switch value {
            case .bool: return value
            case .int(let n): return .bool(n != 0)
            case .text("0"): return .bool(false)
            case .text("1"): return .bool(true)
            default: throw .param("\(key) must be a boolean, not \(value.kindName)")
            }
        case .date:
            guard case .date(let seconds) = value else { throw .param("\(key) must be a date, not \(value.kindName)") }
            // Years 0001…9999 (as NSDate can show): an absurd date must not break clients that format it.
            guard seconds >= -62_135_596_800, seconds <= 253_402_300_799 else {
                throw .param("\(key) must be a date between the years 1 and 9999")
            }
            return value
        }
    }

    /// Whether a stored value matches a (normalised) query value: byte-exact, case-sensitive.
    func matches(stored: Value?, query: Value) -> Bool {
        guard let stored else { return false }
        switch kind {
        case .stringOrData, .data:
            guard let a = Self.bytes(of: stored), let b = Self.bytes(of: query) else { return false }
            return a == b
        default:
            // Text compares byte for byte (UTF-8), as the blind indexes do, never by Unicode equivalence.
            if case .text(let a) = stored, case .text(let b) = query { return a.utf8.elementsEqual(b.utf8) }
            return stored == query
        }
    }

    /// The bytes a blind index is computed over: UTF-8 for text, raw for data.
    static func bytes(of value: Value) -> [UInt8]? {
        switch value {
        case .text(let s): return Array(s.utf8)
        case .bytes(let b): return b
        default: return nil
        }
    }

    /// `bytes(of:)` handed to `body` in place, without copying a string's UTF-8 into an array
    /// (the copy path hashes the query's service and account this way); nil for other values.
    static func withBytes<R>(of value: Value, _ body: (UnsafeRawBufferPointer) -> R) -> R? {
        switch value {
        case .text(var s): return s.withUTF8 { body(UnsafeRawBufferPointer($0)) }
        case .bytes(let b): return b.withUnsafeBytes(body)
        default: return nil
        }
    }
}

/// A key as it may appear in an error message: printable ASCII, bounded length.
func printableKey(_ key: String) -> String {
    let clean = key.unicodeScalars.prefix(32).map {
        $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?"
    }
    return String(clean) + (key.unicodeScalars.count > 32 ? "…" : "")
}
