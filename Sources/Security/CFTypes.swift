public import Foundation
internal import KeychainCore

// Linux stand-ins for the Core Foundation names that keychain code written for Apple platforms uses.
//
// There is no Core Foundation API on Linux, but swift-corelibs-foundation has the toll-free-bridged
// Objective-C classes, and their `as` bridging works: `[String: Any] as NSDictionary`,
// `NSString as String`, `Data as CFData`, `item as? Data` on an `NSData`. So each CF type is its
// Foundation class:
//
//     query as CFDictionary          [String: Any] / [String: AnyObject] / [CFString: Any] → NSDictionary
//     kSecClass as String            NSString → String
//     var item: CFTypeRef?           AnyObject?; `&item` for an `AnyObject?` variable works too
//     item as? Data, as? [String: Any], as? [[String: Any]]   results are NSData / NSDictionary / NSArray
//     kCFBooleanTrue!                an NSNumber holding true
//
// What does not carry over: the CF C functions (`CFRelease`, `CFDictionaryGetValue`, `CFGetTypeID`…)
// do not exist — Swift code on Apple platforms never needs them either — but for the `CFError…` getters
// (AccessControl.swift), which wrappers call on the error of an access-control call.

/// Apple's status type: 0 success, negative `errSec…` codes for failures.
public typealias OSStatus = Int32
/// Any Core Foundation object: on Linux, any class instance (`NSDictionary`, `NSData`, `NSNumber`…).
public typealias CFTypeRef = AnyObject
/// A CF dictionary, which on Linux is Foundation's `NSDictionary` (so `query as CFDictionary` compiles).
public typealias CFDictionary = NSDictionary
/// A mutable CF dictionary, which on Linux is Foundation's `NSMutableDictionary`.
public typealias CFMutableDictionary = NSMutableDictionary
/// A CF string, which on Linux is Foundation's `NSString`; the type of every `kSec…` key.
public typealias CFString = NSString
/// CF bytes, which on Linux is Foundation's `NSData`; the type a secret comes back as.
public typealias CFData = NSData
/// A CF array, which on Linux is Foundation's `NSArray`; what a `kSecMatchLimitAll` copy returns.
public typealias CFArray = NSArray
/// A CF number, which on Linux is Foundation's `NSNumber`.
public typealias CFNumber = NSNumber
/// A CF boolean, which on Linux is an `NSNumber` holding true or false.
public typealias CFBoolean = NSNumber
/// A CF date, which on Linux is Foundation's `NSDate` (item creation and modification dates).
public typealias CFDate = NSDate
/// Apple's `…Ref` spelling of `CFDictionary`, kept so code written against either name compiles.
public typealias CFDictionaryRef = NSDictionary
/// Apple's `…Ref` spelling of `CFString`, kept so code written against either name compiles.
public typealias CFStringRef = NSString
/// Apple's `…Ref` spelling of `CFData`, kept so code written against either name compiles.
public typealias CFDataRef = NSData

/// A CF error, which on Linux is Foundation's `NSError` (toll-free bridged on Apple platforms too), so
/// an `Unmanaged<CFError>?` out-parameter and `error as Error` compile.
public typealias CFError = NSError
/// Core Foundation's allocator, of which Linux has none: the one value is `kCFAllocatorDefault` (`nil`),
/// so the `allocator` argument Apple's functions take compiles.
public final class CFAllocator: Sendable {
    private init() {}
}
/// The default allocator: `nil`, as on Apple platforms, where it is a synonym for `NULL`.
public let kCFAllocatorDefault: CFAllocator! = nil

/// `true` as a CF boolean. Implicitly unwrapped, as Apple declares it, so `kCFBooleanTrue!` compiles.
public let kCFBooleanTrue: CFBoolean! = NSNumber(value: true)
/// `false` as a CF boolean.
public let kCFBooleanFalse: CFBoolean! = NSNumber(value: false)

// MARK: Status codes (Apple's values, SecBase.h)

