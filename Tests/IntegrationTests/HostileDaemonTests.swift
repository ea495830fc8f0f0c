import Foundation
import KeychainClient
import KeychainCore
import KeychainServices
import KeychainWire
import XCTest

/// Any process of the user can serve keychaind's socket in its place (docs/security.md, "No trusted
/// path"). What it answers must reach the app as an error, never as an object of another type than
/// Apple's call promises — ported code casts with `as! Data` or `as! [[String: Any]]` and would trap.
final class HostileDaemonTests: XCTestCase {
    /// A fake that answers every `copy` (and `add`) with `result`, and everything else with success.
    private func impostor(answering result: Value?) throws -> FakeDaemon {
        let fake = try FakeDaemon { d, s, c in
            var frames = FrameBuffer()
            while let r = d.receive(s, &frames, connection: c) {
                d.answer(s, Response(id: r.id, result: r.op == "copy" || r.op == "add" ? result : nil))
            }
        }
        addTeardownBlock { fake.stop() }
        KeychainConnection.shared.retarget(socketPath: fake.path)
        addTeardownBlock { KeychainConnection.shared.retarget(socketPath: nil) }
        return fake
    }

    private func copy(_ extra: [String: Any]) -> (OSStatus, CFTypeRef?) {
        var query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "s"]
        for (k, v) in extra { query[k] = v }
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        return (status, result)
    }

    private let data: [String: Any] = [kSecReturnData as String: true]
    private let attributes: [String: Any] = [kSecReturnAttributes as String: true]
    private let all: [String: Any] = [kSecReturnData as String: true, kSecMatchLimit as String: kSecMatchLimitAll]

    func testAResultOfAnotherShapeThanTheQueryAskedForIsErrSecDecode() throws {
        let cases: [(Value?, [String: Any], String)] = [
            (nil, data, "no result at all"),
            (.int(5), data, "an integer for the data"),
            (.text("pw"), data, "text for the data"),
            (.map(["v_Data": .bytes([1])]), data, "a map for the data"),
            (.array([.bytes([1])]), data, "an array for one item"),
            (.bytes([1]), all, "one item for kSecMatchLimitAll"),
            (.array([]), all, "no items for a success"),
            (.array([.bytes([1]), .int(2)]), all, "an array with an integer in it"),
            (.bytes([1]), attributes, "bytes for the attributes"),
            (.map(["acct": .int(5)]), attributes, "an integer account"),
            (.map(["cdat": .text("yesterday")]), attributes, "text for a date"),
            (.map(["crtr": .int(1 << 40)]), attributes, "a creator beyond 32 bits"),
            (.map(["labl": .text("l")]), data.merging(attributes) { a, _ in a }, "no v_Data beside the attributes"),
        ]
        for (result, query, what) in cases {
            _ = try impostor(answering: result)
            let (status, value) = copy(query)
            XCTAssertEqual(status, errSecDecode, what)
            XCTAssertNil(value, what)
        }
    }

    func testTheShapeThatWasAskedForIsHandedBackWithoutUnknownKeys() throws {
        _ = try impostor(answering: .bytes(Array("pw".utf8)))
        XCTAssertEqual(copy(data).1 as? Data, Data("pw".utf8))
        _ = try impostor(answering: .array([.bytes([1]), .bytes([2])]))
        XCTAssertEqual(copy(all).1 as? [Data], [Data([1]), Data([2])])
        _ = try impostor(
            answering: .map(["acct": .text("a"), "crtr": .int(7), "zzzz": .int(1), "v_Data": .bytes([9])]))
        let item = try XCTUnwrap(copy(attributes).1 as? [String: Any])
        XCTAssertEqual(item[kSecAttrAccount as String] as? String, "a")
        XCTAssertEqual(item[kSecAttrCreator as String] as? Int, 7)
        XCTAssertNil(item["zzzz"], "a key that is no attribute is left out")
        XCTAssertNil(item[kSecValueData as String], "the data was not asked for")
        // No return keys: nothing is handed back, whatever arrives.
        _ = try impostor(answering: .int(5))
        let (status, value) = copy([:])
        XCTAssertEqual(status, errSecSuccess)
        XCTAssertNil(value)
    }
}
