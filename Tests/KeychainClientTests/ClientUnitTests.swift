import Foundation
import KeychainClient
import KeychainCore
import KeychainWire
import XCTest

@testable import KeychainServices
@testable import Security

/// KeychainServices without a daemon: constants, the CF stand-ins, conversions both ways, errors.
final class ClientUnitTests: XCTestCase {
    func testConstantsCarryTheWireStrings() {
        let expected: [(CFString, String)] = [
            (kSecClass, "class"), (kSecClassGenericPassword, "genp"), (kSecAttrService, "svce"),
            (kSecAttrAccount, "acct"), (kSecAttrAccessGroup, "agrp"), (kSecAttrAccessible, "pdmn"),
            (kSecAttrAccessibleWhenUnlocked, "ak"), (kSecAttrAccessibleAfterFirstUnlock, "ck"),
            (kSecAttrAccessibleAlways, "dk"), (kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly, "akpu"),
            (kSecAttrAccessibleWhenUnlockedThisDeviceOnly, "aku"),
            (kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly, "cku"), (kSecAttrAccessibleAlwaysThisDeviceOnly, "dku"),
            (kSecAttrLabel, "labl"), (kSecAttrDescription, "desc"), (kSecAttrComment, "icmt"),
            (kSecAttrGeneric, "gena"), (kSecAttrCreator, "crtr"), (kSecAttrType, "type"),
            (kSecAttrIsInvisible, "invi"), (kSecAttrIsNegative, "nega"), (kSecAttrSynchronizable, "sync"),
            (kSecAttrSynchronizableAny, "syna"), (kSecAttrCreationDate, "cdat"), (kSecAttrModificationDate, "mdat"),
            (kSecValueData, "v_Data"), (kSecValuePersistentRef, "v_PersistentRef"), (kSecMatchLimit, "m_Limit"),
            (kSecMatchLimitOne, "m_LimitOne"), (kSecMatchLimitAll, "m_LimitAll"),
            (kSecMatchCaseInsensitive, "m_CaseInsensitive"), (kSecReturnData, "r_Data"),
            (kSecReturnAttributes, "r_Attributes"), (kSecReturnPersistentRef, "r_PersistentRef"),
        ]
        for (constant, wire) in expected {
            XCTAssertEqual(constant as String, wire)
            XCTAssertTrue(constant == wire as NSString)
        }
        XCTAssertTrue(kSecClassGenericPassword == "genp")
        XCTAssertEqual(errSecSuccess, 0)
        XCTAssertEqual(noErr, errSecSuccess)
        XCTAssertEqual(errSecItemNotFound, -25300)
        XCTAssertEqual(errSecDuplicateItem, -25299)
        XCTAssertEqual(errSecParam, -50)
        XCTAssertEqual(errSecNotAvailable, -25291)
        XCTAssertEqual(errSecMissingEntitlement, -34018)
        XCTAssertEqual(errSecInteractionNotAllowed, -25308)
        XCTAssertEqual(errSecDecode, -26275)
        XCTAssertEqual(kCFBooleanTrue!.boolValue, true)
        XCTAssertEqual(kCFBooleanFalse!.boolValue, false)
    }

