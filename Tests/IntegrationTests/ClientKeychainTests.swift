import Foundation
import KeychainClient
import KeychainCore
import KeychainServices
import KeychainSystem
import KeychainWire
import XCTest

/// The Swift-native layer (`Keychain`, `DeviceIdentifier`) against the real daemon.
final class ClientKeychainTests: SharedConnectionTestCase {
    /// KeychainAccess's `Keychain(server:protocolType:)`: internet passwords keyed by account, found
    /// by SecItem code under Apple's attributes, never mixed with the generic passwords of a service
    /// named like the server.
    func testInternetPasswordKeychain() throws {
        let site = Keychain(
            server: "https://example.com:8443/login", protocolType: .https, authenticationType: .htmlForm)
        XCTAssertEqual(site.server?.host, "example.com")
        XCTAssertEqual(site.server?.port, 8443)
        XCTAssertEqual(site.server?.path, "/login")
        try site.set("s3cret", forKey: "alice")
        try site.set("changed", forKey: "alice")  // add, then update on errSecDuplicateItem
        try site.set("bob's", forKey: "bob")
        XCTAssertEqual(try site.string(forKey: "alice"), "changed")
        XCTAssertEqual(try site.allKeys(), ["alice", "bob"])

        // Another port or protocol is another keychain; the generic one named like the server too.
        let plain = Keychain(server: "http://example.com:8443/login", protocolType: .http)
        XCTAssertNil(try plain.string(forKey: "alice"))
        let generic = Keychain(service: "example.com")
        XCTAssertNil(try generic.string(forKey: "alice"))
        try generic.set("generic", forKey: "alice")
        XCTAssertEqual(try site.string(forKey: "alice"), "changed")

        // What SecItem code sees: the class and Apple's attribute values.
        let found = try XCTUnwrap(
            try KeychainConnection.shared.call(
                .copy,
                query: [
                    "class": .text("inet"), "srvr": .text("example.com"), "acct": .text("alice"),
                    "r_Attributes": .bool(true),
                ])?.map)
        XCTAssertEqual(found["ptcl"], .text("htps"))
        XCTAssertEqual(found["atyp"], .text("form"))
        XCTAssertEqual(found["port"], .int(8443))
        XCTAssertEqual(found["path"], .text("/login"))

        try site.removeValue(forKey: "alice")
        XCTAssertNil(try site.string(forKey: "alice"))
        try site.removeAll()
        XCTAssertEqual(try site.allKeys(), [])
        XCTAssertEqual(try generic.string(forKey: "alice"), "generic")
    }

    /// What the client reads stays in wiping storage from the frame to the caller, whatever shape
    /// the answer has: decoded into plain arrays, every secret read left a copy in freed heap.
    func testSecretsReadArriveInWipingStorage() throws {
        let c = KeychainConnection.shared
        let item: [String: Value] = ["class": .text("genp"), "svce": .text("com.example.wipe")]
        for (account, secret) in [("a", "first"), ("b", "second")] {
            var add = item
            add["acct"] = .text(account)
            add["v_Data"] = .bytes(Array(secret.utf8))
            _ = try c.call(.add, query: add)
        }
        func secret(_ v: Value?) -> String? {
            guard case .secret(let s)? = v else { return nil }
            return String(decoding: s.unprotectedArray, as: UTF8.self)
        }
        var one = item
        one["acct"] = .text("a")
        one["r_Data"] = .bool(true)
        XCTAssertEqual(secret(try c.call(.copy, query: one)), "first")

        var all = item
        all["m_Limit"] = .text("m_LimitAll")
        all["r_Data"] = .bool(true)
        XCTAssertEqual(Set(try XCTUnwrap(try c.call(.copy, query: all)?.array).map(secret)), ["first", "second"])

        all["r_Attributes"] = .bool(true)
        let maps = try XCTUnwrap(try c.call(.copy, query: all)?.array).compactMap(\.map)
        XCTAssertEqual(maps.count, 2)
        for m in maps {
            XCTAssertEqual(secret(m["v_Data"]), m["acct"] == .text("a") ? "first" : "second")
            XCTAssertEqual(m["svce"], .text("com.example.wipe"), "attributes stay as they were")
        }
        // The typed layer reads them as before.
        XCTAssertEqual(try Keychain(service: "com.example.wipe").string(forKey: "b"), "second")
    }

