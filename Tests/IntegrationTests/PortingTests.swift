import Foundation
// Only what iOS code imports: everything below must compile with `import Security` as on Apple
// platforms, without naming KeychainServices or any module under it.
import Security
import XCTest

/// A wrapper in the style of the widely used ones that key items by `Data` accounts: every query
/// carries `kSecAttrAccount` (and `kSecAttrGeneric`) as the key's UTF-8 bytes, constants are kept as
/// `String`s, and `allKeys` reads `[[AnyHashable: Any]]` results indexed both ways.
private final class DataKeyedWrapper {
    private let classKey = kSecClass as String
    private let serviceKey = kSecAttrService as String
    private let accountKey = kSecAttrAccount as String
    private let genericKey = kSecAttrGeneric as String
    private let valueKey = kSecValueData as String
    let service: String
    let accessGroup: String?

    init(service: String, accessGroup: String? = nil) {
        self.service = service
        self.accessGroup = accessGroup
    }

    private func query(forKey key: String) -> [String: Any] {
        var q: [String: Any] = [classKey: kSecClassGenericPassword, serviceKey: service]
        let encoded = key.data(using: .utf8)
        q[accountKey] = encoded
        q[genericKey] = encoded
        if let accessGroup { q[kSecAttrAccessGroup as String] = accessGroup }
        return q
    }

    @discardableResult
    func set(_ value: String, forKey key: String) -> Bool {
        var add = query(forKey: key)
        add[valueKey] = value.data(using: .utf8)
        add[kSecAttrAccessible as String] = kSecAttrAccessibleWhenUnlocked
        let status = SecItemAdd(add as CFDictionary, nil)
        if status == errSecDuplicateItem {
            let change: [String: Any] = [valueKey: value.data(using: .utf8)!]
            return SecItemUpdate(query(forKey: key) as CFDictionary, change as CFDictionary) == errSecSuccess
        }
        return status == errSecSuccess
    }

    func string(forKey key: String) -> String? {
        var q = query(forKey: key)
        q[kSecMatchLimit as String] = kSecMatchLimitOne
        q[kSecReturnData as String] = kCFBooleanTrue
        var result: AnyObject?
        guard SecItemCopyMatching(q as CFDictionary, &result) == noErr, let data = result as? Data else { return nil }
        return String(data: data, encoding: .utf8)
    }

    @discardableResult
    func removeObject(forKey key: String) -> Bool {
        SecItemDelete(query(forKey: key) as CFDictionary) == errSecSuccess
    }

    func allKeys() -> Set<String> {
        var q: [String: Any] = [
            classKey: kSecClassGenericPassword, serviceKey: service,
            kSecReturnAttributes as String: kCFBooleanTrue!, kSecMatchLimit as String: kSecMatchLimitAll,
        ]
        if let accessGroup { q[kSecAttrAccessGroup as String] = accessGroup }
        var result: AnyObject?
        guard SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess else { return [] }
        var keys = Set<String>()
        for attributes in result as? [[AnyHashable: Any]] ?? [] {
            if let data = attributes[accountKey] as? Data, let key = String(data: data, encoding: .utf8) {
                keys.insert(key)
            } else if let data = attributes[kSecAttrAccount] as? Data, let key = String(data: data, encoding: .utf8) {
                keys.insert(key)
            }
        }
        return keys
    }

    @discardableResult
    func removeAllKeys() -> Bool {
        var q: [String: Any] = [classKey: kSecClassGenericPassword, serviceKey: service]
        if let accessGroup { q[kSecAttrAccessGroup as String] = accessGroup }
        return SecItemDelete(q as CFDictionary) == errSecSuccess
    }
}

/// Foundation's `Operation` must stay Foundation's when an app imports Security too.
private final class CountingJob: Operation, @unchecked Sendable {
    private let done: NSLock = NSLock()
    private(set) var ran = false
    override func main() { done.withLock { ran = true } }
}

/// iOS keychain code as written for Apple platforms, against the real daemon.
final class PortingTests: SharedConnectionTestCase {
    private func add(_ attributes: [String: Any]) -> OSStatus {
        var a = attributes
        a[kSecClass as String] = kSecClassGenericPassword
        return SecItemAdd(a as CFDictionary, nil)
    }

    private func copy(_ query: [String: Any]) -> (OSStatus, CFTypeRef?) {
        var q = query
        q[kSecClass as String] = kSecClassGenericPassword
        var result: CFTypeRef?
        let status = SecItemCopyMatching(q as CFDictionary, &result)
        return (status, result)
    }

