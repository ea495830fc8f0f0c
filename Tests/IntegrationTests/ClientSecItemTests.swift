import Foundation
import KeychainClient
import KeychainCore
import KeychainServices
import KeychainSystem
import KeychainWire
import XCTest

// Swift ports of published iOS device-identifier keychain code (LZKeychain / CHKeychain, KeyChainManager,
// XPQKeychainManager) and of Apple's GenericKeychain sample, written as one would on iOS: only
// `import Security` became `import KeychainServices` (PortingTests keeps `import Security` itself).

/// Seeds 000/001: save = delete then add an NSKeyedArchiver payload; load = copy kSecReturnData.
enum LZKeychain {
    // swift-format-ignore: AlwaysUseLowerCamelCase
    static let KEY_UDID_INSTEAD = "com.myapp.udid.test"

    static func getDeviceIDInKeychain() -> String {
        var getUDIDInKeychain = LZKeychain.load(KEY_UDID_INSTEAD) as? String
        if getUDIDInKeychain == nil || getUDIDInKeychain == "" {
            let result = NSUUID().uuidString
            LZKeychain.save(KEY_UDID_INSTEAD, data: result)
            getUDIDInKeychain = LZKeychain.load(KEY_UDID_INSTEAD) as? String
        }
        return getUDIDInKeychain!
    }

    static func getKeychainQuery(_ service: String) -> NSMutableDictionary {
        return NSMutableDictionary(dictionary: [
            kSecClass: kSecClassGenericPassword,
            kSecAttrService: service,
            kSecAttrAccount: service,
            kSecAttrAccessible: kSecAttrAccessibleAfterFirstUnlock,
        ])
    }

    static func save(_ service: String, data: Any) {
        let keychainQuery = getKeychainQuery(service)
        SecItemDelete(keychainQuery as CFDictionary)
        keychainQuery.setObject(NSKeyedArchiver.archivedData(withRootObject: data), forKey: kSecValueData)
        SecItemAdd(keychainQuery as CFDictionary, nil)
    }

    static func load(_ service: String) -> Any? {
        var ret: Any?
        let keychainQuery = getKeychainQuery(service)
        keychainQuery.setObject(kCFBooleanTrue!, forKey: kSecReturnData)
        keychainQuery.setObject(kSecMatchLimitOne, forKey: kSecMatchLimit)
        var keyData: CFTypeRef?
        if SecItemCopyMatching(keychainQuery as CFDictionary, &keyData) == noErr {
            if let data = keyData as? Data {
                ret = NSKeyedUnarchiver.unarchiveObject(with: data)
            }
        }
        return ret
    }

    static func delete(_ service: String) {
        SecItemDelete(getKeychainQuery(service) as CFDictionary)
    }
}

/// Seed 003: the UUID inside an archived dictionary.
enum KeyChainManager {
    // swift-format-ignore: AlwaysUseLowerCamelCase
    static let MY_UUIDDictionaryKEY = "com.MK.ChartDemo"
    // swift-format-ignore: AlwaysUseLowerCamelCase
    static let MY_UUIDKEY = "com.MK.ChartDemoKey"

    static func isExistUUID() -> String? { showUUID() }

    static func addObject(_ uuid: String) {
        let dict = NSMutableDictionary(dictionary: [MY_UUIDDictionaryKEY: uuid])
        let query = getKeyChainQuery(MY_UUIDKEY)
        SecItemDelete(query as CFDictionary)
        query.setObject(NSKeyedArchiver.archivedData(withRootObject: dict), forKey: kSecValueData)
        SecItemAdd(query as CFDictionary, nil)
    }

    static func removeObject() { SecItemDelete(getKeyChainQuery(MY_UUIDKEY) as CFDictionary) }

