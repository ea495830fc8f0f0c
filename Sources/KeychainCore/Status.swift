/// Apple's `OSStatus` codes that keychaind produces, with the one-line message each carries by default.
///
/// The numeric values are Apple's (`SecBase.h`); clients in any language see exactly these on the wire.
public struct Status: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The numeric `OSStatus` value, as Apple defines it and as it travels on the wire.
    public let rawValue: Int32
    /// Wraps any `OSStatus` number, including ones keychaind does not name.
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// `errSecSuccess` (0): the operation succeeded.
    public static let success = Status(rawValue: 0)
    /// `errSecUnimplemented` (-4): the operation or option is not implemented.
    public static let unimplemented = Status(rawValue: -4)
    /// `errSecIO` (-36): reading or writing the database or a file failed.
    public static let io = Status(rawValue: -36)
    /// `errSecUserCanceled` (-128): the person asked (a passphrase prompt) cancelled it.
    public static let userCanceled = Status(rawValue: -128)
    /// `errSecParam` (-50): a parameter (query key, attribute, value) is not valid.
    public static let param = Status(rawValue: -50)
    /// `errSecAllocate` (-108): memory could not be allocated.
    public static let allocate = Status(rawValue: -108)
    /// `errSecNotAvailable` (-25291): no keychain is available (daemon unreachable, database closed, busy or damaged).
    public static let notAvailable = Status(rawValue: -25291)
    /// `errSecReadOnly` (-25292): the keychain cannot be modified.
    public static let readOnly = Status(rawValue: -25292)
    /// `errSecAuthFailed` (-25293): a passphrase was missing, wrong or throttled, or one is needed and none is set.
    public static let authFailed = Status(rawValue: -25293)
    /// `errSecDuplicateItem` (-25299): an item with the same primary key already exists.
    public static let duplicateItem = Status(rawValue: -25299)
    /// `errSecItemNotFound` (-25300): no item matches the query.
    public static let itemNotFound = Status(rawValue: -25300)
    /// `errSecNoSuchAttr` (-25303): the query or attributes name an attribute that does not exist.
    public static let noSuchAttr = Status(rawValue: -25303)
    /// `errSecNoSuchClass` (-25306): the item class is not one keychaind stores.
    public static let noSuchClass = Status(rawValue: -25306)
    /// `errSecInteractionNotAllowed` (-25308): the keychain is locked and the request may not unlock it.
    public static let interactionNotAllowed = Status(rawValue: -25308)
    /// `errSecDecode` (-26275): bytes (a frame, a backup, a stored row) could not be decoded.
    public static let decode = Status(rawValue: -26275)
    /// `errSecInternal` (-26276): an internal error occurred; the message says where.
    public static let `internal` = Status(rawValue: -26276)
    /// `errSecMissingEntitlement` (-34018): the caller lacks the access group or entitlement it asked for.
    public static let missingEntitlement = Status(rawValue: -34018)

    /// Apple's symbolic name (`errSecItemNotFound`), or the number for codes keychaind does not name.
    public var name: String {
        switch self {
        case .success: return "errSecSuccess"
        case .unimplemented: return "errSecUnimplemented"
        case .io: return "errSecIO"
        case .param: return "errSecParam"
        case .userCanceled: return "errSecUserCanceled"
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
        case .userCanceled: return "User canceled the operation."
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

    /// The symbolic name and number, for example `errSecItemNotFound (-25300)`.
    public var description: String { "\(name) (\(rawValue))" }
}

/// The one error type that travels end to end: an `OSStatus` plus a one-line human message.
///
/// Messages never contain a secret or an attribute value; they name keys, not contents.
public struct KeychainError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The `OSStatus` a client sees.
    public let status: Status
    /// One line for a human saying what went wrong or what to do; never contains a secret or attribute value.
    public let message: String
    /// errSecAuthFailed because the request needs the keychain passphrase (an admin proving presence)
    /// and did not carry it: a client may ask the user and send the request again with it.
    public var needsPassphrase = false
    /// errSecInteractionNotAllowed because an item's access control (`.userPresence`,
    /// `.devicePasscode`) needs the person and the request was not allowed by them: the daemon may
    /// ask and run the request again. Never sent on the wire.
    public var needsPresence = false

    /// An error with `status` and `message`, or the status's default message when `message` is nil.
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

    /// The name, number and message on one line, for example `errSecParam (-50): …`; never shows a secret.
    public var description: String { "\(status.name) (\(status.rawValue)): \(message)" }

    /// errSecParam with `message`: the request's shape or one of its values is not valid.
    public static func param(_ message: String) -> KeychainError { KeychainError(.param, message) }
}
