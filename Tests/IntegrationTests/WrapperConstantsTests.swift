import Foundation
// Only what iOS code imports, as in PortingTests: every name below comes from `import Security`.
import Security
import XCTest

/// Internet-password options in the style of the popular wrappers (KeychainAccess's `Options.query()`):
/// enums mapped to the `kSec…` constants, a `[String: Any]` built from them.
private struct InternetPasswordOptions {
    enum ProtocolType { case http, https, ftp, ssh }
    enum AuthenticationType { case htmlForm, httpBasic, `default` }

    var server = URL(string: "https://example.com:8443/login")!
    var protocolType = ProtocolType.https
    var authenticationType = AuthenticationType.htmlForm

    func query() -> [String: Any] {
        var query: [String: Any] = [kSecClass as String: kSecClassInternetPassword]
        query[kSecAttrServer as String] = server.host
        query[kSecAttrPort as String] = server.port
        query[kSecAttrPath as String] = server.path
        query[kSecAttrSecurityDomain as String] = "realm"
        query[kSecAttrProtocol as String] = protocolValue
        query[kSecAttrAuthenticationType as String] = authenticationValue
        query[kSecAttrSynchronizable as String] = kSecAttrSynchronizableAny
        return query
    }

    private var protocolValue: CFString {
        switch protocolType {
        case .http: return kSecAttrProtocolHTTP
        case .https: return kSecAttrProtocolHTTPS
        case .ftp: return kSecAttrProtocolFTP
        case .ssh: return kSecAttrProtocolSSH
        }
    }

    private var authenticationValue: String {
        switch authenticationType {
        case .htmlForm: return String(kSecAttrAuthenticationTypeHTMLForm)
        case .httpBasic: return kSecAttrAuthenticationTypeHTTPBasic as String
        case .default: return kSecAttrAuthenticationTypeDefault as String
        }
    }
}

/// The constants wrappers reference beyond generic passwords: they compile, carry Apple's values, and a
/// call that names one gets a clear error from the daemon (or from the client, for keys whose values
/// have no wire form), never a crash.
final class WrapperConstantsTests: SharedConnectionTestCase {
    func testConstantsCarryApplesValues() {
        // Apple's SecItemConstants.c.
        let expected: [(CFString, String)] = [
            (kSecAttrSecurityDomain, "sdmn"), (kSecAttrServer, "srvr"), (kSecAttrProtocol, "ptcl"),
            (kSecAttrAuthenticationType, "atyp"), (kSecAttrPort, "port"), (kSecAttrPath, "path"),
            (kSecAttrApplicationTag, "atag"), (kSecAttrIsExtractable, "extr"), (kSecAttrKeyType, "type"),
            (kSecAttrTokenID, "tkid"), (kSecAttrSyncViewHint, "vwht"), (kSecAttrPersistentReference, "persistref"),
            (kSecAttrAccessGroupToken, "com.apple.token"), (kSecValueRef, "v_Ref"), (kSecMatchItemList, "m_ItemList"),
            (kSecMatchSearchList, "m_SearchList"), (kSecUseNoAuthenticationUI, "u_NoAuthUI"),
            (kSecAttrProtocolFTP, "ftp "), (kSecAttrProtocolFTPAccount, "ftpa"), (kSecAttrProtocolHTTP, "http"),
            (kSecAttrProtocolIRC, "irc "), (kSecAttrProtocolNNTP, "nntp"), (kSecAttrProtocolPOP3, "pop3"),
            (kSecAttrProtocolSMTP, "smtp"), (kSecAttrProtocolSOCKS, "sox "), (kSecAttrProtocolIMAP, "imap"),
            (kSecAttrProtocolLDAP, "ldap"), (kSecAttrProtocolAppleTalk, "atlk"), (kSecAttrProtocolAFP, "afp "),
            (kSecAttrProtocolTelnet, "teln"), (kSecAttrProtocolSSH, "ssh "), (kSecAttrProtocolFTPS, "ftps"),
            (kSecAttrProtocolHTTPS, "htps"), (kSecAttrProtocolHTTPProxy, "htpx"), (kSecAttrProtocolHTTPSProxy, "htsx"),
            (kSecAttrProtocolFTPProxy, "ftpx"), (kSecAttrProtocolSMB, "smb "), (kSecAttrProtocolRTSP, "rtsp"),
            (kSecAttrProtocolRTSPProxy, "rtsx"), (kSecAttrProtocolDAAP, "daap"), (kSecAttrProtocolEPPC, "eppc"),
            (kSecAttrProtocolIPP, "ipp "), (kSecAttrProtocolNNTPS, "ntps"), (kSecAttrProtocolLDAPS, "ldps"),
            (kSecAttrProtocolTelnetS, "tels"), (kSecAttrProtocolIMAPS, "imps"), (kSecAttrProtocolIRCS, "ircs"),
            (kSecAttrProtocolPOP3S, "pops"), (kSecAttrAuthenticationTypeNTLM, "ntlm"),
            (kSecAttrAuthenticationTypeMSN, "msna"), (kSecAttrAuthenticationTypeDPA, "dpaa"),
            (kSecAttrAuthenticationTypeRPA, "rpaa"), (kSecAttrAuthenticationTypeHTTPBasic, "http"),
            (kSecAttrAuthenticationTypeHTTPDigest, "httd"), (kSecAttrAuthenticationTypeHTMLForm, "form"),
            (kSecAttrAuthenticationTypeDefault, "dflt"), (kSecAttrKeyTypeRSA, "42"), (kSecAttrKeyTypeEC, "73"),
            (kSecAttrKeyTypeECSECPrimeRandom, "73"),
        ]
        for (constant, value) in expected {
            XCTAssertEqual(constant as String, value)
            XCTAssertEqual(String(constant), value)
            XCTAssertEqual(AnyHashable(constant), AnyHashable(value), "\(value) hashes as its String")
        }
        XCTAssertEqual(kSecAttrKeyType as String, kSecAttrType as String, "one string, as Apple's")

        // Apple's SecBase.h.
        XCTAssertEqual(errSecInvalidKeychain, -25295)
        XCTAssertEqual(errSecRestrictedAPI, -34020)
        XCTAssertEqual(errSecInvalidOwnerEdit, -25244)
        XCTAssertEqual(
            SecCopyErrorMessageString(errSecInvalidKeychain, nil) as String?,
            "The specified keychain is not a valid keychain file.")
        XCTAssertNotNil(SecCopyErrorMessageString(errSecRestrictedAPI, nil))

        // CFError and CFAllocator as Apple-platform code spells them.
        XCTAssertNil(kCFAllocatorDefault)
        let allocator: CFAllocator? = kCFAllocatorDefault
        XCTAssertNil(allocator)
        var unmanaged: Unmanaged<CFError>? = Unmanaged.passRetained(
            NSError(domain: NSOSStatusErrorDomain, code: Int(errSecParam)))
        let error: CFError? = unmanaged?.takeRetainedValue()
        unmanaged = nil
        XCTAssertEqual((error as Error?).map { ($0 as NSError).code }, Int(errSecParam))
    }

