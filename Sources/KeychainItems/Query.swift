import KeychainCore
import KeychainCrypto
import KeychainSystem

enum MatchLimit: Equatable {
    case one
    case all
    case count(Int)

    /// Apple returns an array for `all` and for N > 1, a single value for `one` and 1.
    var returnsArray: Bool {
        switch self {
        case .one, .count(1): return false
        default: return true
        }
    }

    var maximum: Int {
        switch self {
        case .one: return 1
        case .all: return Int.max
        case .count(let n): return n
        }
    }
}

enum SyncFilter: Equatable {
    case no, yes, any

    func accepts(_ value: Bool) -> Bool {
        switch self {
        case .no: return !value
        case .yes: return value
        case .any: return true
        }
    }
}

struct ReturnFlags: Equatable {
    var data = false
    var attributes = false
    var persistentRef = false

    var any: Bool { data || attributes || persistentRef }
    var count: Int { (data ? 1 : 0) + (attributes ? 1 : 0) + (persistentRef ? 1 : 0) }
}

/// A parsed SecItem dictionary: every key checked for name and type, values normalised.
struct ParsedQuery {
    /// Attribute filters (add: the attributes to store), normalised. Never holds `sync`.
    var attributes: [Attribute: Value] = [:]
    /// The implicit `sync = 0` unless `sync` or `syna` is given.
    var sync: SyncFilter = .no
    var syncGiven = false
    /// The item id named by `v_PersistentRef`.
    var persistentRef: [UInt8]?
    /// `v_Data`.
    var secret: SecretBytes?
    var limit: MatchLimit = .one
    var returns = ReturnFlags()

    /// The item class the query names (or its persistent reference's).
    var itemClass: ItemClass = .genericPassword
    /// `accc` (kSecAttrAccessControl) of an add.
    var accessControl: AccessControl?