    static func showUUID() -> String? {
        var selectObject: Any?
        let query = getKeyChainQuery(MY_UUIDKEY)
        query.setObject(kCFBooleanTrue!, forKey: kSecReturnData)
        query.setObject(kSecMatchLimitOne, forKey: kSecMatchLimit)
        var data: CFTypeRef?
        if SecItemCopyMatching(query as CFDictionary, &data) == noErr, let d = data as? Data {
            selectObject = NSKeyedUnarchiver.unarchiveObject(with: d)
        }
        return (selectObject as? NSDictionary)?.object(forKey: MY_UUIDDictionaryKEY) as? String
    }

    static func getKeyChainQuery(_ key: String) -> NSMutableDictionary {
        NSMutableDictionary(dictionary: [
            kSecClass: kSecClassGenericPassword, kSecAttrService: key,
            kSecAttrAccount: key, kSecAttrAccessible: kSecAttrAccessibleAfterFirstUnlock,
        ])
    }
}

/// Seed 002: an access group; read = attributes query then data query; save = update if present, else add.
final class XPQKeychainManager {
    let secAttrAccessGroup: String?

    init(secAttrAccessGroup: String? = nil) { self.secAttrAccessGroup = secAttrAccessGroup }

    func queryKeychain(forService aService: String, account: String) -> NSMutableDictionary {
        NSMutableDictionary(dictionary: [
            kSecClass: kSecClassGenericPassword, kSecAttrService: aService,
            kSecAttrAccount: account, kSecAttrAccessible: kSecAttrAccessibleAfterFirstUnlock,
        ])
    }

    func secValueData(forService aService: String, account: String) -> Any? {
        let keychainQuery = queryKeychain(forService: aService, account: account)
        if let group = secAttrAccessGroup { keychainQuery.setObject(group, forKey: kSecAttrAccessGroup) }
        let attributeQuery = keychainQuery.mutableCopy() as! NSMutableDictionary
        attributeQuery.setObject(kCFBooleanTrue!, forKey: kSecReturnAttributes)
        var attrResult: CFTypeRef?
        var status = SecItemCopyMatching(attributeQuery as CFDictionary, &attrResult)
        if status != noErr { return nil }
        let secValueDataQuery = keychainQuery.mutableCopy() as! NSMutableDictionary
        secValueDataQuery.setObject(kCFBooleanTrue!, forKey: kSecReturnData)
        var resData: CFTypeRef?
        status = SecItemCopyMatching(secValueDataQuery as CFDictionary, &resData)
        if status != noErr { return nil }
        guard let resultData = resData as? Data else { return nil }
        return NSKeyedUnarchiver.unarchiveObject(with: resultData)
    }

    @discardableResult
    func saveKeychainData(_ data: String, service aService: String, account: String) -> Bool {
        let keychainQuery = queryKeychain(forService: aService, account: account)
        if let group = secAttrAccessGroup { keychainQuery.setObject(group, forKey: kSecAttrAccessGroup) }
        let keychainData = secValueData(forService: aService, account: account) as? String
        var status = noErr
        if let keychainData {
            if keychainData != data {
                let tempCheck = NSMutableDictionary(dictionary: [
                    kSecValueData: NSKeyedArchiver.archivedData(withRootObject: data)
                ])
                status = SecItemUpdate(keychainQuery as CFDictionary, tempCheck as CFDictionary)
            }
        } else {
            let addKeychainData = keychainQuery.mutableCopy() as! NSMutableDictionary
            addKeychainData.setObject(NSKeyedArchiver.archivedData(withRootObject: data), forKey: kSecValueData)
            status = SecItemAdd(addKeychainData as CFDictionary, nil)
        }
        return status == noErr
    }

    @discardableResult
    func deleteKeychainData(forService aService: String, account: String) -> Bool {
        SecItemDelete(queryKeychain(forService: aService, account: account) as CFDictionary) == noErr
    }
}

/// Apple's GenericKeychain sample (KeychainPasswordItem.swift): `[String: AnyObject]` queries,
/// `withUnsafeMutablePointer`, `as? [String: AnyObject]` results.
struct KeychainPasswordItem {
    enum KeychainError: Error {
        case noPassword, unexpectedPasswordData, unexpectedItemData
        case unhandledError(status: OSStatus)
    }

