/// Apple's `OSStatus` codes that keychaind produces, with the one-line message each carries by default.
///
/// The numeric values are Apple's (`SecBase.h`); clients in any language see exactly these on the wire.
public struct Status: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    public static let success = Status(rawValue: 0)
    public static let unimplemented = Status(rawValue: -4)
    public static let io = Status(rawValue: -36)
    public static let param = Status(rawValue: -50)
    public static let allocate = Status(rawValue: -108)
    public static let notAvailable = Status(rawValue: -25291)
    public static let readOnly = Status(rawValue: -25292)
    public static let authFailed = Status(rawValue: -25293)
    public static let duplicateItem = Status(rawValue: -25299)
    public static let itemNotFound = Status(rawValue: -25300)
    public static let noSuchAttr = Status(rawValue: -25303)
    public static let noSuchClass = Status(rawValue: -25306)
    public static let interactionNotAllowed = Status(rawValue: -25308)
    public static let decode = Status(rawValue: -26275)
    public static let `internal` = Status(rawValue: -26276)
    public static let missingEntitlement = Status(rawValue: -34018)

    /// Apple's symbolic name (`errSecItemNotFound`), or the number for codes keychaind does not name.
    public var name: String {
        switch self {
        case .success: return "errSecSuccess"
        case .unimplemented: return "errSecUnimplemented"
        case .io: return "errSecIO"
        case .param: return "errSecParam"
        case .allocate: return "errSecAllocate"
        case .notAvailable: return "errSecNotAvailable"
        case .readOnly: return "errSecReadOnly"
        case .authFailed: return "errSecAuthFailed"
        case .duplicateItem: return "errSecDuplicateItem"
        case .itemNotFound: return "errSecItemNotFound"
        case .noSuchAttr: return "errSecNoSuchAttr"
        case .noSuchClass: return "errSecNoSuchClass"
        case .interactionNotAllowed: return "errSecInteractionNotAllowed"
        case .decode: return "errSecDecode"
        case .internal: return "errSecInternal"
        case .missingEntitlement: return "errSecMissingEntitlement"
        default: return "OSStatus \(rawValue)"
        }
    }

    /// The generic one-line text for this code (what `SecCopyErrorMessageString` returns).
    public var defaultMessage: String {
        switch self {
        case .success: return "No error."
        case .unimplemented: return "Function or operation not implemented."
        case .io: return "I/O error."
        case .param: return "One or more parameters passed to a function were not valid."
        case .allocate: return "Failed to allocate memory."
        case .notAvailable: return "No keychain is available."
        case .readOnly: return "This keychain cannot be modified."
        case .authFailed: return "The user name or passphrase you entered is not correct."
        case .duplicateItem: return "The specified item already exists in the keychain."
        case .itemNotFound: return "The specified item could not be found in the keychain."
        case .noSuchAttr: return "The specified attribute does not exist."
        case .noSuchClass: return "The specified item class does not exist."
        case .interactionNotAllowed: return "User interaction is not allowed (the keychain is locked)."
        case .decode: return "Unable to decode the provided data."
        case .internal: return "An internal error occurred."
        case .missingEntitlement: return "A required entitlement isn't present."
        default: return "OSStatus \(rawValue)."
        }
    }

    public var description: String { "\(name) (\(rawValue))" }
}

/// The one error type that travels end to end: an `OSStatus` plus a one-line human message.
///
/// Messages never contain a secret or an attribute value; they name keys, not contents.
public struct KeychainError: Error, Hashable, Sendable, CustomStringConvertible {
    public let status: Status
    public let message: String
    /// errSecAuthFailed because the request needs the keychain passphrase (an admin proving presence)
    /// and did not carry it: a client may ask the user and send the request again with it.
    public var needsPassphrase = false

    public init(_ status: Status, _ message: String? = nil) {
        self.status = status
        self.message = message ?? status.defaultMessage
    }

    /// errSecAuthFailed for a request that needs the keychain passphrase and lacks it (or had a wrong one).
    public static func passphraseNeeded(_ message: String) -> KeychainError {
        var e = KeychainError(.authFailed, message)
        e.needsPassphrase = true
        return e
    }

    public var description: String { "\(status.name) (\(status.rawValue)): \(message)" }

    public static func param(_ message: String) -> KeychainError { KeychainError(.param, message) }
}