    /// The Swift-native layer lists accounts that SecItem code wrote as Data (as some wrappers do)
    /// by their text.
    func testAccountsWrittenAsDataAreListedByTheirText() throws {
        let add: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.wrapper",
            kSecAttrAccount as String: Data("k".utf8), kSecValueData as String: Data("again".utf8),
        ]
        XCTAssertEqual(SecItemAdd(add as CFDictionary, nil), errSecSuccess)
        XCTAssertEqual(try Keychain(service: "com.example.wrapper").allKeys(), ["k"])
    }

    func testTypedGetSetRemove() throws {
        let keychain = Keychain(service: "com.example.native")
        XCTAssertNil(try keychain.string(forKey: "alice"))
        XCTAssertFalse(try keychain.contains("alice"))
        try keychain.set("s3cret", forKey: "alice")
        XCTAssertEqual(try keychain.string(forKey: "alice"), "s3cret")
        XCTAssertTrue(try keychain.contains("alice"))
        try keychain.set("changed", forKey: "alice")  // add → duplicate → update
        XCTAssertEqual(try keychain.string(forKey: "alice"), "changed")
        try keychain.set(Data([0, 1, 2, 255]), forKey: "bin")
        XCTAssertEqual(try keychain.data(forKey: "bin"), Data([0, 1, 2, 255]))
        XCTAssertThrowsError(try keychain.string(forKey: "bin")) {
            XCTAssertEqual(($0 as? KeychainError)?.osStatus, errSecDecode)
        }
        XCTAssertEqual(try keychain.allKeys(), ["alice", "bin"])
        try keychain.removeValue(forKey: "alice")
        try keychain.removeValue(forKey: "alice")  // absent: not an error
        XCTAssertNil(try keychain.string(forKey: "alice"))
        try keychain.removeAll()
        XCTAssertEqual(try keychain.allKeys(), [])
        XCTAssertThrowsError(try keychain.set("x", forKey: "")) {
            XCTAssertEqual(($0 as? KeychainError)?.osStatus, errSecParam)
        }
    }

    func testAccessGroupsAndAccessibilityAreAppliedOnWrite() throws {
        let shared = Keychain(service: "com.example.groups", accessGroup: "TEAM.shared")
        let own = shared.accessGroup("TEAM.tests")
        try shared.set("shared-value", forKey: "k")
        XCTAssertNil(try own.string(forKey: "k"), "another group does not see it")
        XCTAssertEqual(
            try shared.accessGroup(nil).string(forKey: "k"), "shared-value", "no group: all of the app's groups")
        XCTAssertThrowsError(try shared.accessGroup("OTHER.group").string(forKey: "k")) {
            XCTAssertEqual(($0 as? KeychainError)?.osStatus, errSecMissingEntitlement)
        }

        // Without a group, set writes (and on a duplicate updates) only the default group's item.
        let unscoped = Keychain(service: "com.example.groups")
        try unscoped.set("own-1", forKey: "k")
        try unscoped.set("own-2", forKey: "k")
        XCTAssertEqual(try own.string(forKey: "k"), "own-2")
        XCTAssertEqual(try shared.string(forKey: "k"), "shared-value", "the shared item is untouched")
        try own.removeValue(forKey: "k")

        // Changing accessibility updates the existing item in place (no "not found, then duplicate").
        try shared.accessibility(.afterFirstUnlockThisDeviceOnly).label("Shared").set("v2", forKey: "k")
        var item: CFTypeRef?
        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "com.example.groups",
            kSecReturnAttributes as String: true,
        ]
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, &item), errSecSuccess)
        let attrs = try XCTUnwrap(item as? [String: Any])
        XCTAssertEqual(attrs[kSecAttrAccessible as String] as? String, "cku")
        XCTAssertEqual(attrs[kSecAttrLabel as String] as? String, "Shared")
        XCTAssertEqual(attrs[kSecAttrAccessGroup as String] as? String, "TEAM.shared")
        XCTAssertEqual(try shared.string(forKey: "k"), "v2")
    }

    /// An authentication policy travels with the item as its access control (the dialogs it brings
    /// are clients/python/tests/test_presence.py's); it needs a keychain passphrase, none is set here.
    func testAnAuthenticationPolicyIsSentAsTheItemsAccessControl() throws {
        let guarded = Keychain(service: "com.example.presence").authenticationPolicy([
            .userPresence, .or, .devicePasscode,
        ])
        XCTAssertEqual(
            guarded.label("x").accessibility(.whenUnlockedThisDeviceOnly).authenticationPolicy,
            [.userPresence, .or, .devicePasscode])
        XCTAssertNotEqual(guarded, Keychain(service: "com.example.presence"))
        XCTAssertThrowsError(try guarded.set("v", forKey: "k")) { error in
            let e = error as? KeychainError
            XCTAssertEqual(e?.status, .authFailed)
            XCTAssertTrue(e?.message.contains("passphrase") == true, "\(error)")
        }
        XCTAssertNil(try Keychain(service: "com.example.presence").string(forKey: "k"), "nothing was stored")
    }

    func testAsyncVariantsFromManyTasks() async throws {
        let keychain = Keychain(service: "com.example.async")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<100 {
                group.addTask {
                    try await keychain.set("value\(i)", forKey: "key\(i)")
                    let read = try await keychain.string(forKey: "key\(i)")
                    XCTAssertEqual(read, "value\(i)")
                }
            }
            try await group.waitForAll()
        }
        let keys = try await keychain.allKeys()
        XCTAssertEqual(keys.count, 100)
        try await keychain.removeValue(forKey: "key0")
        let gone = try await keychain.data(forKey: "key0")
        XCTAssertNil(gone)
        let contained = try await keychain.contains("key1")
        XCTAssertTrue(contained)
        try await keychain.removeAll()
        let none = try await keychain.allKeys()
        XCTAssertEqual(none, [])
        let status = try await KeychainAdmin().status()
        XCTAssertEqual(status.caller, "TEAM.tests")
    }

    func testDeviceIdentifierAsyncAgreesWithBlocking() async throws {
        let fromAsync = try await DeviceIdentifier.current(accessGroup: "TEAM.shared")
        let blocking = try await Task.detached { try DeviceIdentifier.current(accessGroup: "TEAM.shared") }.value
        XCTAssertEqual(fromAsync, blocking)
    }

    func testDeviceIdentifierIsStableAndSharedWithKeychainctl() throws {
        let first = try DeviceIdentifier.current(accessGroup: "TEAM.shared")
        XCTAssertEqual(try DeviceIdentifier.current(accessGroup: "TEAM.shared"), first)
        let own = try DeviceIdentifier.current()
        XCTAssertNotEqual(own, first, "each group has its own identifier")
        XCTAssertEqual(try DeviceIdentifier.current(accessGroup: "TEAM.tests"), own, "the default group is the first")

        // Stored as the convention says: upper-case UUID string, cku, in the group.
        var item: CFTypeRef?
        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: "com.keychaind.device-identifier",
            kSecAttrAccount as String: "device-id", kSecAttrAccessGroup as String: "TEAM.shared",
            kSecReturnAttributes as String: true, kSecReturnData as String: true,
        ]
        XCTAssertEqual(SecItemCopyMatching(query as CFDictionary, &item), errSecSuccess)
        let attrs = try XCTUnwrap(item as? [String: Any])
        XCTAssertEqual(attrs[kSecValueData as String] as? Data, Data(first.uuidString.utf8))
        XCTAssertEqual(attrs[kSecAttrAccessible as String] as? String, "cku")

        // keychainctl registered as an admin (as the package does) reads the same group's identifier.
        try daemon.register(KeychainctlTests.cliAdmin, name: "keychainctl")
        daemon.reloadApps()
        let cli = try daemon.run(DaemonHarness.cliPath, ["device-id", "-g", "TEAM.shared"])
        XCTAssertEqual(cli.status, 0, cli.stderr)
        XCTAssertEqual(cli.stdout, first.uuidString + "\n")
    }

    /// 40 processes at once, half one app and half another of the same vendor, share one UUID.
    func testDeviceIdentifierFromFortyProcessesAtOnceIsOneUUID() throws {
        let example = DaemonHarness.productsDirectory + "/device-id-example"
        let bin = daemon.root + "/bin"
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        let app1 = bin + "/app1"
        let app2 = bin + "/app2"
        try FileManager.default.copyItem(atPath: example, toPath: app1)
        try FileManager.default.copyItem(atPath: example, toPath: app2)
        try daemon.register(
            .init(id: "TEAM.app1", groups: ["TEAM.shared", "TEAM.app1"], executables: [app1]), name: "one")
        try daemon.register(
            .init(id: "TEAM.app2", groups: ["TEAM.shared", "TEAM.app2"], executables: [app2]), name: "two")
        daemon.reloadApps()
        // One probe run of each app: both are registered now.
        XCTAssertEqual(try daemon.run(app1, ["TEAM.app1"]).status, 0, daemon.log)
        XCTAssertEqual(try daemon.run(app2, ["TEAM.app2"]).status, 0, daemon.log)

        var processes: [(Process, Pipe, Pipe)] = []
        var env = ProcessInfo.processInfo.environment
        env["KEYCHAIND_SOCKET"] = daemon.socketPath
        for i in 0..<40 {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: i % 2 == 0 ? app1 : app2)
            // Half name the group, half rely on it being their default (first) group.
            p.arguments = i % 4 < 2 ? ["TEAM.shared"] : []
            p.environment = env
            let out = Pipe()
            let err = Pipe()
            p.standardOutput = out
            p.standardError = err
            processes.append((p, out, err))
        }
        for (p, _, _) in processes { try p.run() }
        var ids: [String] = []
        for (p, out, err) in processes {
            let o = out.fileHandleForReading.readDataToEndOfFile()
            let e = err.fileHandleForReading.readDataToEndOfFile()
            p.waitUntilExit()
            XCTAssertEqual(p.terminationStatus, 0, String(decoding: e, as: UTF8.self))
            ids.append(String(decoding: o, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        }
        XCTAssertEqual(ids.count, 40)
        XCTAssertEqual(Set(ids).count, 1, "\(Set(ids))")
        XCTAssertNotNil(UUID(uuidString: ids[0]))
        XCTAssertEqual(try DeviceIdentifier.current(accessGroup: "TEAM.shared").uuidString, ids[0])
    }
}
