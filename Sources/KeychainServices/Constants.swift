import Foundation

// The kSec… constants, with Apple's wire strings as their values (SPEC §3), so that
// `kSecClass as String`, `[kSecClass: kSecClassGenericPassword] as CFDictionary` and
// `query[kSecMatchLimit as String] = kSecMatchLimitOne` in a `[String: AnyObject]` compile as on Apple
// platforms. They are `NSString`s (`CFString` here), immutable, hence `nonisolated(unsafe)`.

// MARK: Item class
/// The item class key; the only class keychaind stores is `kSecClassGenericPassword`.
nonisolated(unsafe) public let kSecClass: CFString = "class"
nonisolated(unsafe) public let kSecClassGenericPassword: CFString = "genp"
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassInternetPassword: CFString = "inet"
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassCertificate: CFString = "cert"
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassKey: CFString = "keys"
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassIdentity: CFString = "idnt"

// MARK: Attributes of a generic password
nonisolated(unsafe) public let kSecAttrService: CFString = "svce"
nonisolated(unsafe) public let kSecAttrAccount: CFString = "acct"
nonisolated(unsafe) public let kSecAttrAccessGroup: CFString = "agrp"
nonisolated(unsafe) public let kSecAttrAccessible: CFString = "pdmn"
nonisolated(unsafe) public let kSecAttrLabel: CFString = "labl"
nonisolated(unsafe) public let kSecAttrDescription: CFString = "desc"
nonisolated(unsafe) public let kSecAttrComment: CFString = "icmt"
nonisolated(unsafe) public let kSecAttrGeneric: CFString = "gena"
nonisolated(unsafe) public let kSecAttrCreator: CFString = "crtr"
nonisolated(unsafe) public let kSecAttrType: CFString = "type"
nonisolated(unsafe) public let kSecAttrIsInvisible: CFString = "invi"
nonisolated(unsafe) public let kSecAttrIsNegative: CFString = "nega"
nonisolated(unsafe) public let kSecAttrSynchronizable: CFString = "sync"
nonisolated(unsafe) public let kSecAttrCreationDate: CFString = "cdat"
nonisolated(unsafe) public let kSecAttrModificationDate: CFString = "mdat"
/// Internet-password attribute: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrServer: CFString = "srvr"
/// Internet-password attribute: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrPort: CFString = "port"
/// Internet-password attribute: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrProtocol: CFString = "ptcl"

// MARK: Values of kSecAttrSynchronizable
/// In a query: match synchronizable and non-synchronizable items alike.
nonisolated(unsafe) public let kSecAttrSynchronizableAny: CFString = "syna"

// MARK: Values of kSecAttrAccessible
/// The default, as on Apple platforms.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlocked: CFString = "ak"
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlock: CFString = "ck"
nonisolated(unsafe) public let kSecAttrAccessibleAlways: CFString = "dk"
nonisolated(unsafe) public let kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly: CFString = "akpu"
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlockedThisDeviceOnly: CFString = "aku"
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: CFString = "cku"
nonisolated(unsafe) public let kSecAttrAccessibleAlwaysThisDeviceOnly: CFString = "dku"

// MARK: Values
/// The secret: `Data` only (a `String` is `errSecParam`, as on Apple platforms).
nonisolated(unsafe) public let kSecValueData: CFString = "v_Data"
nonisolated(unsafe) public let kSecValuePersistentRef: CFString = "v_PersistentRef"

// MARK: Search
nonisolated(unsafe) public let kSecMatchLimit: CFString = "m_Limit"
nonisolated(unsafe) public let kSecMatchLimitOne: CFString = "m_LimitOne"
nonisolated(unsafe) public let kSecMatchLimitAll: CFString = "m_LimitAll"
/// Accepted; matching stays byte-exact, as in Apple's data-protection keychain.
nonisolated(unsafe) public let kSecMatchCaseInsensitive: CFString = "m_CaseInsensitive"

// MARK: Return types
nonisolated(unsafe) public let kSecReturnData: CFString = "r_Data"
nonisolated(unsafe) public let kSecReturnAttributes: CFString = "r_Attributes"
nonisolated(unsafe) public let kSecReturnPersistentRef: CFString = "r_PersistentRef"
/// Generic passwords have no reference type on iOS: the key is accepted and returns nothing.
nonisolated(unsafe) public let kSecReturnRef: CFString = "r_Ref"

// MARK: Use keys (accepted and ignored by the client, as Apple's client library strips them)
/// A no-op: keychaind always behaves as the data-protection keychain.
nonisolated(unsafe) public let kSecUseDataProtectionKeychain: CFString = "nleg"
nonisolated(unsafe) public let kSecUseOperationPrompt: CFString = "u_OpPrompt"
nonisolated(unsafe) public let kSecUseAuthenticationUI: CFString = "u_AuthUI"
nonisolated(unsafe) public let kSecUseAuthenticationUIAllow: CFString = "u_AuthUIA"
nonisolated(unsafe) public let kSecUseAuthenticationUIFail: CFString = "u_AuthUIF"
nonisolated(unsafe) public let kSecUseAuthenticationUISkip: CFString = "u_AuthUIS"
nonisolated(unsafe) public let kSecUseAuthenticationContext: CFString = "u_AuthCtx"
