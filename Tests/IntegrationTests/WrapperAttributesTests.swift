import Foundation
// Only what iOS code imports: every name below comes from `import Security`.
import Security
import XCTest

/// What a wrapper's "everything about this item" call reads back (KeychainAccess's `get(_:handler:)`
/// and its `Attributes`): one query asking for the data, the attributes, the reference and the
/// persistent reference at once, each attribute read with the Swift type iOS code casts it to.
final class WrapperAttributesTests: SharedConnectionTestCase {
    private let server = "login.example.com"

    /// The query such a wrapper builds from `Keychain(server: "https://login.example.com:443/…",
    /// protocolType: .https)`: server, port, protocol and authentication type, any synchronizable.
    private func query(account: String) -> [String: Any] {
        [
            kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: server,
            kSecAttrPort as String: 443, kSecAttrProtocol as String: kSecAttrProtocolHTTPS as String,
            kSecAttrAuthenticationType as String: kSecAttrAuthenticationTypeDefault as String,
            kSecAttrSynchronizable as String: kSecAttrSynchronizableAny, kSecAttrAccount as String: account,
        ]
    }

    private func everything(account: String) -> (OSStatus, [String: Any]?) {
        var q = query(account: account)
        q[kSecMatchLimit as String] = kSecMatchLimitOne
        q[kSecReturnData as String] = kCFBooleanTrue
        q[kSecReturnAttributes as String] = kCFBooleanTrue
        q[kSecReturnRef as String] = kCFBooleanTrue
        q[kSecReturnPersistentRef as String] = kCFBooleanTrue
        var result: AnyObject?
        let status = SecItemCopyMatching(q as CFDictionary, &result)
        return (status, result as? [String: Any])
    }

    func testEverythingAboutAnInternetPasswordReadsBackAsOnIOS() throws {
        XCTAssertEqual(everything(account: "kate").0, errSecItemNotFound)

        var add = query(account: "kate")
        add[kSecAttrSynchronizable as String] = kCFBooleanFalse
        add[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlock as String
        add[kSecAttrDescription as String] = "web form password"
        add[kSecAttrComment as String] = "set up at first login"
        add[kSecAttrLabel as String] = "login.example.com (kate)"
        add[kSecAttrIsInvisible as String] = true
        add[kSecAttrIsNegative as String] = false
        add[kSecAttrSecurityDomain as String] = "staff"
        add[kSecValueData as String] = Data("pw-1".utf8)
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess)

        let (status, found) = everything(account: "kate")
        XCTAssertEqual(status, errSecSuccess)
        let item = try XCTUnwrap(found)
        // With kSecReturnRef the dictionary names the item's class, as iOS's does.
        XCTAssertEqual(item[kSecClass as String] as? String, kSecClassInternetPassword as String)
        XCTAssertEqual(item[kSecValueData as String] as? Data, Data("pw-1".utf8))
        XCTAssertNil(item[kSecValueRef as String] as? Data, "passwords have no reference object")
        XCTAssertNotNil(item[kSecValuePersistentRef as String] as? Data)
        XCTAssertEqual(item[kSecAttrAccessible as String] as? String, kSecAttrAccessibleAfterFirstUnlock as String)
        XCTAssertEqual(item[kSecAttrAccessGroup as String] as? String, "TEAM.tests")
        XCTAssertEqual(item[kSecAttrSynchronizable as String] as? Bool, false)
        let created = try XCTUnwrap(item[kSecAttrCreationDate as String] as? Date)
        let modified = try XCTUnwrap(item[kSecAttrModificationDate as String] as? Date)
        XCTAssertEqual(item[kSecAttrDescription as String] as? String, "web form password")
        XCTAssertEqual(item[kSecAttrComment as String] as? String, "set up at first login")
        XCTAssertEqual(item[kSecAttrLabel as String] as? String, "login.example.com (kate)")
        XCTAssertEqual(item[kSecAttrIsInvisible as String] as? Bool, true)
        XCTAssertEqual(item[kSecAttrIsNegative as String] as? Bool, false)
        XCTAssertEqual(item[kSecAttrAccount as String] as? String, "kate")
        XCTAssertNil(item[kSecAttrService as String], "an internet password has no service")
        XCTAssertNil(item[kSecAttrGeneric as String])
        XCTAssertEqual(item[kSecAttrSecurityDomain as String] as? String, "staff")
        XCTAssertEqual(item[kSecAttrServer as String] as? String, server)
        XCTAssertEqual(item[kSecAttrProtocol as String] as? String, kSecAttrProtocolHTTPS as String)
        XCTAssertEqual(
            item[kSecAttrAuthenticationType as String] as? String, kSecAttrAuthenticationTypeDefault as String)
        XCTAssertEqual(item[kSecAttrPort as String] as? Int, 443)
        XCTAssertEqual(item[kSecAttrPath as String] as? String, "", "a path never given reads back empty")

        // The wrapper's update: the secret and one attribute by the same query; the rest stays.
        var match = query(account: "kate")
        match[kSecAttrSynchronizable as String] = nil
        let change: [String: Any] = [
            kSecValueData as String: Data("pw-2".utf8), kSecAttrDescription as String: "updated description",
            kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlock as String,
            kSecAttrSynchronizable as String: kCFBooleanFalse!,
        ]
        XCTAssertEqual(SecItemUpdate(match as CFDictionary, change as CFDictionary), errSecSuccess)
        let updated = try XCTUnwrap(everything(account: "kate").1)
        XCTAssertEqual(updated[kSecValueData as String] as? Data, Data("pw-2".utf8))
        XCTAssertEqual(updated[kSecAttrDescription as String] as? String, "updated description")
        XCTAssertEqual(updated[kSecAttrComment as String] as? String, "set up at first login")
        XCTAssertEqual(updated[kSecAttrLabel as String] as? String, "login.example.com (kate)")
        XCTAssertEqual(updated[kSecAttrCreationDate as String] as? Date, created)
        XCTAssertGreaterThan(try XCTUnwrap(updated[kSecAttrModificationDate as String] as? Date), modified)
        XCTAssertEqual(updated[kSecClass as String] as? String, kSecClassInternetPassword as String)

        // Every item of a kSecMatchLimitAll answer names it too, however the result is cast.
        var all = query(account: "kate")
        all[kSecAttrAccount as String] = nil
        all[kSecMatchLimit as String] = kSecMatchLimitAll
        all[kSecReturnAttributes as String] = kCFBooleanTrue
        all[kSecReturnRef as String] = kCFBooleanTrue
        var result: CFTypeRef?
        XCTAssertEqual(SecItemCopyMatching(all as CFDictionary, &result), errSecSuccess)
        let items = try XCTUnwrap(result as? NSArray)
        XCTAssertEqual(items.count, 1)
        XCTAssertEqual((items.firstObject as? NSDictionary)?[kSecClass] as? String, "inet")
    }

