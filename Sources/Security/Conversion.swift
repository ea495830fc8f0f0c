import Foundation
internal import KeychainCore
import KeychainSystem

/// Between SecItem dictionaries (`[String: Any]` bridged to `NSDictionary`) and the wire's `Value`s.
///
/// Inbound, known keys are converted to their wire type the way Apple's client coerces them
/// (a boolean key takes `Bool`, `kCFBooleanTrue`, or a number; `crtr`/`type` take any integer or
/// `NSNumber`; `v_Data` takes only `Data`; the blob attributes `svce`, `acct`, `labl`, `desc`, `icmt`
/// and `gena` take a `String` or `Data` and keep which one it was); unknown keys are converted by their
/// Swift type and left for the daemon to judge. Anything that has no wire form is `errSecParam`,
/// naming the key, and so are the Apple keys whose values never have one (`kSecValueRef`,
/// `kSecMatchItemList`, `kSecMatchSearchList`, `kSecAttrPersistentReference`).
///
/// Outbound, results take the types Apple's client hands back: `Data` for bytes (so a blob attribute
/// written as `Data` reads back as `Data`, one written as a `String` as a `String`), `String` for text,
/// `Date` for dates, and `NSNumber` for booleans (0/1) and integers — an `NSNumber` answers both
/// `as? Bool` and `as? Int`, as a CFNumber does on Apple platforms.
enum Conversion {
    /// The wire keys of every class's attributes of `types` (KeychainCore/ItemClass.swift).
    private static func attributeKeys(_ types: ItemClass.AttributeType...) -> Set<String> {
        Set(ItemClass.all.flatMap(\.attributes).filter { types.contains($0.type) }.map(\.key))
    }
    private static let flagKeys = attributeKeys(.flag)
    private static let boolKeys = flagKeys.union([
        "m_CaseInsensitive", "r_Data", "r_Attributes", "r_PersistentRef", "r_Ref",
    ])
    /// Attributes that are text only (`agrp`, `pdmn`, `ptcl`, `atyp`).
    private static let textAttributeKeys = attributeKeys(.text, .accessibility)
    private static let textKeys = textAttributeKeys.union(["class"])
    /// Apple's blob columns: a `String` or `Data`, stored and returned as written, matched by bytes.
    static let blobKeys = attributeKeys(.stringOrData, .data)
    /// Numbers: `crtr`, `type`, `port`.
    private static let integerKeys = attributeKeys(.uint32)
    private static let dateKeys = attributeKeys(.date)

    /// Apple keys that keychaind refuses whatever their value (`errSecParam`, as the daemon answers), and
    /// why: refused here, because their values (item references, keychain lists) have no wire form.
    private static let unsupportedKeys: [String: String] = [
        "v_Ref": "generic passwords have no reference objects; use kSecValuePersistentRef",
        "m_ItemList": "keychaind has no item references to search among",
        "m_SearchList": "keychaind has a single keychain",
        "persistref": "a query names an item with kSecValuePersistentRef",
    ]

    /// Why a kSecAttrAccessControl value that is no `SecAccessControl` is refused.
    private static let accessControlRefused =
        "kSecAttrAccessControl (\"accc\") must be a SecAccessControl made by SecAccessControlCreateWithFlags"

