public import Foundation

// The kSec… constants, with Apple's wire strings as their values (docs/protocol.md §7), so that
// `kSecClass as String`, `[kSecClass: kSecClassGenericPassword] as CFDictionary` and
// `query[kSecMatchLimit as String] = kSecMatchLimitOne` in a `[String: AnyObject]` compile as on Apple
// platforms. They are `NSString`s (`CFString` here), immutable, hence `nonisolated(unsafe)`.
//
// Each one is a `SecConstant`, an `NSString` that hashes as the equal Swift `String` when it becomes an
// `AnyHashable` — as every `NSString` does on Apple platforms, where Foundation gives `NSString` a
// `String` as its `AnyHashable` representation. swift-corelibs-foundation does not, so with a plain
// `NSString` the iOS spelling `(result as? [AnyHashable: Any])?[kSecAttrAccount]` would find nothing.

/// An immutable `NSString` whose `AnyHashable` form is the equal Swift `String`, as on Apple platforms.
final class SecConstant: NSString {
    private let value: String
    private let units: [unichar]

    /// A constant holding `value`.
    init(_ value: String) {
        self.value = value
        let units = Array(value.utf16)
        self.units = units
        super.init(characters: units, length: units.count)
    }

    required convenience init(string aString: String) { self.init(aString) }
    required convenience init(stringLiteral value: StaticString) { self.init("\(value)") }
    required convenience init(unicodeScalarLiteral value: StaticString) { self.init("\(value)") }
    required convenience init(extendedGraphemeClusterLiteral value: StaticString) { self.init("\(value)") }
    required convenience init?(coder aDecoder: NSCoder) { return nil }

    override var length: Int { units.count }
    override func character(at index: Int) -> unichar { units[index] }
    /// Immutable: a copy is the constant itself (so a copied dictionary key keeps hashing as a String).
    override func copy(with zone: NSZone? = nil) -> Any { self }
}

extension SecConstant: _HasCustomAnyHashableRepresentation {
    func _toCustomAnyHashable() -> AnyHashable? { AnyHashable(value) }
}

// MARK: Item class
/// The item class key; keychaind stores `kSecClassGenericPassword` and `kSecClassInternetPassword`.
nonisolated(unsafe) public let kSecClass: CFString = SecConstant("class")
/// The generic-password item class: a secret found by service and account.
nonisolated(unsafe) public let kSecClassGenericPassword: CFString = SecConstant("genp")
/// The internet-password item class: a secret found by server, protocol, port, path and account.
nonisolated(unsafe) public let kSecClassInternetPassword: CFString = SecConstant("inet")
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassCertificate: CFString = SecConstant("cert")
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassKey: CFString = SecConstant("keys")
/// Accepted by the compiler only: keychaind answers `errSecNoSuchClass`.
nonisolated(unsafe) public let kSecClassIdentity: CFString = SecConstant("idnt")

// MARK: Attributes of a generic password
/// The service the password belongs to (a string); part of the item's primary key.
nonisolated(unsafe) public let kSecAttrService: CFString = SecConstant("svce")
/// The account name (a string); part of the item's primary key.
nonisolated(unsafe) public let kSecAttrAccount: CFString = SecConstant("acct")
/// The access group the item belongs to, which decides which applications may see it.
nonisolated(unsafe) public let kSecAttrAccessGroup: CFString = SecConstant("agrp")
/// When the item may be read: one of the `kSecAttrAccessible…` values.
nonisolated(unsafe) public let kSecAttrAccessible: CFString = SecConstant("pdmn")
/// A user-visible label for the item (a string).
nonisolated(unsafe) public let kSecAttrLabel: CFString = SecConstant("labl")
/// A user-visible description of the item's kind (a string).
nonisolated(unsafe) public let kSecAttrDescription: CFString = SecConstant("desc")
/// A user-editable comment on the item (a string).
nonisolated(unsafe) public let kSecAttrComment: CFString = SecConstant("icmt")
/// Application-defined bytes stored with the item (`Data`), not secret and searchable.
nonisolated(unsafe) public let kSecAttrGeneric: CFString = SecConstant("gena")
/// The item's creator as a four-character code (a number).
nonisolated(unsafe) public let kSecAttrCreator: CFString = SecConstant("crtr")
/// The item's type as a four-character code (a number).
nonisolated(unsafe) public let kSecAttrType: CFString = SecConstant("type")
/// Whether the item is hidden from user interfaces (a boolean).
nonisolated(unsafe) public let kSecAttrIsInvisible: CFString = SecConstant("invi")
/// Whether the item is a negative entry, a placeholder saying "no password here" (a boolean).
nonisolated(unsafe) public let kSecAttrIsNegative: CFString = SecConstant("nega")
/// Whether the item is synchronized across devices (a boolean); part of the primary key.
nonisolated(unsafe) public let kSecAttrSynchronizable: CFString = SecConstant("sync")
/// When the item was created (a date, read-only).
nonisolated(unsafe) public let kSecAttrCreationDate: CFString = SecConstant("cdat")
/// When the item was last modified (a date, read-only).
nonisolated(unsafe) public let kSecAttrModificationDate: CFString = SecConstant("mdat")