    /// Parses `dictionary` under the rules of `operation` (docs/protocol.md §8).
    init(_ dictionary: [String: Value], for operation: Operation) throws(KeychainError) {
        var classGiven = false
        // The class first: which attributes the other keys may name depends on it, and a class
        // keychaind does not store is errSecNoSuchClass rather than errSecNoSuchAttr for its attributes.
        // (A class that is no string is reported in key order, below.)
        if case .text(let name)? = dictionary["class"] {
            guard let named = ItemClass(code: name) else {
                throw KeychainError(
                    .noSuchClass,
                    "class must be \(ItemClass.codeList) (\(ItemClass.all.map(\.constant).joined(separator: ", "))); other item classes are not supported"
                )
            }
            itemClass = named
            classGiven = true
        }
        // In key order, not the dictionary's (which differs between two decodings of the same bytes),
        // so a query with more than one fault gets the same error every time it is sent.
        for (key, value) in dictionary.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
            switch key {
            case "class":
                guard case .text = value else { throw .param("class must be a string, not \(value.kindName)") }
            case "v_Data":
                guard let b = value.secretBytes else { throw .param("v_Data must be data, not \(value.kindName)") }
                secret = b
            case "v_PersistentRef":
                guard operation != .add else { throw .param("v_PersistentRef is not allowed in \(operation.callName)") }
                guard case .bytes(let b) = value else {
                    throw .param("v_PersistentRef must be data, not \(value.kindName)")
                }
                guard let (refClass, id) = PersistentRef.parse(b) else {
                    throw .param("v_PersistentRef is not a persistent reference of a keychain item")
                }
                if classGiven && refClass != itemClass {
                    throw .param("v_PersistentRef names a \(refClass.name), not a \(itemClass.name)")
                }
                itemClass = refClass
                persistentRef = id
            case "m_Limit":
                // A delete removes every match, which is what kSecMatchLimitAll says: macOS accepts
                // it there, and wrappers add it outside iOS (KeychainAccess's `removeAll`). Any
                // other limit would promise a delete of fewer items: errSecParam, as on iOS.
                if operation == .delete, case .text("m_LimitAll") = value { break }
                try rejectMatchKey(key, operation)
                limit = try Self.parseLimit(value)
            case "m_CaseInsensitive":
                try rejectMatchKey(key, operation)
                // Accepted; matching stays byte-exact, as in Apple's data-protection keychain.
                guard case .bool = value else {
                    throw .param("m_CaseInsensitive must be a boolean, not \(value.kindName)")
                }
            case "r_Data", "r_Attributes", "r_PersistentRef":
                if operation == .update || operation == .delete {
                    throw .param("\(key) (a kSecReturn key) is not allowed in \(operation.callName)")
                }
                guard case .bool(let b) = value else { throw .param("\(key) must be a boolean, not \(value.kindName)") }
                switch key {
                case "r_Data": returns.data = b
                case "r_Attributes": returns.attributes = b
                default: returns.persistentRef = b
                }
            case "nleg", "u_AuthUI", "u_OpPrompt", "u_AuthCtx", "u_NoAuthUI", "u_NoAuth":
                // kSecUseDataProtectionKeychain and the LocalAuthentication UI keys: no-ops on Linux.
                break
            case AccessControl.key:
                // Checked in every call (a constraint keychaind cannot enforce is errSecUnimplemented
                // wherever it appears), kept by an add; a search ignores it, as Apple's does (wrappers
                // such as Valet put it in the query of every call).
                let control = try AccessControl(wire: value)
                if operation == .add { accessControl = control }
            case "sync":
                if case .text("syna") = value {
                    guard operation != .add else {
                        throw .param("sync = syna (kSecAttrSynchronizableAny) is only allowed in queries")
                    }
                    sync = .any
                } else {
                    sync = try Attribute.synchronizable.normalize(value).bool! ? .yes : .no
                }
                syncGiven = true
            default:
                if let attribute = Attribute(key, of: itemClass) {
                    attributes[attribute] = try attribute.normalize(value)
                } else if key.utf8.count == 4 {
                    throw KeychainError(.noSuchAttr, "\(printableKey(key)) is not an attribute of \(itemClass.name)s")
                } else if key.hasPrefix("m_") {
                    throw .param("\(printableKey(key)) is not a supported match key")
                } else if key.hasPrefix("r_") || key.hasPrefix("v_") || key.hasPrefix("u_") {
                    throw .param("\(printableKey(key)) is not a supported key")
                } else {
                    throw .param("\(printableKey(key)) is not a SecItem key")
                }
            }
        }
        if let control = accessControl?.protection {
            guard attributes[.accessible] == nil else {
                throw .param("kSecAttrAccessControl and kSecAttrAccessible cannot both be given")
            }
            attributes[.accessible] = .text(control.code)
        }
        if persistentRef != nil {
            guard attributes.isEmpty && !syncGiven else {
                throw .param("v_PersistentRef cannot be combined with attribute filters")
            }
            sync = .any  // a persistent ref names one item, synchronizable or not
        } else if !classGiven {
            throw .param("class (kSecClass) is missing")
        }
    }

    private func rejectMatchKey(_ key: String, _ operation: Operation) throws(KeychainError) {
        if operation != .copy {
            throw .param("\(key) (a kSecMatch key) is not allowed in \(operation.callName)")
        }
    }

    private static func parseLimit(_ value: Value) throws(KeychainError) -> MatchLimit {
        switch value {
        case .text("m_LimitOne"): return .one
        case .text("m_LimitAll"): return .all
        case .int(let n) where n >= 1: return n == 1 ? .one : .count(Int(clamping: n))
        default: throw .param("m_Limit must be m_LimitOne, m_LimitAll or a positive number")
        }
    }
}

/// The attributes-to-update dictionary of SecItemUpdate: only attributes and `v_Data`.
struct ParsedChanges {
    var attributes: [Attribute: Value] = [:]
    var sync: Bool?
    var secret: SecretBytes?
    /// A new `accc` (kSecAttrAccessControl).
    var accessControl: AccessControl?

    init(_ dictionary: [String: Value], of itemClass: ItemClass = .genericPassword) throws(KeychainError) {
        for (key, value) in dictionary {
            switch key {
            case "v_Data":
                guard let b = value.secretBytes else { throw .param("v_Data must be data, not \(value.kindName)") }
                secret = b
            case "nleg":
                break
            case AccessControl.key:
                accessControl = try AccessControl(wire: value)
            case "sync":
                if case .text("syna") = value { throw .param("sync = syna (kSecAttrSynchronizableAny) cannot be set") }
                sync = try Attribute.synchronizable.normalize(value).bool!
            default:
                guard let attribute = Attribute(key, of: itemClass) else {
                    throw KeychainError(
                        .noSuchAttr,
                        "\(printableKey(key)) cannot be updated: only attributes of \(itemClass.name)s and v_Data can")
                }
                attributes[attribute] = try attribute.normalize(value)
            }
        }
        // mdat is always set by the store.
        attributes[.modificationDate] = nil
        if let control = accessControl?.protection {
            guard attributes[.accessible] == nil else {
                throw .param("kSecAttrAccessControl and kSecAttrAccessible cannot both be given")
            }
            attributes[.accessible] = .text(control.code)
        }
    }
}