    /// A SecItem dictionary as a wire map. `what` names the argument in error messages.
    static func map(_ dictionary: NSDictionary, what: String) throws(KeychainError) -> [String: Value] {
        var out: [String: Value] = [:]
        for (k, v) in dictionary {
            guard let key = k as? String else {
                throw .param("\(what) has a key of type \(typeName(k)); keys must be strings such as kSecAttrService")
            }
            // The daemon reads whether it may ask (kSecUseAuthenticationUI, kSecUseNoAuthenticationUI);
            // the other LocalAuthentication keys are stripped as Apple's client does; `nleg` is a
            // no-op; generic passwords have no reference type, so kSecReturnRef returns nothing.
            if (key.hasPrefix("u_") && key != "u_AuthUI" && key != "u_NoAuthUI") || key == "nleg" || key == "r_Ref" {
                continue
            }
            if key == "accc" {
                guard let control = v as? SecAccessControl else { throw .param(accessControlRefused) }
                if dictionary.object(forKey: "pdmn") != nil {
                    throw .param("kSecAttrAccessControl and kSecAttrAccessible cannot both be given")
                }
                if control.flags.isEmpty {
                    // No constraints: only a protection class, which is what kSecAttrAccessible says.
                    guard let protection = control.protection else {
                        throw .param("kSecAttrAccessControl (\"accc\") names no protection class")
                    }
                    out["pdmn"] = .text(protection)
                } else {
                    // Constraints: the daemon judges them (user presence and the passcode are asked
                    // for; biometry, a watch, an application password are errSecUnimplemented).
                    var wire: [String: Value] = ["flags": .int(Int64(truncatingIfNeeded: control.flags.rawValue))]
                    if let protection = control.protection { wire["pdmn"] = .text(protection) }
                    out["accc"] = .map(wire)
                }
                continue
            }
            if let why = unsupportedKeys[key] { throw .param("\(displayName(key)) is not supported: \(why)") }
            out[key] = try value(v, forKey: key)
        }
        return out
    }

    /// One dictionary value as a wire value.
    static func value(_ v: Any, forKey key: String) throws(KeychainError) -> Value {
        func wrong(_ expected: String) -> KeychainError {
            .param("\(displayName(key)) must be \(expected), not \(typeName(v))")
        }
        switch key {
        case "v_Data":
            // Straight from the app's Data into wiping storage: the request frame built from it is
            // zeroed after it is written, and no array copy is left behind.
            guard let s = secret(v) else { throw wrong("Data") }
            return .secret(s)
        case "v_PersistentRef":
            guard let b = bytes(v) else { throw wrong("Data") }
            return .bytes(b)
        case _ where blobKeys.contains(key):
            if let s = text(v) { return .text(s) }
            if let b = bytes(v) { return .bytes(b) }
            throw wrong("a String or Data")
        case "sync":
            if let s = text(v), s == "syna" { return .text(s) }
            guard let b = bool(v) else { throw wrong("a Bool or kSecAttrSynchronizableAny") }
            return .bool(b)
        case "m_Limit":
            if let s = text(v) { return .text(s) }
            guard let i = integer(v) else { throw wrong("kSecMatchLimitOne, kSecMatchLimitAll or a number") }
            return .int(i)
        case _ where boolKeys.contains(key):
            guard let b = bool(v) else { throw wrong("a Bool (kCFBooleanTrue / kCFBooleanFalse)") }
            return .bool(b)
        case _ where textKeys.contains(key):
            guard let s = text(v) else { throw wrong("a String") }
            return .text(s)
        case _ where integerKeys.contains(key):
            guard let i = integer(v) else { throw wrong("an integer") }
            return .int(i)
        case _ where dateKeys.contains(key):
            guard let d = v as? Date else { throw wrong("a Date") }
            return .date(d.timeIntervalSince1970)
        default:
            return try generic(v, key: key)
        }
    }

    /// An unknown key's value, by its type (the daemon decides whether the key is acceptable).
    private static func generic(_ v: Any, key: String) throws(KeychainError) -> Value {
        if type(of: v) == Bool.self { return .bool(v as! Bool) }
        if let n = number(v) {
            let t = n.objCType.pointee
            if t == CChar(UInt8(ascii: "c")) || t == CChar(UInt8(ascii: "B")) { return .bool(n.boolValue) }
            if t == CChar(UInt8(ascii: "d")) || t == CChar(UInt8(ascii: "f")) { return .float(n.doubleValue) }
            return .int(n.int64Value)
        }
        if let s = text(v) { return .text(s) }
        if let b = bytes(v) { return .bytes(b) }
        if let d = v as? Date { return .date(d.timeIntervalSince1970) }
        if let i = v as? any BinaryInteger, let i64 = Int64(exactly: i) { return .int(i64) }
        if let d = v as? Double { return .float(d) }
        if let f = v as? Float { return .float(Double(f)) }
        throw .param("\(displayName(key)) has a value of type \(typeName(v)), which keychaind cannot store")
    }