    let service: String
    private(set) var account: String
    let accessGroup: String?

    init(service: String, account: String, accessGroup: String? = nil) {
        self.service = service
        self.account = account
        self.accessGroup = accessGroup
    }

    func readPassword() throws -> String {
        var query = KeychainPasswordItem.keychainQuery(withService: service, account: account, accessGroup: accessGroup)
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        query[kSecReturnAttributes as String] = kCFBooleanTrue
        query[kSecReturnData as String] = kCFBooleanTrue
        var queryResult: AnyObject?
        let status = withUnsafeMutablePointer(to: &queryResult) {
            SecItemCopyMatching(query as CFDictionary, UnsafeMutablePointer($0))
        }
        guard status != errSecItemNotFound else { throw KeychainError.noPassword }
        guard status == noErr else { throw KeychainError.unhandledError(status: status) }
        guard let existingItem = queryResult as? [String: AnyObject],
            let passwordData = existingItem[kSecValueData as String] as? Data,
            let password = String(data: passwordData, encoding: String.Encoding.utf8)
        else { throw KeychainError.unexpectedPasswordData }
        return password
    }

    func savePassword(_ password: String) throws {
        let encodedPassword = password.data(using: String.Encoding.utf8)!
        do {
            try _ = readPassword()
            var attributesToUpdate = [String: AnyObject]()
            attributesToUpdate[kSecValueData as String] = encodedPassword as AnyObject?
            let query = KeychainPasswordItem.keychainQuery(
                withService: service, account: account, accessGroup: accessGroup)
            let status = SecItemUpdate(query as CFDictionary, attributesToUpdate as CFDictionary)
            guard status == noErr else { throw KeychainError.unhandledError(status: status) }
        } catch KeychainError.noPassword {
            var newItem = KeychainPasswordItem.keychainQuery(
                withService: service, account: account, accessGroup: accessGroup)
            newItem[kSecValueData as String] = encodedPassword as AnyObject?
            let status = SecItemAdd(newItem as CFDictionary, nil)
            guard status == noErr else { throw KeychainError.unhandledError(status: status) }
        }
    }

    mutating func renameAccount(_ newAccountName: String) throws {
        var attributesToUpdate = [String: AnyObject]()
        attributesToUpdate[kSecAttrAccount as String] = newAccountName as AnyObject?
        let query = KeychainPasswordItem.keychainQuery(
            withService: service, account: self.account, accessGroup: accessGroup)
        let status = SecItemUpdate(query as CFDictionary, attributesToUpdate as CFDictionary)
        guard status == noErr || status == errSecItemNotFound else {
            throw KeychainError.unhandledError(status: status)
        }
        self.account = newAccountName
    }

    func deleteItem() throws {
        let query = KeychainPasswordItem.keychainQuery(withService: service, account: account, accessGroup: accessGroup)
        let status = SecItemDelete(query as CFDictionary)
        guard status == noErr || status == errSecItemNotFound else {
            throw KeychainError.unhandledError(status: status)
        }
    }

    static func passwordItems(forService service: String, accessGroup: String? = nil) throws -> [KeychainPasswordItem] {
        var query = KeychainPasswordItem.keychainQuery(withService: service, accessGroup: accessGroup)
        query[kSecMatchLimit as String] = kSecMatchLimitAll
        query[kSecReturnAttributes as String] = kCFBooleanTrue
        query[kSecReturnData as String] = kCFBooleanFalse
        var queryResult: AnyObject?
        let status = withUnsafeMutablePointer(to: &queryResult) {
            SecItemCopyMatching(query as CFDictionary, UnsafeMutablePointer($0))
        }
        guard status != errSecItemNotFound else { return [] }
        guard status == noErr else { throw KeychainError.unhandledError(status: status) }
        guard let resultData = queryResult as? [[String: AnyObject]] else { throw KeychainError.unexpectedItemData }
        var passwordItems = [KeychainPasswordItem]()
        for result in resultData {
            guard let account = result[kSecAttrAccount as String] as? String else {
                throw KeychainError.unexpectedItemData
            }
            passwordItems.append(KeychainPasswordItem(service: service, account: account, accessGroup: accessGroup))
        }
        return passwordItems
    }