    /// KeychainAccess's `removeAll()`: on every platform but iOS (Linux included) it adds
    /// kSecMatchLimitAll to the delete, which macOS accepts; it failed with errSecParam here.
    func testARemoveAllThatAddsMatchLimitAllWorksUnchanged() {
        for account in ["a", "b"] {
            let add: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.removeall",
                kSecAttrAccount as String: account, kSecValueData as String: Data("x".utf8),
            ]
            XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess)
        }
        var query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.removeall",
        ]
        #if !os(iOS) && !os(watchOS) && !os(tvOS)
            query[kSecMatchLimit as String] = kSecMatchLimitAll
        #endif
        XCTAssertEqual(SecItemDelete(query as CFDictionary), errSecSuccess)
        XCTAssertEqual(copy([kSecAttrService as String: "com.example.removeall"]).0, errSecItemNotFound)
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        XCTAssertEqual(SecItemDelete(query as CFDictionary), errSecParam, "other limits stay as on iOS")
    }

    func testAWrapperThatKeysItemsByDataAccountsWorksUnchanged() {
        let wrapper = DataKeyedWrapper(service: "com.example.wrapper")
        XCTAssertNil(wrapper.string(forKey: "token"))
        XCTAssertTrue(wrapper.set("first", forKey: "token"))
        XCTAssertEqual(wrapper.string(forKey: "token"), "first")
        XCTAssertTrue(wrapper.set("second", forKey: "token"), "add → duplicate → update")
        XCTAssertEqual(wrapper.string(forKey: "token"), "second")
        XCTAssertTrue(wrapper.set("x", forKey: "refresh"))
        XCTAssertEqual(wrapper.allKeys(), ["token", "refresh"])
        XCTAssertTrue(wrapper.removeObject(forKey: "token"))
        XCTAssertFalse(wrapper.removeObject(forKey: "token"))
        XCTAssertNil(wrapper.string(forKey: "token"))
        XCTAssertEqual(wrapper.allKeys(), ["refresh"])
        let shared = DataKeyedWrapper(service: "com.example.wrapper", accessGroup: "TEAM.shared")
        XCTAssertTrue(shared.set("in shared", forKey: "token"))
        XCTAssertEqual(shared.allKeys(), ["token"])
        XCTAssertTrue(wrapper.removeAllKeys())
        XCTAssertEqual(wrapper.allKeys(), [], "without a group, removeAll spans the app's groups")
    }

    func testBlobAttributesReadBackWithTheTypeTheyWereWrittenWith() throws {
        let nonUTF8 = Data([0xFF, 0x00, 0xFE])
        XCTAssertEqual(
            add([
                kSecAttrService as String: Data("com.example.blob".utf8), kSecAttrAccount as String: nonUTF8,
                kSecAttrLabel as String: Data("label".utf8), kSecAttrDescription as String: "kind",
                kSecAttrComment as String: Data("comment".utf8), kSecAttrGeneric as String: "generic text",
                kSecValueData as String: Data("s".utf8),
            ]), errSecSuccess)
        let (status, result) = copy([
            kSecAttrService as String: "com.example.blob", kSecReturnAttributes as String: true,
        ])
        XCTAssertEqual(status, errSecSuccess)
        let attrs = try XCTUnwrap(result as? [String: Any])
        XCTAssertEqual(attrs[kSecAttrService as String] as? Data, Data("com.example.blob".utf8))
        XCTAssertNil(attrs[kSecAttrService as String] as? String, "Data stays Data, as on iOS")
        XCTAssertEqual(attrs[kSecAttrAccount as String] as? Data, nonUTF8)
        XCTAssertEqual(attrs[kSecAttrLabel as String] as? Data, Data("label".utf8))
        XCTAssertEqual(attrs[kSecAttrDescription as String] as? String, "kind")
        XCTAssertEqual(attrs[kSecAttrComment as String] as? Data, Data("comment".utf8))
        XCTAssertEqual(attrs[kSecAttrGeneric as String] as? String, "generic text", "a String generic stays a String")
        XCTAssertEqual((attrs[kSecAttrAccount as String] as? NSData)?.length, 3)
        // Not a string or data: errSecParam naming the key, as before anything reaches the daemon.
        XCTAssertEqual(
            add([kSecAttrService as String: "s", kSecAttrAccount as String: Date(), kSecValueData as String: Data()]),
            errSecParam)
        XCTAssertTrue((SecCopyErrorMessageString(errSecParam, nil) as String?)?.contains("kSecAttrAccount") ?? false)
    }

    func testStringAndDataWithTheSameBytesAreTheSameValue() throws {
        let service = "com.example.samebytes"
        XCTAssertEqual(
            add([
                kSecAttrService as String: service, kSecAttrAccount as String: Data("alice".utf8),
                kSecValueData as String: Data("pw".utf8),
            ]), errSecSuccess)
        // A String query finds the item written with Data, and the other way round.
        XCTAssertEqual(
            copy([
                kSecAttrService as String: service, kSecAttrAccount as String: "alice",
                kSecReturnData as String: true,
            ]).1 as? Data, Data("pw".utf8))
        XCTAssertEqual(
            copy([kSecAttrService as String: Data(service.utf8), kSecAttrAccount as String: Data("alice".utf8)]).0,
            errSecSuccess)
        // One uniqueness key: the String spelling is a duplicate.
        XCTAssertEqual(
            add([
                kSecAttrService as String: service, kSecAttrAccount as String: "alice",
                kSecValueData as String: Data("other".utf8),
            ]), errSecDuplicateItem)
        // Renaming the account to a String changes what comes back.
        XCTAssertEqual(
            SecItemUpdate(
                [
                    kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service,
                    kSecAttrAccount as String: "alice",
                ] as CFDictionary,
                [kSecAttrAccount as String: "alice"] as CFDictionary), errSecSuccess)
        let attrs = try XCTUnwrap(
            copy([kSecAttrService as String: service, kSecReturnAttributes as String: true]).1 as? [String: Any])
        XCTAssertEqual(attrs[kSecAttrAccount as String] as? String, "alice")
        XCTAssertEqual(
            SecItemDelete(
                [
                    kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service,
                    kSecAttrAccount as String: Data("alice".utf8),
                ] as CFDictionary), errSecSuccess)
        XCTAssertEqual(copy([kSecAttrService as String: service]).0, errSecItemNotFound)
    }

    /// Every way iOS code reads one item's attributes, keyed by the constants.
    func testResultDictionariesIndexedEveryWayIOSCodeDoes() throws {
        XCTAssertEqual(
            add([
                kSecAttrService as String: "com.example.shapes", kSecAttrAccount as String: "alice",
                kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlock,
                kSecValueData as String: Data("s3cret".utf8),
            ]), errSecSuccess)
        let (status, result) = copy([
            kSecAttrService as String: "com.example.shapes", kSecReturnAttributes as String: true,
            kSecReturnData as String: true,
        ])
        XCTAssertEqual(status, errSecSuccess)

        let strings = try XCTUnwrap(result as? [String: Any])
        XCTAssertEqual(strings[kSecAttrAccount as String] as? String, "alice")
        let objects = try XCTUnwrap(result as? [String: AnyObject])
        XCTAssertEqual(objects[kSecAttrAccount as String] as? String, "alice")

        let hashables = try XCTUnwrap(result as? [AnyHashable: Any])
        XCTAssertEqual(hashables[kSecAttrAccount] as? String, "alice", "a constant finds the String key")
        XCTAssertEqual(hashables[kSecAttrAccount as String] as? String, "alice")
        XCTAssertEqual(hashables["acct"] as? String, "alice")
        XCTAssertEqual(hashables[kSecValueData] as? Data, Data("s3cret".utf8))
        XCTAssertTrue(hashables.keys.contains(kSecAttrService))
        XCTAssertEqual(AnyHashable(kSecAttrAccount), AnyHashable("acct"))

        let nsDictionary = try XCTUnwrap(result as? NSDictionary)
        XCTAssertEqual(nsDictionary[kSecAttrAccount] as? String, "alice")
        XCTAssertEqual(nsDictionary.object(forKey: kSecAttrAccount) as? String, "alice")
        XCTAssertEqual(nsDictionary[kSecAttrAccount as String] as? String, "alice")

        let cfDictionary = result as! CFDictionary
        let cfKeyed = try XCTUnwrap(cfDictionary as? [CFString: Any])
        XCTAssertEqual(cfKeyed[kSecAttrAccount] as? String, "alice")
        XCTAssertEqual(cfKeyed[kSecValueData] as? Data, Data("s3cret".utf8))
        XCTAssertEqual((cfDictionary as NSDictionary)[kSecAttrAccount] as? String, "alice")
        let nsKeyed = try XCTUnwrap(result as? [NSString: AnyObject])
        XCTAssertEqual(nsKeyed[kSecAttrAccount] as? String, "alice")

        // Constants as values.
        XCTAssertEqual(strings[kSecAttrAccessible as String] as? String, kSecAttrAccessibleAfterFirstUnlock as String)
        XCTAssertTrue(hashables[kSecAttrAccessible] as? CFString == kSecAttrAccessibleAfterFirstUnlock)
        XCTAssertTrue((nsDictionary[kSecAttrAccessible] as! CFString) == kSecAttrAccessibleAfterFirstUnlock)
        XCTAssertTrue((cfKeyed[kSecAttrAccessible] as? NSObject)?.isEqual(kSecAttrAccessibleAfterFirstUnlock) ?? false)
        XCTAssertEqual(hashables[kSecAttrAccessible] as? AnyHashable, AnyHashable(kSecAttrAccessibleAfterFirstUnlock))
        XCTAssertTrue(
            Set<AnyHashable>([kSecAttrAccessibleAfterFirstUnlock, kSecAttrAccessibleWhenUnlocked])
                .contains(AnyHashable(strings[kSecAttrAccessible as String] as! String)))
        XCTAssertFalse(hashables[kSecAttrAccessible] as? CFString == kSecAttrAccessibleWhenUnlocked)
    }

    func testArrayResultsIndexedEveryWay() throws {
        for account in ["a", "b"] {
            XCTAssertEqual(
                add([
                    kSecAttrService as String: "com.example.arrays", kSecAttrAccount as String: account,
                    kSecValueData as String: Data(account.utf8),
                ]), errSecSuccess)
        }
        let (status, result) = copy([
            kSecAttrService as String: "com.example.arrays", kSecReturnAttributes as String: true,
            kSecMatchLimit as String: kSecMatchLimitAll,
        ])
        XCTAssertEqual(status, errSecSuccess)
        let hashables = try XCTUnwrap(result as? [[AnyHashable: Any]])
        XCTAssertEqual(Set(hashables.compactMap { $0[kSecAttrAccount] as? String }), ["a", "b"])
        let nsDictionaries = try XCTUnwrap(result as? [NSDictionary])
        XCTAssertEqual(Set(nsDictionaries.compactMap { $0[kSecAttrAccount] as? String }), ["a", "b"])
        let cfKeyed = try XCTUnwrap(result as? [[CFString: Any]])
        XCTAssertEqual(Set(cfKeyed.compactMap { $0[kSecAttrAccount] as? String }), ["a", "b"])
        let strings = try XCTUnwrap(result as? [[String: Any]])
        XCTAssertEqual(Set(strings.compactMap { $0[kSecAttrAccount as String] as? String }), ["a", "b"])
        let array = try XCTUnwrap(result as? NSArray)
        XCTAssertEqual(array.count, 2)
        XCTAssertNotNil((array.firstObject as? [AnyHashable: Any])?[kSecAttrService])
    }

    /// Queries spelled every way: constants as keys of `[AnyHashable: Any]`, `[CFString: Any]`,
    /// `NSMutableDictionary`, with constants as values.
    func testQueriesBuiltEveryWay() throws {
        let hashable: [AnyHashable: Any] = [
            kSecClass: kSecClassGenericPassword, kSecAttrService: "com.example.queries",
            kSecAttrAccount: "alice", kSecValueData: Data("1".utf8),
            kSecAttrAccessible: kSecAttrAccessibleAlwaysThisDeviceOnly,
        ]
        XCTAssertEqual(SecItemAdd(hashable as CFDictionary, nil), errSecSuccess)
        let cfKeyed: [CFString: Any] = [
            kSecClass: kSecClassGenericPassword, kSecAttrService: "com.example.queries",
            kSecReturnAttributes: kCFBooleanTrue!, kSecMatchLimit: kSecMatchLimitOne,
        ]
        var item: CFTypeRef?
        XCTAssertEqual(SecItemCopyMatching(cfKeyed as CFDictionary, &item), errSecSuccess)
        XCTAssertEqual((item as? [AnyHashable: Any])?[kSecAttrAccessible] as? String, "dku")
        let mutable = NSMutableDictionary()
        mutable[kSecClass] = kSecClassGenericPassword
        mutable[kSecAttrService] = "com.example.queries"
        mutable[kSecReturnData] = kCFBooleanTrue
        XCTAssertEqual(SecItemCopyMatching(mutable, &item), errSecSuccess)
        XCTAssertEqual(item as? Data, Data("1".utf8))
        XCTAssertEqual(
            SecItemDelete(
                [kSecClass: kSecClassGenericPassword, kSecAttrService: "com.example.queries"] as CFDictionary),
            errSecSuccess)
    }

    /// What was confirmed to match Apple before stays so through `import Security`.
    func testWhatWasConfirmedToMatchAppleStillDoes() throws {
        let base: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.confirmed",
            kSecAttrAccount as String: "a",
        ]
        func with(_ extra: [String: Any]) -> CFDictionary { base.merging(extra) { $1 } as CFDictionary }
        // akpu without a passphrase is refused, as on a device without a passcode.
        XCTAssertEqual(
            SecItemAdd(
                with([
                    kSecValueData as String: Data("x".utf8),
                    kSecAttrAccessible as String: kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly,
                ]), nil),
            errSecAuthFailed)
        XCTAssertEqual(SecItemAdd(with([kSecValueData as String: Data("plain".utf8)]), nil), errSecSuccess)
        XCTAssertEqual(SecItemAdd(with([kSecValueData as String: Data("again".utf8)]), nil), errSecDuplicateItem)
        // A synchronizable twin is another item; plain queries see only the non-synchronizable one.
        XCTAssertEqual(
            SecItemAdd(
                with([kSecValueData as String: Data("synced".utf8), kSecAttrSynchronizable as String: true]), nil),
            errSecSuccess)
        var item: CFTypeRef?
        XCTAssertEqual(SecItemCopyMatching(with([kSecReturnData as String: true]), &item), errSecSuccess)
        XCTAssertEqual(item as? Data, Data("plain".utf8))
        XCTAssertEqual(
            SecItemCopyMatching(
                with([kSecReturnData as String: true, kSecAttrSynchronizable as String: kCFBooleanTrue!]), &item),
            errSecSuccess)
        XCTAssertEqual(item as? Data, Data("synced".utf8))
        XCTAssertEqual(
            SecItemCopyMatching(
                with([
                    kSecReturnData as String: true, kSecMatchLimit as String: kSecMatchLimitAll,
                    kSecAttrSynchronizable as String: kSecAttrSynchronizableAny,
                ]), &item), errSecSuccess)
        XCTAssertEqual(Set(item as? [Data] ?? []), [Data("plain".utf8), Data("synced".utf8)])
        // Accessibility in an update query narrows it: the item is WhenUnlocked, not AfterFirstUnlock.
        XCTAssertEqual(
            SecItemUpdate(
                with([kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlock]),
                [kSecValueData as String: Data("changed".utf8)] as CFDictionary), errSecItemNotFound)
        XCTAssertEqual(
            SecItemUpdate(
                with([kSecAttrAccessible as String: kSecAttrAccessibleWhenUnlocked]),
                [kSecValueData as String: Data("changed".utf8)] as CFDictionary), errSecSuccess)
        // Persistent references are Data and name one item.
        XCTAssertEqual(SecItemCopyMatching(with([kSecReturnPersistentRef as String: true]), &item), errSecSuccess)
        let ref = try XCTUnwrap(item as? Data)
        XCTAssertEqual(
            SecItemCopyMatching(
                [kSecValuePersistentRef as String: ref, kSecReturnData as String: true] as CFDictionary, &item),
            errSecSuccess)
        XCTAssertEqual(item as? Data, Data("changed".utf8))
        XCTAssertEqual(
            SecItemDelete(
                [kSecClass as String: kSecClassGenericPassword, kSecValuePersistentRef as String: ref] as CFDictionary),
            errSecSuccess)
        XCTAssertEqual(SecItemCopyMatching(with([:]), nil), errSecItemNotFound)
        // A group the app lacks is errSecMissingEntitlement, not "not found".
        XCTAssertEqual(
            SecItemCopyMatching(with([kSecAttrAccessGroup as String: "OTHER.group"]), nil), errSecMissingEntitlement)
    }

    func testFoundationOperationIsNotShadowed() {
        let job = CountingJob()
        let queue = OperationQueue()
        queue.addOperations([job], waitUntilFinished: true)
        XCTAssertTrue(job.ran)
    }
}