    // MARK: Coercions

    private static func number(_ v: Any) -> NSNumber? {
        guard type(of: v) is NSNumber.Type else { return nil }
        return v as? NSNumber
    }

    static func text(_ v: Any) -> String? {
        if number(v) != nil || type(of: v) == Bool.self { return nil }
        if let s = v as? String { return s }
        if let s = v as? Substring { return String(s) }
        return nil
    }

    static func secret(_ v: Any) -> SecretBytes? {
        if let d = v as? Data { return SecretBytes(d) }
        if let d = v as? NSData { return SecretBytes(d as Data) }
        if let b = v as? [UInt8] { return SecretBytes(b) }
        return nil
    }

    static func bytes(_ v: Any) -> [UInt8]? {
        if let d = v as? Data { return [UInt8](d) }
        if let d = v as? NSData { return [UInt8](d as Data) }
        if let b = v as? [UInt8] { return b }
        return nil
    }

    static func bool(_ v: Any) -> Bool? {
        if type(of: v) == Bool.self { return (v as! Bool) }
        if let n = number(v) { return n.int64Value != 0 || n.doubleValue != 0 }
        if let i = v as? any BinaryInteger { return i.words.contains { $0 != 0 } }
        if let s = text(v) {
            switch s {
            case "1", "true", "YES", "yes": return true
            case "0", "false", "NO", "no": return false
            default: return nil
            }
        }
        return nil
    }

    static func integer(_ v: Any) -> Int64? {
        if type(of: v) == Bool.self { return (v as! Bool) ? 1 : 0 }
        if let n = number(v) {
            let d = n.doubleValue
            guard d.rounded() == d else { return nil }
            return n.int64Value
        }
        if let i = v as? any BinaryInteger { return Int64(exactly: i) }
        if let s = text(v) { return Int64(s) }
        return nil
    }

    // MARK: Results

    /// The result of `op` for `query`, in the one shape Apple's call hands back for it (protocol.md §9),
    /// or nil when the query asked for none. Whatever arrives in another shape — only a broken daemon
    /// or a process serving the socket in its place sends that — is errSecDecode, never an object of
    /// another type for the app to cast (`as! Data` would trap). Attribute keys the library does not
    /// know are left out, as Apple's dictionaries hold only attributes.
    static func result(_ value: Value?, for query: [String: Value], op: KeychainCore.Operation) throws(KeychainError)
        -> AnyObject?
    {
        let data = query["r_Data"] == .bool(true)
        let attributes = query["r_Attributes"] == .bool(true)
        let reference = query["r_PersistentRef"] == .bool(true)
        guard data || attributes || reference else { return nil }
        let bad = KeychainError(.decode, "keychaind answered in a shape the query did not ask for")
        guard let value else { throw bad }
        func bytes(_ v: Value?) -> Bool {
            switch v {
            case .bytes?, .secret?: return true
            default: return false
            }
        }
        func item(_ v: Value) throws(KeychainError) -> Value {
            if !attributes && (data != reference) {
                guard bytes(v) else { throw bad }
                return v
            }
            guard case .map(let m) = v else { throw bad }
            var out: [String: Value] = [:]
            if data {
                guard bytes(m["v_Data"]) else { throw bad }
                out["v_Data"] = m["v_Data"]
            }
            if reference {
                guard bytes(m["v_PersistentRef"]) else { throw bad }
                out["v_PersistentRef"] = m["v_PersistentRef"]
            }
            if attributes {
                for (key, v) in m where key != "v_Data" && key != "v_PersistentRef" {
                    guard let fits = attributeFits(key, v) else { continue }  // not an attribute: left out
                    guard fits else { throw bad }
                    out[key] = v
                }
            }
            return .map(out)
        }
        let many: Bool
        switch query["m_Limit"] {
        case .text("m_LimitAll")?: many = op == .copy
        case .int(let n)?: many = op == .copy && n > 1
        default: many = false
        }
        if many {
            guard case .array(let items) = value, !items.isEmpty else { throw bad }
            var checked: [Value] = []
            checked.reserveCapacity(items.count)
            for v in items { checked.append(try item(v)) }
            return object(.array(checked))
        }
        return object(try item(value))
    }

