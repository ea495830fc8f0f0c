public import Foundation

// `kSecAttrAccessControl` and the calls that build its value, so that wrappers which create access
// control on every platform (KeychainAccess, Valet, keychain-swift do, outside any `#if`) compile.
//
// keychaind asks the person (through pinentry) before an item whose access control says
// `.userPresence` or `.devicePasscode` (alone, or joined by `.or` / `.and`) has its data read or
// changed. Creating the object always succeeds; the daemon judges its constraints when a SecItem
// call carries it: biometry, a watch, an application password or private-key usage are
// `errSecUnimplemented`, naming them. One without constraints (flags `[]`) only names a protection
// class, and is sent as that `kSecAttrAccessible`.

/// The item's access control (a `SecAccessControl`): with `.userPresence` / `.devicePasscode`,
/// reading the item's data asks the person; other constraints are `errSecUnimplemented`; one
/// without constraints is its protection class, as `kSecAttrAccessible`. Returned in an item's
/// attributes (`kSecReturnAttributes`) when it has one.
nonisolated(unsafe) public let kSecAttrAccessControl: CFString = SecConstant("accc")

/// Apple's access-control object: what `SecAccessControlCreateWithFlags` was given, sent with the
/// item as `kSecAttrAccessControl` (docs/protocol.md, "Access control").
public final class SecAccessControl: NSObject, @unchecked Sendable {
    /// The protection class asked for, one of the `kSecAttrAccessible…` values.
    let protection: String?
    /// The constraints asked for.
    let flags: SecAccessControlCreateFlags

    init(protection: String?, flags: SecAccessControlCreateFlags) {
        self.protection = protection
        self.flags = flags
    }
}

/// The constraints of a `SecAccessControl`, with Apple's values (SecAccessControl.h).
public struct SecAccessControlCreateFlags: OptionSet, Sendable {
    /// The flags as Apple's `CFOptionFlags`.
    public let rawValue: CFOptionFlags
    /// Flags from their raw value.
    public init(rawValue: CFOptionFlags) { self.rawValue = rawValue }

    /// Biometry or the passcode.
    public static let userPresence = SecAccessControlCreateFlags(rawValue: 1 << 0)
    /// Biometry, any enrolled finger or face.
    public static let biometryAny = SecAccessControlCreateFlags(rawValue: 1 << 1)
    /// Apple's deprecated name of `biometryAny`.
    public static let touchIDAny = SecAccessControlCreateFlags(rawValue: 1 << 1)
    /// Biometry, only the fingers or face enrolled now.
    public static let biometryCurrentSet = SecAccessControlCreateFlags(rawValue: 1 << 3)
    /// Apple's deprecated name of `biometryCurrentSet`.
    public static let touchIDCurrentSet = SecAccessControlCreateFlags(rawValue: 1 << 3)
    /// The device passcode.
    public static let devicePasscode = SecAccessControlCreateFlags(rawValue: 1 << 4)
    /// A paired watch (macOS).
    public static let watch = SecAccessControlCreateFlags(rawValue: 1 << 5)
    /// Any one of the constraints.
    public static let or = SecAccessControlCreateFlags(rawValue: 1 << 14)
    /// All of the constraints.
    public static let and = SecAccessControlCreateFlags(rawValue: 1 << 15)
    /// Access control for private-key operations.
    public static let privateKeyUsage = SecAccessControlCreateFlags(rawValue: 1 << 30)
    /// An application-provided password in the item's key derivation.
    public static let applicationPassword = SecAccessControlCreateFlags(rawValue: 1 << 31)
}

// swift-format-ignore: AlwaysUseLowerCamelCase
/// Creates an access-control object, with Apple's signature. It always succeeds (`error` is left
/// alone); the daemon judges its constraints when a SecItem call carries it.
public func SecAccessControlCreateWithFlags(
    _ allocator: CFAllocator?, _ protection: CFTypeRef, _ flags: SecAccessControlCreateFlags,
    _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?
) -> SecAccessControl? {
    SecAccessControl(protection: protection as? String, flags: flags)
}

/// Apple's `CFIndex`: a signed count or index.
public typealias CFIndex = Int
/// Apple's `CFOptionFlags`: a bit set.
public typealias CFOptionFlags = UInt
/// The domain of a `CFError`, a string.
public typealias CFErrorDomain = CFString

// The CFError getters Apple-platform code calls on the error an access-control call may return
// (KeychainAccess turns a CFError into an NSError with them, outside any `#if`).

// swift-format-ignore: AlwaysUseLowerCamelCase
/// The error's domain.
public func CFErrorGetDomain(_ err: CFError!) -> CFErrorDomain! { err.domain as NSString }

// swift-format-ignore: AlwaysUseLowerCamelCase
/// The error's code.
public func CFErrorGetCode(_ err: CFError!) -> CFIndex { err.code }

// swift-format-ignore: AlwaysUseLowerCamelCase
/// The error's user-info dictionary.
public func CFErrorCopyUserInfo(_ err: CFError!) -> CFDictionary! { err.userInfo as NSDictionary }

// swift-format-ignore: AlwaysUseLowerCamelCase
/// The error's description, as a user would read it.
public func CFErrorCopyDescription(_ err: CFError!) -> CFString! { err.localizedDescription as NSString }