// MARK: Attributes of an internet password (besides kSecAttrAccount and the common ones)
/// The security domain (realm) the password belongs to (a string); part of the item's primary key.
nonisolated(unsafe) public let kSecAttrSecurityDomain: CFString = SecConstant("sdmn")
/// The server's host name or address (a string); part of the item's primary key.
nonisolated(unsafe) public let kSecAttrServer: CFString = SecConstant("srvr")
/// The protocol: one of the `kSecAttrProtocol…` values; part of the item's primary key.
nonisolated(unsafe) public let kSecAttrProtocol: CFString = SecConstant("ptcl")
/// The authentication scheme: one of the `kSecAttrAuthenticationType…` values; part of the primary key.
nonisolated(unsafe) public let kSecAttrAuthenticationType: CFString = SecConstant("atyp")
/// The port (a number); part of the item's primary key.
nonisolated(unsafe) public let kSecAttrPort: CFString = SecConstant("port")
/// The path on the server (a string); part of the item's primary key.
nonisolated(unsafe) public let kSecAttrPath: CFString = SecConstant("path")

// MARK: Attributes keychaind does not store (they compile; each says what a call that names it gets)
/// Key attribute: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrApplicationTag: CFString = SecConstant("atag")
/// Key attribute: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrIsExtractable: CFString = SecConstant("extr")
/// Key attribute with the same string as `kSecAttrType` (Apple's too): in a generic-password query it
/// is `kSecAttrType`, a number.
nonisolated(unsafe) public let kSecAttrKeyType: CFString = SecConstant("type")
/// The token (CryptoTokenKit) holding a key: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrTokenID: CFString = SecConstant("tkid")
/// Apple's iCloud sync-view hint: compiles, keychaind answers `errSecNoSuchAttr`.
nonisolated(unsafe) public let kSecAttrSyncViewHint: CFString = SecConstant("vwht")
/// Apple's persistent reference among the attributes: keychaind returns it as `kSecValuePersistentRef`
/// (ask with `kSecReturnPersistentRef`); in a query it is `errSecParam`.
nonisolated(unsafe) public let kSecAttrPersistentReference: CFString = SecConstant("persistref")

// MARK: Values of kSecAttrSynchronizable
/// In a query: match synchronizable and non-synchronizable items alike.
nonisolated(unsafe) public let kSecAttrSynchronizableAny: CFString = SecConstant("syna")

// MARK: Values of kSecAttrAccessible
/// The default, as on Apple platforms.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlocked: CFString = SecConstant("ak")
/// Readable after the first unlock since boot, until the next restart.
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlock: CFString = SecConstant("ck")
/// Always readable, even while locked (deprecated by Apple).
nonisolated(unsafe) public let kSecAttrAccessibleAlways: CFString = SecConstant("dk")
/// Readable only while unlocked and only if a passcode is set; never migrates to another device.
nonisolated(unsafe) public let kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly: CFString = SecConstant("akpu")
/// Readable only while unlocked; never migrates to another device.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlockedThisDeviceOnly: CFString = SecConstant("aku")
/// Readable after the first unlock since boot; never migrates to another device.
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: CFString = SecConstant("cku")
/// Always readable, even while locked; never migrates to another device (deprecated by Apple).
nonisolated(unsafe) public let kSecAttrAccessibleAlwaysThisDeviceOnly: CFString = SecConstant("dku")

