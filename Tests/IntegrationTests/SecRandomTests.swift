import Foundation
// Only what iOS code imports: `SecRandomCopyBytes` and `kSecRandomDefault` come from `import Security`.
import Security
import XCTest

/// Key and token generation as iOS code writes it, unchanged.
final class SecRandomTests: XCTestCase {
    func testSecRandomCopyBytesFillsAnArrayAsOnIOS() {
        var key = [UInt8](repeating: 0, count: 32)
        let status = SecRandomCopyBytes(kSecRandomDefault, key.count, &key)
        XCTAssertEqual(status, errSecSuccess)
        var again = [UInt8](repeating: 0, count: 32)
        XCTAssertEqual(SecRandomCopyBytes(kSecRandomDefault, again.count, &again), errSecSuccess)
        // 256 random bits: all zero, or two draws alike, would mean nothing was written.
        XCTAssertNotEqual(key, [UInt8](repeating: 0, count: 32))
        XCTAssertNotEqual(key, again)
    }

    func testSecRandomCopyBytesFillsDataThroughItsBuffer() {
        var token = Data(count: 64)
        let status = token.withUnsafeMutableBytes { SecRandomCopyBytes(kSecRandomDefault, 64, $0.baseAddress!) }
        XCTAssertEqual(status, errSecSuccess)
        XCTAssertNotEqual(token, Data(count: 64))
        // Every byte value is possible: 4 KiB of output uses most of them (a stuck or short fill would not).
        var large = [UInt8](repeating: 0, count: 4096)
        XCTAssertEqual(SecRandomCopyBytes(kSecRandomDefault, large.count, &large), errSecSuccess)
        XCTAssertGreaterThan(Set(large).count, 200)
    }

    func testANegativeCountIsErrSecParamAndWritesNothing() {
        var bytes = [UInt8](repeating: 7, count: 8)
        XCTAssertEqual(SecRandomCopyBytes(kSecRandomDefault, -1, &bytes), errSecParam)
        XCTAssertEqual(bytes, [UInt8](repeating: 7, count: 8))
        XCTAssertEqual(SecRandomCopyBytes(kSecRandomDefault, 0, &bytes), errSecSuccess)
    }
}