    /// Whether `value` has the type attribute `key` is returned in; nil when `key` is no attribute.
    private static func attributeFits(_ key: String, _ value: Value) -> Bool? {
        switch key {
        case _ where blobKeys.contains(key):
            switch value {
            case .text, .bytes: return true
            default: return false
            }
        case _ where textAttributeKeys.contains(key):
            if case .text = value { return true }
            return false
        case _ where flagKeys.contains(key):
            if case .bool = value { return true }
            return false
        case _ where integerKeys.contains(key):
            if case .int(let n) = value { return n >= 0 && n <= Int64(UInt32.max) }
            return false
        case _ where dateKeys.contains(key):
            if case .date = value { return true }
            return false
        case "accc":
            if case .map(let m) = value, case .int? = m["flags"] { return true }
            return false
        default: return nil
        }
    }

    /// A result as Apple hands it back in `CFTypeRef`: `NSData`, `NSDictionary`, `NSArray`, …
    static func object(_ v: Value) -> AnyObject {
        switch v {
        case .bytes(let b): return NSData(bytes: b, length: b.count)
        case .secret(let s): return s.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) }
        case .map(let m): return dictionary(m) as NSDictionary
        case .array(let a): return a.map(swiftValue) as NSArray
        case .text(let s): return s as NSString
        default: return swiftValue(v) as AnyObject
        }
    }

    /// An attributes map as `[String: Any]`.
    static func dictionary(_ m: [String: Value]) -> [String: Any] {
        var out: [String: Any] = [:]
        for (k, v) in m { out[k] = swiftValue(v) }
        // An item's access control comes back as the object it was made as, as on Apple platforms.
        if case .map(let control)? = m["accc"], case .int(let flags)? = control["flags"] {
            out["accc"] = SecAccessControl(
                protection: m["pdmn"]?.text,
                flags: SecAccessControlCreateFlags(rawValue: CFOptionFlags(truncatingIfNeeded: flags)))
        }
        return out
    }

    static func swiftValue(_ v: Value) -> Any {
        switch v {
        case .int(let i): return NSNumber(value: Int(truncatingIfNeeded: i))
        case .bytes(let b): return Data(b)
        case .secret(let s): return s.withUnsafeBytes { Data($0) }
        case .text(let s): return s
        case .array(let a): return a.map(swiftValue)
        case .map(let m): return dictionary(m)
        case .bool(let b): return NSNumber(value: b ? 1 : 0)
        case .float(let d): return d
        case .date(let d): return Date(timeIntervalSince1970: d)
        case .null: return NSNull()
        }
    }

    // MARK: Messages

    private static let constantNames: [String: String] = Dictionary(
        ItemClass.all.flatMap(\.attributes).map { ($0.key, $0.constant) }, uniquingKeysWith: { a, _ in a }
    ).merging([
        "class": "kSecClass", "v_Data": "kSecValueData",
        "v_PersistentRef": "kSecValuePersistentRef", "m_Limit": "kSecMatchLimit",
        "m_CaseInsensitive": "kSecMatchCaseInsensitive", "r_Data": "kSecReturnData",
        "r_Attributes": "kSecReturnAttributes", "r_PersistentRef": "kSecReturnPersistentRef",
        "v_Ref": "kSecValueRef", "m_ItemList": "kSecMatchItemList", "m_SearchList": "kSecMatchSearchList",
        "persistref": "kSecAttrPersistentReference",
    ]) { a, _ in a }

    /// `kSecValueData ("v_Data")`, or the quoted key when it has no constant.
    static func displayName(_ key: String) -> String {
        if let c = constantNames[key] { return "\(c) (\"\(key)\")" }
        return "key \"\(key)\""
    }

    static func typeName(_ v: Any) -> String {
        let t = type(of: v)
        if t is NSNumber.Type { return "NSNumber" }
        if t is NSString.Type { return "String" }
        if t is NSData.Type { return "Data" }
        return String(describing: t)
    }
}