// MARK: Values of kSecAttrProtocol (Apple's full list)
/// FTP.
nonisolated(unsafe) public let kSecAttrProtocolFTP: CFString = SecConstant("ftp ")
/// FTP account.
nonisolated(unsafe) public let kSecAttrProtocolFTPAccount: CFString = SecConstant("ftpa")
/// HTTP.
nonisolated(unsafe) public let kSecAttrProtocolHTTP: CFString = SecConstant("http")
/// IRC.
nonisolated(unsafe) public let kSecAttrProtocolIRC: CFString = SecConstant("irc ")
/// NNTP.
nonisolated(unsafe) public let kSecAttrProtocolNNTP: CFString = SecConstant("nntp")
/// POP3.
nonisolated(unsafe) public let kSecAttrProtocolPOP3: CFString = SecConstant("pop3")
/// SMTP.
nonisolated(unsafe) public let kSecAttrProtocolSMTP: CFString = SecConstant("smtp")
/// SOCKS.
nonisolated(unsafe) public let kSecAttrProtocolSOCKS: CFString = SecConstant("sox ")
/// IMAP.
nonisolated(unsafe) public let kSecAttrProtocolIMAP: CFString = SecConstant("imap")
/// LDAP.
nonisolated(unsafe) public let kSecAttrProtocolLDAP: CFString = SecConstant("ldap")
/// AppleTalk.
nonisolated(unsafe) public let kSecAttrProtocolAppleTalk: CFString = SecConstant("atlk")
/// AFP over TCP.
nonisolated(unsafe) public let kSecAttrProtocolAFP: CFString = SecConstant("afp ")
/// Telnet.
nonisolated(unsafe) public let kSecAttrProtocolTelnet: CFString = SecConstant("teln")
/// SSH.
nonisolated(unsafe) public let kSecAttrProtocolSSH: CFString = SecConstant("ssh ")
/// FTP over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolFTPS: CFString = SecConstant("ftps")
/// HTTP over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolHTTPS: CFString = SecConstant("htps")
/// HTTP proxy.
nonisolated(unsafe) public let kSecAttrProtocolHTTPProxy: CFString = SecConstant("htpx")
/// HTTPS proxy.
nonisolated(unsafe) public let kSecAttrProtocolHTTPSProxy: CFString = SecConstant("htsx")
/// FTP proxy.
nonisolated(unsafe) public let kSecAttrProtocolFTPProxy: CFString = SecConstant("ftpx")
/// SMB.
nonisolated(unsafe) public let kSecAttrProtocolSMB: CFString = SecConstant("smb ")
/// RTSP.
nonisolated(unsafe) public let kSecAttrProtocolRTSP: CFString = SecConstant("rtsp")
/// RTSP proxy.
nonisolated(unsafe) public let kSecAttrProtocolRTSPProxy: CFString = SecConstant("rtsx")
/// DAAP.
nonisolated(unsafe) public let kSecAttrProtocolDAAP: CFString = SecConstant("daap")
/// Remote Apple Events.
nonisolated(unsafe) public let kSecAttrProtocolEPPC: CFString = SecConstant("eppc")
/// IPP.
nonisolated(unsafe) public let kSecAttrProtocolIPP: CFString = SecConstant("ipp ")
/// NNTP over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolNNTPS: CFString = SecConstant("ntps")
/// LDAP over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolLDAPS: CFString = SecConstant("ldps")
/// Telnet over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolTelnetS: CFString = SecConstant("tels")
/// IMAP over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolIMAPS: CFString = SecConstant("imps")
/// IRC over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolIRCS: CFString = SecConstant("ircs")
/// POP3 over TLS/SSL.
nonisolated(unsafe) public let kSecAttrProtocolPOP3S: CFString = SecConstant("pops")

// MARK: Values of kSecAttrAuthenticationType (internet passwords)
/// Windows NT LAN Manager authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeNTLM: CFString = SecConstant("ntlm")
/// Microsoft Network default authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeMSN: CFString = SecConstant("msna")
/// Distributed Password authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeDPA: CFString = SecConstant("dpaa")
/// Remote Password authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeRPA: CFString = SecConstant("rpaa")
/// HTTP Basic authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTTPBasic: CFString = SecConstant("http")
/// HTTP Digest Access authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTTPDigest: CFString = SecConstant("httd")
/// HTML form based authentication.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTMLForm: CFString = SecConstant("form")
/// The default authentication type.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeDefault: CFString = SecConstant("dflt")

// MARK: Values of kSecAttrKeyType (keys)
/// RSA.
nonisolated(unsafe) public let kSecAttrKeyTypeRSA: CFString = SecConstant("42")
/// Elliptic curve (Apple's older name for `kSecAttrKeyTypeECSECPrimeRandom`).
nonisolated(unsafe) public let kSecAttrKeyTypeEC: CFString = SecConstant("73")
/// Elliptic curve on a NIST prime curve.
nonisolated(unsafe) public let kSecAttrKeyTypeECSECPrimeRandom: CFString = SecConstant("73")