    /// The spellings iOS code uses compile unchanged and convert to the same request.
    func testTypicalDictionarySpellingsAllConvert() throws {
        let data = Data("s3cret".utf8)
        let a: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "svc",
            kSecValueData as String: data, kSecReturnData as String: kCFBooleanTrue!,
        ]
        var b = [String: AnyObject]()
        b[kSecClass as String] = kSecClassGenericPassword
        b[kSecAttrService as String] = "svc" as AnyObject?
        b[kSecValueData as String] = data as AnyObject?
        b[kSecReturnData as String] = kCFBooleanTrue
        let c: [CFString: Any] = [
            kSecClass: kSecClassGenericPassword, kSecAttrService: "svc", kSecValueData: data,
            kSecReturnData: true,
        ]
        let d = NSMutableDictionary()
        d.setObject(kSecClassGenericPassword, forKey: kSecClass)
        d.setObject("svc", forKey: kSecAttrService)
        d.setObject(data, forKey: kSecValueData)
        d.setObject(kCFBooleanTrue!, forKey: kSecReturnData)
        let expected: [String: Value] = [
            "class": .text("genp"), "svce": .text("svc"), "v_Data": .bytes(Array(data)),
            "r_Data": .bool(true),
        ]
        for dict in [a as CFDictionary, b as CFDictionary, c as CFDictionary, d as CFDictionary, d] {
            XCTAssertEqual(try Conversion.map(dict, what: "the query"), expected)
        }
    }

    func testKeyAwareCoercions() throws {
        let date = Date(timeIntervalSince1970: 1_700_000_000.5)
        let dict: [String: Any] = [
            "invi": NSNumber(value: 1), "nega": 0, "sync": kSecAttrSynchronizableAny, "crtr": UInt32(0x41424344),
            "type": NSNumber(value: 7), "cdat": date, "gena": "text-is-tolerated", "m_Limit": 5,
            "m_CaseInsensitive": kCFBooleanFalse!, "r_Attributes": true,
            kSecUseOperationPrompt as String: "ignored", kSecUseDataProtectionKeychain as String: true,
            kSecReturnRef as String: true, "custom": 3.5,
        ]
        let m = try Conversion.map(dict as CFDictionary, what: "the query")
        XCTAssertEqual(
            m,
            [
                "invi": .bool(true), "nega": .bool(false), "sync": .text("syna"), "crtr": .int(0x41424344),
                "type": .int(7), "cdat": .date(1_700_000_000.5), "gena": .text("text-is-tolerated"),
                "m_Limit": .int(5), "m_CaseInsensitive": .bool(false), "r_Attributes": .bool(true),
                "custom": .float(3.5),
            ])
    }

    func testWhetherTheDaemonMayAskTravelsAndTheOtherUIKeysDoNot() throws {
        // The daemon asks for the passphrase of a locked keychain unless the query says Fail or Skip.
        let fail: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecUseAuthenticationUI as String: kSecUseAuthenticationUIFail,
            kSecUseOperationPrompt as String: "ignored",
        ]
        XCTAssertEqual(
            try Conversion.map(fail as CFDictionary, what: "the query"),
            ["class": .text("genp"), "u_AuthUI": .text("u_AuthUIF")])
        let noUI: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecUseNoAuthenticationUI as String: true,
        ]
        XCTAssertEqual(
            try Conversion.map(noUI as CFDictionary, what: "the query"),
            ["class": .text("genp"), "u_NoAuthUI": .bool(true)])
    }

    func testValuesWithoutAWireFormAreErrSecParamNamingTheKey() {
        func failure(_ dict: [String: Any]) -> KeychainError? {
            do throws(KeychainError) {
                _ = try Conversion.map(dict as CFDictionary, what: "the query")
                return nil
            } catch { return error }
        }
        let stringSecret = failure([kSecValueData as String: "not data"])
        XCTAssertEqual(stringSecret?.status, .param)
        XCTAssertTrue(stringSecret?.message.contains("kSecValueData") ?? false, stringSecret?.message ?? "")
        XCTAssertFalse(stringSecret?.message.contains("not data") ?? true, "messages never carry values")
        let uuid = failure(["zzzz": UUID()])
        XCTAssertEqual(uuid?.status, .param)
        XCTAssertTrue(uuid?.message.contains("zzzz") ?? false)
        let numberAccount = failure([kSecAttrAccount as String: 42])
        XCTAssertEqual(numberAccount?.status, .param)
        XCTAssertTrue(numberAccount?.message.contains("a String or Data") ?? false, numberAccount?.message ?? "")
        XCTAssertEqual(failure([kSecAttrAccessGroup as String: Data("TEAM.tests".utf8)])?.status, .param)
        XCTAssertEqual(failure([kSecReturnData as String: "maybe"])?.status, .param)
    }

    func testResultsComeBackAsAppleHandsThemOut() throws {
        let archived = try NSKeyedArchiver.archivedData(
            withRootObject: "9D820D3A-4429-4918-97F7-A69588B388A4",
            requiringSecureCoding: false)
        let attrs: Value = .map([
            "acct": .text("alice"), "svce": .text("svc"), "agrp": .text("TEAM.tests"), "pdmn": .text("ak"),
            "sync": .bool(false), "invi": .bool(true), "crtr": .int(42), "cdat": .date(1_700_000_000),
            "gena": .bytes([1, 2]), "v_Data": .bytes(Array(archived)),
        ])
        var item: CFTypeRef? = Conversion.object(attrs)
        let dict = try XCTUnwrap(item as? [String: Any])
        XCTAssertEqual(dict[kSecAttrAccount as String] as? String, "alice")
        XCTAssertEqual(dict[kSecAttrSynchronizable as String] as? Bool, false)
        XCTAssertEqual(dict[kSecAttrSynchronizable as String] as? Int, 0)
        XCTAssertEqual(dict[kSecAttrIsInvisible as String] as? Bool, true)
        XCTAssertEqual(dict[kSecAttrCreator as String] as? UInt32, 42)
        XCTAssertEqual(dict[kSecAttrCreator as String] as? Int, 42)
        XCTAssertEqual(dict[kSecAttrCreationDate as String] as? Date, Date(timeIntervalSince1970: 1_700_000_000))
        XCTAssertEqual(dict[kSecAttrGeneric as String] as? Data, Data([1, 2]))
        let secret = try XCTUnwrap(dict[kSecValueData as String] as? Data)
        XCTAssertEqual(
            try NSKeyedUnarchiver.unarchiveTopLevelObjectWithData(secret) as? String,
            "9D820D3A-4429-4918-97F7-A69588B388A4")
        XCTAssertNotNil(item as? [String: AnyObject])
        XCTAssertNotNil(item as? NSDictionary)

        item = Conversion.object(.bytes([7, 8, 9]))
        XCTAssertEqual(item as? Data, Data([7, 8, 9]))
        XCTAssertEqual((item as? CFData)?.length, 3)

        item = Conversion.object(.array([attrs, attrs]))
        XCTAssertEqual((item as? [[String: Any]])?.count, 2)
        XCTAssertEqual((item as? [[String: AnyObject]])?.first?[kSecAttrAccount as String] as? String, "alice")
        item = Conversion.object(.array([.bytes([1]), .bytes([2])]))
        XCTAssertEqual(item as? [Data], [Data([1]), Data([2])])
    }

    func testNoDaemonIsErrSecNotAvailableNamingTheSocket() {
        let path = NSTemporaryDirectory() + "no-keychaind-\(getpid()).sock"
        KeychainConnection.shared.retarget(socketPath: path)
        defer { KeychainConnection.shared.retarget(socketPath: nil) }
        var item: CFTypeRef? = "stale" as NSString
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecReturnData as String: true]
        let status = SecItemCopyMatching(query as CFDictionary, &item)
        XCTAssertEqual(status, errSecNotAvailable)
        XCTAssertNil(item, "the result is cleared on failure")
        let message = SecCopyErrorMessageString(status, nil) as String?
        XCTAssertTrue(message?.contains(path) ?? false, message ?? "")
        XCTAssertEqual(
            SecCopyErrorMessageString(errSecItemNotFound, nil) as String?,
            "The specified item could not be found in the keychain.")
        XCTAssertThrowsError(
            try Keychain(service: "svc", connection: KeychainConnection(socketPath: path)).string(forKey: "k")
        ) {
            XCTAssertEqual(($0 as? KeychainError)?.osStatus, errSecNotAvailable)
        }
    }

    func testDeviceIdentifierStringsAreCanonicalUUIDs() {
        for _ in 0..<100 {
            let s = DeviceIdentifierConvention.randomUUIDString()
            XCTAssertEqual(s.count, 36)
            XCTAssertEqual(UUID(uuidString: s)?.uuidString, s)
            XCTAssertEqual(Array(s)[14], "4")
        }
        XCTAssertEqual(
            DeviceIdentifierConvention.canonicalUUID(Array("9d820d3a-4429-4918-97f7-a69588b388a4".utf8)),
            "9D820D3A-4429-4918-97F7-A69588B388A4")
        XCTAssertNil(DeviceIdentifierConvention.canonicalUUID(Array("9d820d3a-4429-4918-97f7-a69588b388a".utf8)))
        XCTAssertNil(DeviceIdentifierConvention.canonicalUUID(Array("9d820d3a+4429-4918-97f7-a69588b388a4".utf8)))
    }

    func testNothingPrintsSecrets() {
        let k = Keychain(service: "svc", accessGroup: "TEAM.tests").accessibility(.afterFirstUnlock).label("L")
        XCTAssertEqual(k.accessibility, .afterFirstUnlock)
        XCTAssertEqual(k.label, "L")
        XCTAssertEqual(
            k, Keychain(service: "svc", accessGroup: "TEAM.tests", accessibility: .afterFirstUnlock).label("L"))
        XCTAssertFalse(String(describing: Value.bytes(Array("s3cret".utf8))).contains("s3cret"))
        XCTAssertFalse(String(describing: k).contains("s3cret"))
    }
}
