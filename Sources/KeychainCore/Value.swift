/// The data model shared by the wire protocol, the item store and the clients: the subset of CBOR
/// (RFC 8949) that keychaind speaks.
///
/// Maps always have text keys (the protocol never uses other keys) and keep no duplicate keys.
/// Integers are signed 64-bit; dates are seconds since the Unix epoch (CBOR tag 1).
public enum Value: Hashable, Sendable {
    case int(Int64)
    case bytes([UInt8])
    case text(String)
    case array([Value])
    case map([String: Value])
    case bool(Bool)
    case float(Double)
    case date(Double)
    case null
}

extension Value {
    public var int: Int64? { if case .int(let v) = self { return v }; return nil }
    public var text: String? { if case .text(let v) = self { return v }; return nil }
    public var bytes: [UInt8]? { if case .bytes(let v) = self { return v }; return nil }
    public var bool: Bool? { if case .bool(let v) = self { return v }; return nil }
    public var map: [String: Value]? { if case .map(let v) = self { return v }; return nil }
    public var array: [Value]? { if case .array(let v) = self { return v }; return nil }
    public var date: Double? { if case .date(let v) = self { return v }; return nil }

    /// A short name of the value's kind for error messages ("text", "bytes", …) — never its content.
    public var kindName: String {
        switch self {
        case .int: return "integer"
        case .bytes: return "bytes"
        case .text: return "text"
        case .array: return "array"
        case .map: return "map"
        case .bool: return "bool"
        case .float: return "float"
        case .date: return "date"
        case .null: return "null"
        }
    }
}

extension Value: CustomStringConvertible, CustomDebugStringConvertible {
    /// Shows the shape only: byte strings and text are never printed, because they may be secrets.
    public var description: String {
        switch self {
        case .int(let v): return "\(v)"
        case .bytes(let b): return "<\(b.count) bytes>"
        case .text(let t): return "<text \(t.utf8.count) bytes>"
        case .array(let a): return "[\(a.map(\.description).joined(separator: ", "))]"
        case .map(let m): return "{\(m.keys.sorted().map { "\($0): \(m[$0]!.description)" }.joined(separator: ", "))}"
        case .bool(let b): return b ? "true" : "false"
        case .float(let d): return "\(d)"
        case .date(let d): return "date(\(d))"
        case .null: return "null"
        }
    }
    public var debugDescription: String { description }
}