// MARK: Values of kSecAttrAccessGroup
/// Apple's group of the items on tokens (smart cards): an ordinary group here, so naming it is
/// `errSecMissingEntitlement` unless the app is registered for it.
nonisolated(unsafe) public let kSecAttrAccessGroupToken: CFString = SecConstant("com.apple.token")

// MARK: Values
/// The secret: `Data` only (a `String` is `errSecParam`, as on Apple platforms).
nonisolated(unsafe) public let kSecValueData: CFString = SecConstant("v_Data")
/// The item's persistent reference (`Data`): a handle that finds the same item again later.
nonisolated(unsafe) public let kSecValuePersistentRef: CFString = SecConstant("v_PersistentRef")
/// A reference object (`SecKey`, `SecCertificate` …), which generic passwords do not have: `errSecParam`.
nonisolated(unsafe) public let kSecValueRef: CFString = SecConstant("v_Ref")

// MARK: Search
/// How many items a copy or search returns: `kSecMatchLimitOne` or `kSecMatchLimitAll`.
nonisolated(unsafe) public let kSecMatchLimit: CFString = SecConstant("m_Limit")
/// Return at most one item (the default for a copy).
nonisolated(unsafe) public let kSecMatchLimitOne: CFString = SecConstant("m_LimitOne")
/// Return every matching item, as an array.
nonisolated(unsafe) public let kSecMatchLimitAll: CFString = SecConstant("m_LimitAll")
/// Accepted; matching stays byte-exact, as in Apple's data-protection keychain.
nonisolated(unsafe) public let kSecMatchCaseInsensitive: CFString = SecConstant("m_CaseInsensitive")
/// Apple's search among given item references: keychaind has none, so it is `errSecParam`.
nonisolated(unsafe) public let kSecMatchItemList: CFString = SecConstant("m_ItemList")
/// Apple's search among given keychains (macOS file keychains): keychaind has one, so it is `errSecParam`.
nonisolated(unsafe) public let kSecMatchSearchList: CFString = SecConstant("m_SearchList")

// MARK: Return types
/// Return the item's secret as `Data`.
nonisolated(unsafe) public let kSecReturnData: CFString = SecConstant("r_Data")
/// Return the item's attributes as a dictionary (with the secret only if `kSecReturnData` is also set).
nonisolated(unsafe) public let kSecReturnAttributes: CFString = SecConstant("r_Attributes")
/// Return the item's persistent reference as `Data`.
nonisolated(unsafe) public let kSecReturnPersistentRef: CFString = SecConstant("r_PersistentRef")
/// Passwords have no reference type on iOS: the key is accepted and returns no object. With
/// `kSecReturnAttributes`, each attribute dictionary then also names the item's class (`kSecClass`),
/// as Apple's, built from the reference, does.
nonisolated(unsafe) public let kSecReturnRef: CFString = SecConstant("r_Ref")

// MARK: Use keys (accepted and ignored by the client, as Apple's client library strips them)
/// A no-op: keychaind always behaves as the data-protection keychain.
nonisolated(unsafe) public let kSecUseDataProtectionKeychain: CFString = SecConstant("nleg")
/// The text Apple shows in the authentication prompt; accepted and ignored here.
nonisolated(unsafe) public let kSecUseOperationPrompt: CFString = SecConstant("u_OpPrompt")
/// Whether authentication UI may be shown: on a locked keychain keychaind asks for the passphrase
/// through pinentry unless this says Fail or Skip (sent to the daemon).
nonisolated(unsafe) public let kSecUseAuthenticationUI: CFString = SecConstant("u_AuthUI")
/// Fail rather than show authentication UI (deprecated by Apple for `kSecUseAuthenticationUI`):
/// true is `kSecUseAuthenticationUIFail` (sent to the daemon).
nonisolated(unsafe) public let kSecUseNoAuthenticationUI: CFString = SecConstant("u_NoAuthUI")
/// Allow authentication UI (a value of `kSecUseAuthenticationUI`; the default).
nonisolated(unsafe) public let kSecUseAuthenticationUIAllow: CFString = SecConstant("u_AuthUIA")
/// Fail with `errSecInteractionNotAllowed` rather than show UI.
nonisolated(unsafe) public let kSecUseAuthenticationUIFail: CFString = SecConstant("u_AuthUIF")
/// Skip items that would need UI: on a locked keychain, as Fail (every item of the locked classes would).
nonisolated(unsafe) public let kSecUseAuthenticationUISkip: CFString = SecConstant("u_AuthUIS")
/// A LocalAuthentication context to reuse for authentication; accepted and ignored here.
nonisolated(unsafe) public let kSecUseAuthenticationContext: CFString = SecConstant("u_AuthCtx")