    private static func keychainQuery(withService service: String, account: String? = nil, accessGroup: String? = nil)
        -> [String: AnyObject]
    {
        var query = [String: AnyObject]()
        query[kSecClass as String] = kSecClassGenericPassword
        query[kSecAttrService as String] = service as AnyObject?
        if let account { query[kSecAttrAccount as String] = account as AnyObject? }
        if let accessGroup { query[kSecAttrAccessGroup as String] = accessGroup as AnyObject? }
        return query
    }
}

/// The SecItem API against the real daemon.
final class ClientSecItemTests: SharedConnectionTestCase {
    func testSeedLZKeychainKeepsOneArchivedUUID() {
        let first = LZKeychain.getDeviceIDInKeychain()
        XCTAssertNotNil(UUID(uuidString: first))
        XCTAssertEqual(LZKeychain.getDeviceIDInKeychain(), first)
        XCTAssertEqual(LZKeychain.load(LZKeychain.KEY_UDID_INSTEAD) as? String, first)
        LZKeychain.save(LZKeychain.KEY_UDID_INSTEAD, data: "replaced")  // delete + add again
        XCTAssertEqual(LZKeychain.load(LZKeychain.KEY_UDID_INSTEAD) as? String, "replaced")
        LZKeychain.delete(LZKeychain.KEY_UDID_INSTEAD)
        XCTAssertNil(LZKeychain.load(LZKeychain.KEY_UDID_INSTEAD))
        XCTAssertNotEqual(LZKeychain.getDeviceIDInKeychain(), first)
    }

    func testSeedKeyChainManagerStoresAnArchivedDictionary() {
        XCTAssertNil(KeyChainManager.isExistUUID())
        let uuid = NSUUID().uuidString
        KeyChainManager.addObject(uuid)
        XCTAssertEqual(KeyChainManager.isExistUUID(), uuid)
        KeyChainManager.addObject("second")
        XCTAssertEqual(KeyChainManager.isExistUUID(), "second")
        KeyChainManager.removeObject()
        XCTAssertNil(KeyChainManager.isExistUUID())
    }

