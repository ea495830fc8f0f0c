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
// do not exist — Swift code on Apple platforms never needs them either.

/// Apple's status type: 0 success, negative `errSec…` codes for failures.
public typealias OSStatus = Int32
public typealias CFTypeRef = AnyObject
public typealias CFDictionary = NSDictionary
public typealias CFMutableDictionary = NSMutableDictionary
public typealias CFString = NSString
public typealias CFData = NSData
public typealias CFArray = NSArray
public typealias CFNumber = NSNumber
public typealias CFBoolean = NSNumber
public typealias CFDate = NSDate
public typealias CFDictionaryRef = NSDictionary
public typealias CFStringRef = NSString
public typealias CFDataRef = NSData

/// `true` as a CF boolean. Implicitly unwrapped, as Apple declares it, so `kCFBooleanTrue!` compiles.
public let kCFBooleanTrue: CFBoolean! = NSNumber(value: true)
/// `false` as a CF boolean.
public let kCFBooleanFalse: CFBoolean! = NSNumber(value: false)

// MARK: Status codes (Apple's values, SecBase.h)

public let noErr: OSStatus = 0
public let errSecSuccess: OSStatus = 0
public let errSecUnimplemented: OSStatus = -4
public let errSecDiskFull: OSStatus = -34
public let errSecIO: OSStatus = -36
public let errSecParam: OSStatus = -50
public let errSecWrPerm: OSStatus = -61
public let errSecAllocate: OSStatus = -108
public let errSecUserCanceled: OSStatus = -128
public let errSecBadReq: OSStatus = -909
public let errSecInternalComponent: OSStatus = -2070
public let errSecNotAvailable: OSStatus = -25291
public let errSecReadOnly: OSStatus = -25292
public let errSecAuthFailed: OSStatus = -25293
public let errSecNoSuchKeychain: OSStatus = -25294
public let errSecDuplicateItem: OSStatus = -25299
public let errSecItemNotFound: OSStatus = -25300
public let errSecDataTooLarge: OSStatus = -25302
public let errSecNoSuchAttr: OSStatus = -25303
public let errSecNoSuchClass: OSStatus = -25306
public let errSecInteractionNotAllowed: OSStatus = -25308
public let errSecReadOnlyAttr: OSStatus = -25309
public let errSecInteractionRequired: OSStatus = -25315
public let errSecDataNotAvailable: OSStatus = -25316
public let errSecDecode: OSStatus = -26275
public let errSecMissingEntitlement: OSStatus = -34018

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
    case errSecNoSuchKeychain: return "The specified keychain could not be found."
    case errSecDataTooLarge:
        return "This item contains information which is too large or in a format that cannot be displayed."
    case errSecReadOnlyAttr: return "The specified attribute could not be modified."
    case errSecInteractionRequired: return "User interaction is required, but is currently not allowed."
    case errSecDataNotAvailable: return "The contents of this item cannot be retrieved."
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
