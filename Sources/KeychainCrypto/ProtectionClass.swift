/// Apple's data-protection classes (`kSecAttrAccessible`, wire key `pdmn`), numbered as Apple's keybag
/// numbers them. Stored in the row as a small integer and bound into every ciphertext of the row.
public enum ProtectionClass: UInt8, CaseIterable, Sendable, CustomStringConvertible {
    case whenUnlocked = 6  // ak
    case afterFirstUnlock = 7  // ck
    case always = 8  // dk
    case whenUnlockedThisDeviceOnly = 9  // aku
    case afterFirstUnlockThisDeviceOnly = 10  // cku
    case alwaysThisDeviceOnly = 11  // dku
    case whenPasscodeSetThisDeviceOnly = 12  // akpu

    /// Apple's default when an add names none.
    public static let `default` = ProtectionClass.whenUnlocked

    /// The bit of a row's `class` column that says reading the item's data needs the person
    /// (`kSecAttrAccessControl` with `.userPresence` / `.devicePasscode`): the column is the class
    /// number with this bit set. Outside the sealed blobs, so the read paths test it without opening
    /// anything; bound into the row's ciphertexts like the class (clearing it fails the open).
    public static let presenceBit: UInt8 = 0x80

    /// The class of a row's `class` column value (the presence bit ignored), or nil for none.
    @inlinable public init?(column: UInt8) { self.init(rawValue: column & ~Self.presenceBit) }

    /// The `class` column values of this class's rows: without and with the presence bit (a filter
    /// on the class matches both).
    public var columnValues: [UInt8] { [rawValue, rawValue | Self.presenceBit] }

    /// The class for Apple's `kSecAttrAccessible` code (`ak`, `ck`, … `akpu`), or nil for an unknown code.
    public init?(code: String) {
        switch code {
        case "ak": self = .whenUnlocked
        case "ck": self = .afterFirstUnlock
        case "dk": self = .always
        case "aku": self = .whenUnlockedThisDeviceOnly
        case "cku": self = .afterFirstUnlockThisDeviceOnly
        case "dku": self = .alwaysThisDeviceOnly
        case "akpu": self = .whenPasscodeSetThisDeviceOnly
        default: return nil
        }
    }

    /// The wire string (`ak`, `cku`, …).
    public var code: String {
        switch self {
        case .whenUnlocked: return "ak"
        case .afterFirstUnlock: return "ck"
        case .always: return "dk"
        case .whenUnlockedThisDeviceOnly: return "aku"
        case .afterFirstUnlockThisDeviceOnly: return "cku"
        case .alwaysThisDeviceOnly: return "dku"
        case .whenPasscodeSetThisDeviceOnly: return "akpu"
        }
    }

    /// Bound to this device's key file: never readable from a copy of the database elsewhere.
    public var isThisDeviceOnly: Bool {
        switch self {
        case .whenUnlockedThisDeviceOnly, .afterFirstUnlockThisDeviceOnly, .alwaysThisDeviceOnly,
            .whenPasscodeSetThisDeviceOnly:
            return true
        default: return false
        }
    }

    /// Readable whenever the daemon runs (Apple's "D" classes), even while locked.
    public var isAlways: Bool { self == .always || self == .alwaysThisDeviceOnly }

    /// Readable only while unlocked (Apple's "A" classes): dropped on lock.
    public var needsUnlocked: Bool {
        self == .whenUnlocked || self == .whenUnlockedThisDeviceOnly || self == .whenPasscodeSetThisDeviceOnly
    }

    /// Apple's code for the class (`ak`, `cku`, …).
    public var description: String { code }
}
