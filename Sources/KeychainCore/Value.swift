public import KeychainSystem

/// The data model shared by the wire protocol, the item store and the clients: the subset of CBOR
/// (RFC 8949) that keychaind speaks.
///
/// Maps always have text keys (the protocol never uses other keys) and keep no duplicate keys.
/// Integers are signed 64-bit; dates are seconds since the Unix epoch (CBOR tag 1).
///
/// `secret` is a byte string that holds a secret (`v_Data`, a passphrase): on the wire it is a
/// byte string like `bytes`, in memory it lives in wiping storage (`SecretBytes`).
public enum Value: Hashable, Sendable {
    case int(Int64)
    case bytes([UInt8])
    /// A byte string kept in memory that is zeroed when freed.
    case secret(SecretBytes)
    case text(String)
    case array([Value])
    case map([String: Value])
    case bool(Bool)
    case float(Double)
    case date(Double)
    case null
}

extension Value {
    /// The integer, when this is `.int`; nil for every other case.
    public var int: Int64? {
        if case .int(let v) = self { return v }
        return nil
    }
    /// The string, when this is `.text`; nil for every other case.
    public var text: String? {
        if case .text(let v) = self { return v }
        return nil
    }
    /// The bytes, when this is `.bytes`; nil for `.secret` (use `secretBytes`) and every other case.
    public var bytes: [UInt8]? {
        if case .bytes(let v) = self { return v }
        return nil
    }
    /// A byte string that is not a secret but may arrive marked as one (a response's `result` holds
    /// secrets and persistent references alike): `bytes` as it is, `secret` copied out (a copy nothing
    /// wipes). Never for a secret.
    public var plainBytes: [UInt8]? {
        switch self {
        case .bytes(let b): return b
        case .secret(let s): return s.unprotectedArray
        default: return nil
        }
    }
    /// A byte string as wiping storage: `secret` as it is, `bytes` copied into it.
    public var secretBytes: SecretBytes? {
        switch self {
        case .secret(let s): return s
        case .bytes(let b): return SecretBytes(b)
        default: return nil
        }
    }
    /// The boolean, when this is `.bool`; nil for every other case.
    public var bool: Bool? {
        if case .bool(let v) = self { return v }
        return nil
    }
    /// The map, when this is `.map`; nil for every other case.
    public var map: [String: Value]? {
        if case .map(let v) = self { return v }
        return nil
    }
    /// The elements, when this is `.array`; nil for every other case.
    public var array: [Value]? {
        if case .array(let v) = self { return v }
        return nil
    }
    /// Seconds since the Unix epoch, when this is `.date`; nil for every other case.
    public var date: Double? {
        if case .date(let v) = self { return v }
        return nil
    }

    /// A short name of the value's kind for error messages ("text", "bytes", …) — never its content.
    public var kindName: String {
        switch self {
        case .int: return "integer"
        case .bytes, .secret: return "bytes"
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

extension Value {
    /// `bytes` and `secret` are the same CBOR byte string: they are equal when their bytes are (a
    /// secret compared in constant time). Every other case compares as usual.
    public static func == (a: Value, b: Value) -> Bool {
        switch (a, b) {
        case (.int(let x), .int(let y)): return x == y
        case (.bytes(let x), .bytes(let y)): return x == y
        case (.secret(let x), .secret(let y)): return x == y
        case (.bytes(let x), .secret(let y)), (.secret(let y), .bytes(let x)): return SecretBytes(x) == y
        case (.text(let x), .text(let y)): return x == y
        case (.array(let x), .array(let y)): return x == y
        case (.map(let x), .map(let y)): return x == y
        case (.bool(let x), .bool(let y)): return x == y
        case (.float(let x), .float(let y)): return x == y
        case (.date(let x), .date(let y)): return x == y
        case (.null, .null): return true
        default: return false
        }
    }

    /// Byte strings hash by length only (a secret's content stays out of hash tables, and `bytes`
    /// must hash like an equal `secret`).
    public func hash(into hasher: inout Hasher) {
        switch self {
        case .int(let v):
            hasher.combine(0)
            hasher.combine(v)
        case .bytes(let b):
            hasher.combine(1)
            hasher.combine(b.count)
        case .secret(let s):
            hasher.combine(1)
            hasher.combine(s.count)
        case .text(let t):
            hasher.combine(2)
            hasher.combine(t)
        case .array(let a):
            hasher.combine(3)
            hasher.combine(a)
        case .map(let m):
            hasher.combine(4)
            hasher.combine(m)
        case .bool(let b):
            hasher.combine(5)
            hasher.combine(b)
        case .float(let d):
            hasher.combine(6)
            hasher.combine(d)
        case .date(let d):
            hasher.combine(7)
            hasher.combine(d)
        case .null: hasher.combine(8)
        }
    }
}

extension Value: CustomStringConvertible, CustomDebugStringConvertible {
    /// Shows the shape only: byte strings and text are never printed, because they may be secrets.
    public var description: String {
        switch self {
        case .int(let v): return "\(v)"
        case .bytes(let b): return "<\(b.count) bytes>"
        case .secret(let s): return "<\(s.count) bytes>"
        case .text(let t): return "<text \(t.utf8.count) bytes>"
        case .array(let a): return "[\(a.map(\.description).joined(separator: ", "))]"
        case .map(let m): return "{\(m.keys.sorted().map { "\($0): \(m[$0]!.description)" }.joined(separator: ", "))}"
        case .bool(let b): return b ? "true" : "false"
        case .float(let d): return "\(d)"
        case .date(let d): return "date(\(d))"
        case .null: return "null"
        }
    }
    /// The same shape-only text as `description`: byte strings and text are never shown.
    public var debugDescription: String { description }
}

extension Value: CustomReflectable {
    /// No children: `dump`, debuggers and test frameworks print the shape-only `description`, never
    /// the bytes or text inside (a default mirror would show every element of `.bytes`).
    public var customMirror: Mirror { Mirror(self, children: [:]) }
}