    /// The daemon's one-line message for the last failed call on this thread.
    private func lastMessage(_ status: OSStatus) -> String {
        SecCopyErrorMessageString(status, nil) as String? ?? ""
    }

    private func assertOneLine(_ message: String, contains part: String, line: UInt = #line) {
        XCTAssertTrue(message.contains(part), "\(message) should name \(part)", line: line)
        XCTAssertFalse(message.contains("\n"), "one line: \(message)", line: line)
    }

    func testInternetPasswordsAsIOSCodeWritesThem() {
        // Add, as a login screen does.
        var add = InternetPasswordOptions().query()
        add[kSecAttrSynchronizable as String] = nil
        add[kSecAttrAccount as String] = "alice"
        add[kSecValueData as String] = Data("s3cret".utf8)
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess)
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecDuplicateItem)
        assertOneLine(lastMessage(errSecDuplicateItem), contains: "internet password")

        // Read back by the wrapper's full query, with its attributes as Apple returns them.
        var query = InternetPasswordOptions().query()
        query[kSecAttrAccount as String] = "alice"
        query[kSecReturnData as String] = kCFBooleanTrue!
        query[kSecReturnAttributes as String] = kCFBooleanTrue!
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        var result: CFTypeRef?
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, &result), errSecSuccess)
        let item = result as? [String: Any]
        XCTAssertEqual(item?[kSecValueData as String] as? Data, Data("s3cret".utf8))
        XCTAssertEqual(item?[kSecAttrServer as String] as? String, "example.com")
        XCTAssertEqual(item?[kSecAttrPort as String] as? Int, 8443)
        XCTAssertEqual(item?[kSecAttrPath as String] as? String, "/login")
        XCTAssertEqual(item?[kSecAttrProtocol as String] as? String, kSecAttrProtocolHTTPS as String)
        XCTAssertEqual(
            item?[kSecAttrAuthenticationType as String] as? String, kSecAttrAuthenticationTypeHTMLForm as String)
        XCTAssertEqual(item?[kSecAttrSecurityDomain as String] as? String, "realm")

        // Same server and account on another port or protocol: another item, not a duplicate.
        var otherPort = add
        otherPort[kSecAttrPort as String] = 443
        XCTAssertEqual(SecItemAdd(otherPort as CFDictionary, nil), errSecSuccess)
        var otherProtocol = add
        otherProtocol[kSecAttrProtocol as String] = kSecAttrProtocolHTTP
        XCTAssertEqual(SecItemAdd(otherProtocol as CFDictionary, nil), errSecSuccess)

        // A generic-password query never returns them, and the reverse.
        let genp: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "alice",
            kSecMatchLimit as String: kSecMatchLimitAll, kSecReturnAttributes as String: kCFBooleanTrue!,
        ]
        XCTAssertEqual(SecItemCopyMatching(genp as CFDictionary, nil), errSecItemNotFound)
        XCTAssertEqual(
            SecItemAdd(
                [
                    kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "example.com",
                    kSecAttrAccount as String: "alice", kSecValueData as String: Data("generic".utf8),
                ] as CFDictionary, nil), errSecSuccess)
        let all: [String: Any] = [
            kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: "example.com",
            kSecMatchLimit as String: kSecMatchLimitAll, kSecReturnData as String: kCFBooleanTrue!,
        ]
        XCTAssertEqual(SecItemCopyMatching(all as CFDictionary, &result), errSecSuccess)
        XCTAssertEqual((result as? [Data])?.count, 3)
        XCTAssertFalse((result as? [Data] ?? []).contains(Data("generic".utf8)))

        // Update and delete by the wrapper's query.
        var match = InternetPasswordOptions().query()
        match[kSecAttrAccount as String] = "alice"
        XCTAssertEqual(
            SecItemUpdate(match as CFDictionary, [kSecValueData as String: Data("new".utf8)] as CFDictionary),
            errSecSuccess)
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, &result), errSecSuccess)
        XCTAssertEqual((result as? [String: Any])?[kSecValueData as String] as? Data, Data("new".utf8))
        XCTAssertEqual(SecItemDelete(match as CFDictionary), errSecSuccess)
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, &result), errSecItemNotFound)
        XCTAssertEqual(SecItemCopyMatching(all as CFDictionary, &result), errSecSuccess)
        XCTAssertEqual((result as? [Data])?.count, 2)

        // A generic password's attribute in an internet-password query names itself.
        var wrong = InternetPasswordOptions().query()
        wrong[kSecAttrService as String] = "svc"
        XCTAssertEqual(SecItemCopyMatching(wrong as CFDictionary, nil), errSecNoSuchAttr)
        assertOneLine(lastMessage(errSecNoSuchAttr), contains: "svce")
    }

    func testOtherClassesAndTheirAttributesAreClearErrors() {
        var result: CFTypeRef?
        for itemClass in [kSecClassCertificate, kSecClassKey, kSecClassIdentity] {
            let keyQuery: [String: Any] = [
                kSecClass as String: itemClass, kSecAttrKeyType as String: kSecAttrKeyTypeRSA,
                kSecAttrTokenID as String: "com.apple.setoken",
                kSecAttrApplicationTag as String: Data("com.example.key".utf8),
            ]
            XCTAssertEqual(SecItemCopyMatching(keyQuery as CFDictionary, &result), errSecNoSuchClass)
            assertOneLine(lastMessage(errSecNoSuchClass), contains: "kSecClassInternetPassword")
        }

        // Attributes of the other classes in a generic-password query: errSecNoSuchAttr naming the key.
        let genp: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "s"]
        let foreign: [(CFString, Any)] = [
            (kSecAttrServer, "example.com"), (kSecAttrSecurityDomain, "realm"), (kSecAttrPath, "/login"),
            (kSecAttrPort, 443), (kSecAttrProtocol, kSecAttrProtocolHTTPS),
            (kSecAttrAuthenticationType, kSecAttrAuthenticationTypeHTMLForm),
            (kSecAttrApplicationTag, Data("tag".utf8)), (kSecAttrIsExtractable, kCFBooleanTrue!),
            (kSecAttrTokenID, "com.apple.setoken"), (kSecAttrSyncViewHint, "PCS-MasterKey"),
        ]
        for (key, value) in foreign {
            let q = genp.merging([key as String: value]) { $1 }
            XCTAssertEqual(SecItemCopyMatching(q as CFDictionary, nil), errSecNoSuchAttr, "\(key)")
            assertOneLine(lastMessage(errSecNoSuchAttr), contains: key as String)
            var add = q
            add[kSecValueData as String] = Data("pw".utf8)
            XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecNoSuchAttr, "\(key)")
            XCTAssertEqual(
                SecItemUpdate(genp as CFDictionary, [key as String: value] as CFDictionary), errSecNoSuchAttr,
                "\(key)")
        }
        XCTAssertEqual(SecItemCopyMatching(genp as CFDictionary, nil), errSecItemNotFound, "nothing was stored")
    }

    func testKeysWithoutAWireFormAreErrSecParamNamingThem() {
        XCTAssertEqual(
            SecItemAdd(
                [
                    kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.refs",
                    kSecAttrAccount as String: "a", kSecValueData as String: Data("pw".utf8),
                ] as CFDictionary, nil), errSecSuccess)
        let genp: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.refs",
        ]
        let cases: [(CFString, Any, String)] = [
            (kSecValueRef, NSObject(), "kSecValueRef"), (kSecValueRef, Data("r".utf8), "kSecValueRef"),
            (kSecMatchItemList, [Data("r".utf8)], "kSecMatchItemList"),
            (kSecMatchItemList, [NSObject()] as NSArray, "kSecMatchItemList"),
            (kSecMatchSearchList, [NSObject()], "kSecMatchSearchList"),
            (kSecAttrPersistentReference, Data("r".utf8), "kSecAttrPersistentReference"),
        ]
        for (key, value, name) in cases {
            let q = genp.merging([key as String: value]) { $1 }
            var result: CFTypeRef?
            XCTAssertEqual(SecItemCopyMatching(q as CFDictionary, &result), errSecParam, name)
            assertOneLine(lastMessage(errSecParam), contains: name)
            XCTAssertEqual(SecItemDelete(q as CFDictionary), errSecParam, name)
        }
        XCTAssertEqual(SecItemCopyMatching(genp as CFDictionary, nil), errSecSuccess, "the item is still there")
    }

    func testAcceptedKeysAndValuesBehaveAsOnIOS() throws {
        let genp: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.noui",
            kSecAttrAccount as String: "a",
        ]
        // kSecUseNoAuthenticationUI is accepted; on an unlocked keychain it changes nothing (no prompt is needed).
        var add = genp
        add[kSecValueData as String] = Data("pw".utf8)
        add[kSecUseNoAuthenticationUI as String] = kCFBooleanTrue
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess)
        var q = genp
        q[kSecUseNoAuthenticationUI as String] = true
        q[kSecReturnData as String] = true
        var result: CFTypeRef?
        XCTAssertEqual(SecItemCopyMatching(q as CFDictionary, &result), errSecSuccess)
        XCTAssertEqual(result as? Data, Data("pw".utf8))

        // kSecAttrKeyType is kSecAttrType's string: in a generic-password query "42" is the type 42.
        q[kSecAttrKeyType as String] = kSecAttrKeyTypeRSA
        XCTAssertEqual(SecItemCopyMatching(q as CFDictionary, &result), errSecItemNotFound)
        XCTAssertEqual(
            SecItemUpdate(genp as CFDictionary, [kSecAttrType as String: 42] as CFDictionary), errSecSuccess)
        XCTAssertEqual(SecItemCopyMatching(q as CFDictionary, &result), errSecSuccess)

        // The token group is an ordinary group the test app is not registered for.
        let token = genp.merging([kSecAttrAccessGroup as String: kSecAttrAccessGroupToken]) { $1 }
        XCTAssertEqual(SecItemCopyMatching(token as CFDictionary, nil), errSecMissingEntitlement)
        assertOneLine(lastMessage(errSecMissingEntitlement), contains: "agrp")
    }

    /// Access control compiles as the wrappers write it, and no call carrying a constraint keychaind
    /// cannot enforce (biometry) stores anything.
    func testAccessControlCompilesAndUnsupportedConstraintsAreErrSecUnimplemented() throws {
        XCTAssertEqual(kSecAttrAccessControl as String, "accc")
        XCTAssertEqual(SecAccessControlCreateFlags.userPresence.rawValue, 1 << 0)
        XCTAssertEqual(SecAccessControlCreateFlags.biometryAny, .touchIDAny)
        XCTAssertEqual(SecAccessControlCreateFlags.biometryCurrentSet.rawValue, 1 << 3)
        XCTAssertEqual(SecAccessControlCreateFlags.devicePasscode.rawValue, 1 << 4)
        XCTAssertEqual(SecAccessControlCreateFlags.or.rawValue, 1 << 14)
        XCTAssertEqual(SecAccessControlCreateFlags.applicationPassword.rawValue, 1 << 31)

        // KeychainAccess's spelling: an Unmanaged<CFError> out-parameter, then the CFError getters.
        var error: Unmanaged<CFError>?
        let flags = SecAccessControlCreateFlags(
            rawValue: CFOptionFlags(SecAccessControlCreateFlags.userPresence.rawValue))
        let control = try XCTUnwrap(
            SecAccessControlCreateWithFlags(
                kCFAllocatorDefault, kSecAttrAccessibleWhenUnlocked as String as CFTypeRef, flags, &error))
        XCTAssertNil(error)
        // Valet's spelling: into a [String: AnyHashable] query, for every operation.
        var query: [String: AnyHashable] = [
            kSecClass as String: kSecClassGenericPassword as String, kSecAttrService as String: "com.example.acl",
            kSecAttrAccount as String: "a",
        ]
        query[kSecAttrAccessControl as String] = SecAccessControlCreateWithFlags(
            nil, kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly, .biometryCurrentSet, nil)
        XCTAssertNotNil(query[kSecAttrAccessControl as String], "created, so a wrapper cannot drop it silently")
        var add = query
        add[kSecValueData as String] = Data("pw".utf8)
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecUnimplemented)
        assertOneLine(lastMessage(errSecUnimplemented), contains: "kSecAttrAccessControl")
        assertOneLine(lastMessage(errSecUnimplemented), contains: "biometryCurrentSet")
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, nil), errSecUnimplemented)
        XCTAssertEqual(SecItemDelete(query as CFDictionary), errSecUnimplemented)
        let biometry: [String: Any] = [
            kSecAttrAccessControl as String: SecAccessControlCreateWithFlags(
                nil, kSecAttrAccessibleWhenUnlocked, .biometryAny, nil)!
        ]
        query[kSecAttrAccessControl as String] = nil
        XCTAssertEqual(SecItemUpdate(query as CFDictionary, biometry as CFDictionary), errSecUnimplemented)
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, nil), errSecItemNotFound, "nothing was stored")
        let attributes: [String: Any] = [kSecAttrAccessControl as String: control]
        XCTAssertTrue((attributes[kSecAttrAccessControl as String] as! SecAccessControl) === control)

        // Without constraints an access control only names a protection class: it is that
        // kSecAttrAccessible (the CFString constant, as wrappers pass it), stored and read back.
        let plain = try XCTUnwrap(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleAfterFirstUnlock, [], nil))
        var plainAdd: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.acl",
            kSecAttrAccount as String: "plain", kSecValueData as String: Data("pw".utf8),
            kSecAttrAccessControl as String: plain,
        ]
        XCTAssertEqual(SecItemAdd(plainAdd as CFDictionary, nil), errSecSuccess, lastMessage(errSecSuccess))
        let readBack: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.acl",
            kSecAttrAccount as String: "plain", kSecReturnAttributes as String: true,
        ]
        var found: CFTypeRef?
        XCTAssertEqual(SecItemCopyMatching(readBack as CFDictionary, &found), errSecSuccess)
        XCTAssertEqual((found as? [String: Any])?[kSecAttrAccessible as String] as? String, "ck")
        plainAdd[kSecAttrAccount as String] = "both"
        plainAdd[kSecAttrAccessible as String] = kSecAttrAccessibleWhenUnlocked
        XCTAssertEqual(SecItemAdd(plainAdd as CFDictionary, nil), errSecParam, "both keys at once")
        // .userPresence travels with the item, for the daemon to ask the person when it is read
        // (clients/python/tests/test_presence.py); it needs a keychain passphrase, and none is set here.
        plainAdd[kSecAttrAccessible as String] = nil
        plainAdd[kSecAttrAccessControl as String] = control
        plainAdd[kSecAttrAccount as String] = "presence"
        XCTAssertEqual(SecItemAdd(plainAdd as CFDictionary, nil), errSecAuthFailed)
        assertOneLine(lastMessage(errSecAuthFailed), contains: "passphrase")

        let cfError: CFError = NSError(
            domain: NSOSStatusErrorDomain, code: Int(errSecParam), userInfo: [NSLocalizedDescriptionKey: "bad"])
        XCTAssertEqual(CFErrorGetDomain(cfError) as String, NSOSStatusErrorDomain)
        XCTAssertEqual(CFErrorGetCode(cfError), CFIndex(errSecParam))
        XCTAssertEqual((CFErrorCopyUserInfo(cfError) as! [String: Any])[NSLocalizedDescriptionKey] as? String, "bad")
        XCTAssertEqual(CFErrorCopyDescription(cfError) as String, "bad")
    }
}