    func testSeedXPQManagerReadsAttributesThenDataInASharedGroup() {
        let shared = XPQKeychainManager(secAttrAccessGroup: "TEAM.shared")
        XCTAssertNil(shared.secValueData(forService: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid"))
        XCTAssertTrue(
            shared.saveKeychainData("A-UUID", service: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid"))
        XCTAssertEqual(
            shared.secValueData(forService: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid") as? String,
            "A-UUID")
        XCTAssertTrue(
            shared.saveKeychainData("B-UUID", service: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid"))
        XCTAssertEqual(
            shared.secValueData(forService: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid") as? String,
            "B-UUID")
        // Without a group the query spans all the app's groups, so it finds the shared item too.
        XCTAssertEqual(
            XPQKeychainManager().secValueData(forService: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid")
                as? String, "B-UUID")
        XCTAssertTrue(shared.deleteKeychainData(forService: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid"))
        XCTAssertNil(shared.secValueData(forService: "com.xpq.keychain.uuid", account: "com.xpq.keychain.uuid"))
        // A group the app lacks is an error, as on iOS.
        XCTAssertFalse(
            XPQKeychainManager(secAttrAccessGroup: "OTHER.group").saveKeychainData("x", service: "s", account: "a"))
    }

    func testAppleGenericKeychainSample() throws {
        var item = KeychainPasswordItem(service: "com.example.generic", account: "alice")
        XCTAssertThrowsError(try item.readPassword())
        try item.savePassword("first")
        XCTAssertEqual(try item.readPassword(), "first")
        try item.savePassword("second")
        XCTAssertEqual(try item.readPassword(), "second")
        try KeychainPasswordItem(service: "com.example.generic", account: "bob").savePassword("b")
        XCTAssertEqual(
            try KeychainPasswordItem.passwordItems(forService: "com.example.generic").map(\.account).sorted(),
            ["alice", "bob"])
        try item.renameAccount("carol")
        XCTAssertEqual(try item.readPassword(), "second")
        try item.deleteItem()
        XCTAssertEqual(
            try KeychainPasswordItem.passwordItems(forService: "com.example.generic").map(\.account), ["bob"])
    }

    func testResultShapesAndTypesMatchApple() throws {
        let add: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.shapes",
            kSecAttrAccount as String: "alice", kSecAttrLabel as String: "Label",
            kSecAttrCreator as String: UInt32(0x61626364), kSecAttrIsInvisible as String: true,
            kSecValueData as String: Data("s3cret".utf8), kSecReturnAttributes as String: kCFBooleanTrue!,
        ]
        var added: CFTypeRef?
        XCTAssertEqual(SecItemAdd(add as CFDictionary, &added), errSecSuccess)
        let attrs = try XCTUnwrap(added as? [String: Any])
        XCTAssertEqual(attrs[kSecAttrAccessGroup as String] as? String, "TEAM.tests", "the default group is the first")
        XCTAssertEqual(attrs[kSecAttrAccessible as String] as? String, kSecAttrAccessibleWhenUnlocked as String)
        XCTAssertEqual(attrs[kSecAttrSynchronizable as String] as? Bool, false)
        XCTAssertEqual(attrs[kSecAttrSynchronizable as String] as? Int, 0)
        XCTAssertEqual(attrs[kSecAttrIsInvisible as String] as? Bool, true)
        XCTAssertEqual(attrs[kSecAttrCreator as String] as? UInt32, 0x61626364)
        XCTAssertEqual(attrs[kSecAttrLabel as String] as? String, "Label")
        let created = try XCTUnwrap(attrs[kSecAttrCreationDate as String] as? Date)
        XCTAssertLessThan(abs(created.timeIntervalSinceNow), 60)
        XCTAssertNotNil(attrs[kSecAttrModificationDate as String] as? Date)
        XCTAssertNil(attrs[kSecValueData as String], "no data unless asked for")

        let base: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.shapes",
        ]
        func copy(_ extra: [String: Any]) -> (OSStatus, CFTypeRef?) {
            var item: CFTypeRef?
            let status = SecItemCopyMatching(base.merging(extra) { $1 } as CFDictionary, &item)
            return (status, item)
        }
        XCTAssertEqual(copy([kSecReturnData as String: true]).1 as? Data, Data("s3cret".utf8))
        let (noReturn, nothing) = copy([:])
        XCTAssertEqual(noReturn, errSecSuccess)
        XCTAssertNil(nothing)
        let both = try XCTUnwrap(
            copy([kSecReturnData as String: true, kSecReturnAttributes as String: true]).1 as? [String: Any])
        XCTAssertEqual(both[kSecValueData as String] as? Data, Data("s3cret".utf8))
        XCTAssertEqual(both[kSecAttrAccount as String] as? String, "alice")
        let all = try XCTUnwrap(
            copy([kSecReturnData as String: true, kSecMatchLimit as String: kSecMatchLimitAll]).1 as? [Data])
        XCTAssertEqual(all, [Data("s3cret".utf8)], "m_LimitAll returns an array even for one item")

        let ref = try XCTUnwrap(copy([kSecReturnPersistentRef as String: true]).1 as? Data)
        var byRef: CFTypeRef?
        XCTAssertEqual(
            SecItemCopyMatching(
                [kSecValuePersistentRef as String: ref, kSecReturnData as String: true] as CFDictionary, &byRef),
            errSecSuccess)
        XCTAssertEqual(byRef as? Data, Data("s3cret".utf8))

        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecDuplicateItem)
        XCTAssertEqual(
            SecItemUpdate(base as CFDictionary, [kSecValueData as String: Data("new".utf8)] as CFDictionary),
            errSecSuccess)
        XCTAssertEqual(copy([kSecReturnData as String: true]).1 as? Data, Data("new".utf8))
        XCTAssertEqual(SecItemDelete(base as CFDictionary), errSecSuccess)
        XCTAssertEqual(copy([:]).0, errSecItemNotFound)
        XCTAssertEqual(SecItemDelete(base as CFDictionary), errSecItemNotFound)
    }

    func testErrorsCarryStatusAndMessage() {
        let stringSecret: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "s",
            kSecValueData as String: "not Data",
        ]
        XCTAssertEqual(SecItemAdd(stringSecret as CFDictionary, nil), errSecParam)
        XCTAssertTrue((SecCopyErrorMessageString(errSecParam, nil) as String?)?.contains("kSecValueData") ?? false)

        let otherGroup: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrAccessGroup as String: "OTHER.group",
        ]
        XCTAssertEqual(SecItemCopyMatching(otherGroup as CFDictionary, nil), errSecMissingEntitlement)
        XCTAssertEqual(
            SecItemCopyMatching([kSecClass as String: kSecClassCertificate] as CFDictionary, nil),
            errSecNoSuchClass)
        let unknownAttr: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrServer as String: "host",
        ]
        XCTAssertNotEqual(SecItemCopyMatching(unknownAttr as CFDictionary, nil), errSecSuccess)
        let message = SecCopyErrorMessageString(errSecItemNotFound, nil) as String?
        XCTAssertNotNil(message)
    }

    func testManyThreadsShareOnePipelinedConnection() throws {
        let failures = LockedCounter()
        DispatchQueue.concurrentPerform(iterations: 200) { i in
            let add: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.threads",
                kSecAttrAccount as String: "user\(i)", kSecValueData as String: Data("\(i)".utf8),
            ]
            if SecItemAdd(add as CFDictionary, nil) != errSecSuccess { failures.increment() }
            var item: CFTypeRef?
            let query: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.threads",
                kSecAttrAccount as String: "user\(i)", kSecReturnData as String: true,
            ]
            if SecItemCopyMatching(query as CFDictionary, &item) != errSecSuccess || item as? Data != Data("\(i)".utf8)
            {
                failures.increment()
            }
        }
        XCTAssertEqual(failures.value, 0)
        XCTAssertEqual(try Keychain(service: "com.example.threads").allKeys().count, 200)
        XCTAssertEqual(try KeychainAdmin().status().connections, 1, "one shared connection for the whole process")
    }

    func testReconnectsWhenTheDaemonRestarts() throws {
        let keychain = Keychain(service: "com.example.restart")
        try keychain.set("before", forKey: "k")
        XCTAssertTrue(KeychainConnection.shared.isConnected)
        XCTAssertEqual(daemon.stop(), 0)

        XCTAssertThrowsError(try keychain.string(forKey: "k")) { error in
            let e = error as? KeychainError
            XCTAssertEqual(e?.osStatus, errSecNotAvailable)
            XCTAssertTrue(e?.message.contains(self.daemon.socketPath) ?? false, e?.message ?? "")
        }
        var item: CFTypeRef?
        XCTAssertEqual(
            SecItemCopyMatching([kSecClass as String: kSecClassGenericPassword] as CFDictionary, &item),
            errSecNotAvailable)
        XCTAssertTrue(
            (SecCopyErrorMessageString(errSecNotAvailable, nil) as String?)?.contains(daemon.socketPath) ?? false)

        try daemon.start()
        XCTAssertEqual(try keychain.string(forKey: "k"), "before")
        // Restart again while the connection is open and idle: the next call notices and reconnects.
        XCTAssertEqual(daemon.stop(), 0)
        try daemon.start()
        try keychain.set("after", forKey: "k")
        XCTAssertEqual(try keychain.string(forKey: "k"), "after")
    }
}

final class LockedCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func increment() {
        lock.lock()
        count += 1
        lock.unlock()
    }
    var value: Int {
        lock.lock()
        defer { lock.unlock() }
        return count
    }
}
