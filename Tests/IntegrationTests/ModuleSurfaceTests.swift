import Foundation
import XCTest

/// What an app sees after `import Security` or `import KeychainServices`, checked the way an app's
/// compiler sees it: by type-checking small programs against the built modules, from outside the
/// package (so `package` declarations are hidden, as they are for every user).
final class ModuleSurfaceTests: XCTestCase {
    private var scratch: String!

    override func setUpWithError() throws {
        scratch = NSTemporaryDirectory() + "keychaind-surface-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: scratch)
    }

    /// Runs `swiftc -typecheck` on `source` against the package's built modules.
    private func typecheck(_ source: String, name: String) throws -> (status: Int32, output: String) {
        let file = scratch + "/\(name).swift"
        try source.writeReplacing(file)
        let modules = DaemonHarness.productsDirectory + "/Modules"
        XCTAssertTrue(
            FileManager.default.fileExists(atPath: modules + "/Security.swiftmodule"),
            "built modules not found in \(modules)")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // What SwiftPM hands a dependent package: the built Swift modules and the module map of the
        // C target the system layer is built on.
        let cSupport = DaemonHarness.productsDirectory + "/CSupport.build/module.modulemap"
        p.arguments = [
            "swiftc", "-typecheck", "-swift-version", "6", "-I", modules, "-I", scratch,
            "-Xcc", "-fmodule-map-file=\(cSupport)", file,
        ]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        return (p.terminationStatus, text)
    }

    func testIOSStyleCodeCompilesWithImportSecurityAlongsideFoundation() throws {
        let source = """
            import Foundation
            import Security

            // Foundation's Operation stays unambiguous.
            final class Job: Operation, @unchecked Sendable { override func main() {} }

            func save(_ token: String, account: String) -> OSStatus {
                let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword,
                                            kSecAttrService as String: "com.example.app",
                                            kSecAttrAccount as String: account.data(using: .utf8)!,
                                            kSecValueData as String: Data(token.utf8)]
                SecItemDelete(query as CFDictionary)
                return SecItemAdd(query as CFDictionary, nil)
            }

            func account(of item: CFTypeRef?) -> Data? {
                (item as? [AnyHashable: Any])?[kSecAttrAccount] as? Data
            }

            func message() -> CFString? { SecCopyErrorMessageString(errSecItemNotFound, nil) }
            """
        for module in ["Security", "KeychainServices"] {
            let r = try typecheck(
                source.replacingOccurrences(of: "import Security", with: "import \(module)"), name: "ok-\(module)")
            XCTAssertEqual(r.status, 0, "with import \(module):\n\(r.output)")
        }
    }

    func testTheSwiftNativeAPIComesWithImportKeychainServices() throws {
        let r = try typecheck(
            """
            import KeychainServices

            func swiftNative() throws {
                let keychain = Keychain(service: "com.example.app", connection: KeychainConnection(socketPath: "/tmp/s"))
                do throws(KeychainError) {
                    try keychain.set("v", forKey: "k")
                } catch where error.status == Status.itemNotFound || error.osStatus == errSecParam {
                }
                _ = try DeviceIdentifier.current()
                _ = SecCopyErrorMessageString(errSecItemNotFound, nil)
            }
            """, name: "native")
        XCTAssertEqual(r.status, 0, r.output)
    }

    /// A wrapper module declaring its own `Keychain`, `KeychainError` and `Status` (KeychainAccess,
    /// Valet) is used beside `import Security` as on Apple platforms: those names are the wrapper's,
    /// unqualified. (`import Security` brought this package's own too, and made them ambiguous or
    /// silently ours.)
    func testAWrappersOwnKeychainAndStatusDoNotClashWithImportSecurity() throws {
        let wrapper = scratch + "/Wrapper.swift"
        try """
        public final class Keychain { public init(service: String) {} }
        public struct KeychainError: Error { public init() {} }
        public struct Status: Error { public let code: Int; public init(code: Int) { self.code = code } }
        """.writeReplacing(wrapper)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [
            "swiftc", "-emit-module", "-module-name", "Wrapper", "-emit-module-path",
            scratch + "/Wrapper.swiftmodule", wrapper,
        ]
        try p.run()
        p.waitUntilExit()
        XCTAssertEqual(p.terminationStatus, 0, "the stand-in wrapper module builds")
        let r = try typecheck(
            """
            import Foundation
            import Security
            import Wrapper

            let keychain: Keychain = Keychain(service: "com.example.app")
            func fail() throws { throw KeychainError() }
            func code(_ e: Error) -> Int? { (e as? Status)?.code }
            let status: OSStatus = SecItemDelete([kSecClass as String: kSecClassGenericPassword] as CFDictionary)
            """, name: "beside-a-wrapper")
        XCTAssertEqual(r.status, 0, r.output)
    }

    func testNothingBelowTheClientAPILeaksIntoTheApp() throws {
        // Names of the modules underneath that an app must not see (they would collide with its own
        // or with Foundation's, like `Operation`).
        let hidden = [
            "Operation", "Value", "Frame", "FrameBuffer", "UnixSocket", "Lock", "Locked", "Request",
            "Response", "CBOR", "SocketLocation", "SocketAddress", "KeychainAdmin",
            "DeviceIdentifierConvention", "SecConstant", "Conversion",
        ]
        // `import Security` brings Apple's names alone: none of this package's Swift-native API.
        let native = ["Keychain", "KeychainError", "Status", "DeviceIdentifier", "KeychainConnection"]
        for module in ["Security", "KeychainServices"] {
            let names = module == "Security" ? hidden + native : hidden
            var source = "import \(module)\n"
            for (i, name) in names.enumerated() { source += "let v\(i): \(name).Type? = nil\n" }
            if module == "KeychainServices" {
                // The connection's request API is the package's own.
                source += "func f(_ c: KeychainConnection) { _ = try? c.call(.copy) }\n"
            }
            let r = try typecheck(source, name: "hidden-\(module)")
            XCTAssertNotEqual(r.status, 0, "expected errors with import \(module)")
            for name in names {
                XCTAssertTrue(
                    r.output.contains("cannot find type '\(name)' in scope"),
                    "\(name) is visible after import \(module):\n\(r.output)")
            }
            if module == "KeychainServices" {
                XCTAssertTrue(
                    r.output.contains("no member 'call'") || r.output.contains("'call' is inaccessible"),
                    "KeychainConnection.call is visible after import \(module):\n\(r.output)")
            }
        }
    }
}