    /// Without kSecReturnRef the attributes are the item's own, as on iOS: no class entry.
    func testAttributesWithoutTheReferenceFlagCarryNoClass() throws {
        var add = query(account: "lee")
        add[kSecAttrSynchronizable as String] = nil
        add[kSecValueData as String] = Data("pw".utf8)
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess)
        var q = query(account: "lee")
        q[kSecReturnAttributes as String] = true
        var result: AnyObject?
        XCTAssertEqual(SecItemCopyMatching(q as CFDictionary, &result), errSecSuccess)
        let item = try XCTUnwrap(result as? [String: Any])
        XCTAssertEqual(item[kSecAttrAccount as String] as? String, "lee")
        XCTAssertNil(item[kSecClass as String])
    }

    /// A wrapper's listing (KeychainAccess's `allItems()` and class-wide `allKeys(.internetPassword)`):
    /// every internet password of a server, synchronizable or not, with the attributes it prints,
    /// and the class-wide listing beside a generic password of the same name.
    func testListingInternetPasswordsOfEveryProtectionAndSyncState() throws {
        let items: [(String, CFString, Bool)] = [
            ("key1", kSecAttrAccessibleAlwaysThisDeviceOnly, false), ("key2", kSecAttrAccessibleAlways, true),
            ("key3", kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly, false),
        ]
        for (account, protection, sync) in items {
            var add = query(account: account)
            add[kSecAttrSynchronizable as String] = sync ? kCFBooleanTrue : kCFBooleanFalse
            add[kSecAttrAccessible as String] = protection as String
            add[kSecValueData as String] = Data("\(account)-value".utf8)
            XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess, account)
        }
        let generic: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: server,
            kSecAttrAccount as String: "key4", kSecValueData as String: Data("g".utf8),
        ]
        XCTAssertEqual(SecItemAdd(generic as CFDictionary, nil), errSecSuccess)

        var list = query(account: "")
        list[kSecAttrAccount as String] = nil
        list[kSecMatchLimit as String] = kSecMatchLimitAll
        list[kSecReturnAttributes as String] = kCFBooleanTrue
        var result: AnyObject?
        XCTAssertEqual(SecItemCopyMatching(list as CFDictionary, &result), errSecSuccess)
        let listed = try XCTUnwrap(result as? [[String: Any]]).sorted {
            ($0[kSecAttrAccount as String] as? String ?? "") < ($1[kSecAttrAccount as String] as? String ?? "")
        }
        XCTAssertEqual(listed.map { $0[kSecAttrAccount as String] as? String }, ["key1", "key2", "key3"])
        for (item, (_, protection, sync)) in zip(listed, items) {
            XCTAssertEqual(item[kSecAttrServer as String] as? String, server)
            XCTAssertEqual(item[kSecAttrProtocol as String] as? String, kSecAttrProtocolHTTPS as String)
            XCTAssertEqual(
                item[kSecAttrAuthenticationType as String] as? String, kSecAttrAuthenticationTypeDefault as String)
            XCTAssertEqual(item[kSecAttrAccessible as String] as? String, protection as String)
            XCTAssertEqual(item[kSecAttrSynchronizable as String] as? Bool, sync)
            XCTAssertNil(item[kSecValueData as String], "no secret unless asked for")
        }

        let everyInternetPassword: [String: Any] = [
            kSecClass as String: kSecClassInternetPassword, kSecAttrSynchronizable as String: kSecAttrSynchronizableAny,
            kSecMatchLimit as String: kSecMatchLimitAll, kSecReturnAttributes as String: kCFBooleanTrue!,
        ]
        XCTAssertEqual(SecItemCopyMatching(everyInternetPassword as CFDictionary, &result), errSecSuccess)
        let accounts = try XCTUnwrap(result as? [[String: Any]]).compactMap { $0[kSecAttrAccount as String] as? String }
        XCTAssertEqual(accounts.sorted(), ["key1", "key2", "key3"], "the generic password is not listed")
    }
}