/// No error (0), the classic Mac OS spelling of success.
public let noErr: OSStatus = 0
/// The call succeeded (0).
public let errSecSuccess: OSStatus = 0
/// The function or operation is not implemented (-4).
public let errSecUnimplemented: OSStatus = -4
/// The disk is full (-34): the item could not be written.
public let errSecDiskFull: OSStatus = -34
/// An input or output error (-36) while reading or writing the keychain.
public let errSecIO: OSStatus = -36
/// A parameter is missing or invalid (-50), such as a key of the wrong type in the query.
public let errSecParam: OSStatus = -50
/// Write permission denied (-61).
public let errSecWrPerm: OSStatus = -61
/// Memory could not be allocated (-108).
public let errSecAllocate: OSStatus = -108
/// The user cancelled the operation (-128).
public let errSecUserCanceled: OSStatus = -128
/// The request was malformed or not allowed in this state (-909).
public let errSecBadReq: OSStatus = -909
/// An internal component failed (-2070).
public let errSecInternalComponent: OSStatus = -2070
/// An invalid attempt to change the owner of an item (-25244).
public let errSecInvalidOwnerEdit: OSStatus = -25244
/// No keychain is available (-25291).
public let errSecNotAvailable: OSStatus = -25291
/// The keychain is read-only (-25292).
public let errSecReadOnly: OSStatus = -25292
/// Authorization or authentication failed (-25293).
public let errSecAuthFailed: OSStatus = -25293
/// The named keychain does not exist (-25294).
public let errSecNoSuchKeychain: OSStatus = -25294
/// The keychain is not a valid keychain file (-25295).
public let errSecInvalidKeychain: OSStatus = -25295
/// An item with the same primary key already exists (-25299).
public let errSecDuplicateItem: OSStatus = -25299
/// No item matches the query (-25300).
public let errSecItemNotFound: OSStatus = -25300
/// The data is too large for the item (-25302).
public let errSecDataTooLarge: OSStatus = -25302
/// The attribute does not exist for this item class (-25303).
public let errSecNoSuchAttr: OSStatus = -25303
/// The item class does not exist or is not supported (-25306).
public let errSecNoSuchClass: OSStatus = -25306
/// User interaction would be needed but is not allowed (-25308), e.g. the keychain is locked.
public let errSecInteractionNotAllowed: OSStatus = -25308
/// The attribute is read-only and cannot be changed (-25309).
public let errSecReadOnlyAttr: OSStatus = -25309
/// User interaction is required to complete the operation (-25315).
public let errSecInteractionRequired: OSStatus = -25315
/// The item's data is not available now, for example before the first unlock (-25316).
public let errSecDataNotAvailable: OSStatus = -25316
/// A stored value or a reply could not be decoded (-26275).
public let errSecDecode: OSStatus = -26275
/// The caller lacks the entitlement for the requested access group (-34018).
public let errSecMissingEntitlement: OSStatus = -34018
/// The client is restricted and may not perform this operation (-34020).
public let errSecRestrictedAPI: OSStatus = -34020

// swift-format-ignore: AlwaysUseLowerCamelCase
/// The text for `status`, as Apple's `SecCopyErrorMessageString` gives it.
///
/// keychaind sends a specific one-line message with every error; when the most recent SecItem call
/// *on this thread* failed with `status`, that message is returned (it names the key or socket path
/// at fault), otherwise the generic text for the code.
public func SecCopyErrorMessageString(_ status: OSStatus, _ reserved: UnsafeMutableRawPointer?) -> CFString? {
    if let last = LastError.current, last.status.rawValue == status { return last.message as NSString }
    return genericMessage(status) as NSString
}

func genericMessage(_ status: OSStatus) -> String {
    switch status {
    case errSecDiskFull: return "The disk is full."
    case errSecWrPerm: return "Write permissions error."
    case errSecUserCanceled: return "User canceled the operation."
    case errSecBadReq: return "Bad parameter or invalid state for operation."
    case errSecInternalComponent: return "An internal component failed."
    case errSecInvalidOwnerEdit: return "Invalid attempt to change the owner of this item."
    case errSecNoSuchKeychain: return "The specified keychain could not be found."
    case errSecInvalidKeychain: return "The specified keychain is not a valid keychain file."
    case errSecDataTooLarge:
        return "This item contains information which is too large or in a format that cannot be displayed."
    case errSecReadOnlyAttr: return "The specified attribute could not be modified."
    case errSecInteractionRequired: return "User interaction is required, but is currently not allowed."
    case errSecDataNotAvailable: return "The contents of this item cannot be retrieved."
    case errSecRestrictedAPI: return "Client is restricted and is not permitted to perform this operation."
    default: return Status(rawValue: status).defaultMessage
    }
}

/// The last failure of a SecItem call on the current thread (what `SecCopyErrorMessageString` reports).
enum LastError {
    private static let key = "KeychainServices.lastError"

    static var current: KeychainError? {
        (Thread.current.threadDictionary[key] as? KeychainErrorBox)?.error
    }

    static func record(_ error: KeychainError?) {
        if let error {
            Thread.current.threadDictionary[key] = KeychainErrorBox(error)
        } else {
            Thread.current.threadDictionary.removeObject(forKey: key)
        }
    }
}

final class KeychainErrorBox: NSObject {
    let error: KeychainError
    init(_ error: KeychainError) { self.error = error }
}
