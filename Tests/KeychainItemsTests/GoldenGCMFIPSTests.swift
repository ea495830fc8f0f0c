import Foundation
import KeychainCore
import KeychainItemsTestSupport
import KeychainStore
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainCrypto
@testable import KeychainItems

/// libgcrypt in FIPS mode, on the golden GCM keychain, as on a machine without AES-NI whose libgcrypt
/// is in FIPS mode (`/proc/sys/crypto/fips_enabled`). libgcrypt decides on FIPS mode once, when it
/// initialises, from the environment (`LIBGCRYPT_FORCE_FIPS_MODE`) among others, so the checks run in
/// a process of their own: this test runs itself again in a child test process with that variable set.
///
/// In FIPS mode libgcrypt opens AES-256-GCM boxes with a caller's nonce, but refuses to seal with one
/// (`gcry_cipher_setiv` on a GCM handle disables encryption: GPG_ERR_INV_STATE). So GCM rows keep
/// reading, new rows (XChaCha20-Poly1305 on such a machine) are written, and what would re-seal a GCM
/// part with AES-256-GCM is a clear errSecInternal that changes nothing: a passphrase change, which
/// re-wraps each row's item key in the construction the row has.
@Suite struct GoldenGCMFIPSTests {
    static let childVariable = "KEYCHAIND_TEST_GCRYPT_FIPS_REPORT"

    @Test func inLibgcryptsFIPSModeGCMRowsReadAndSealingOneIsAClearErrSecInternal() throws {
        if let report = ProcessInfo.processInfo.environment[Self.childVariable] {
            try Self.checksInFIPSMode()
            try "checked in FIPS mode\n".write(toFile: report, atomically: false, encoding: .utf8)
            return
        }
        let temporary = try TemporaryDirectory(prefix: "kc-golden-fips")
        let report = temporary.appending("report")
        let output = temporary.appending("output")
        try "".write(toFile: output, atomically: false, encoding: .utf8)
        let child = Process()
        child.executableURL = URL(
            fileURLWithPath: try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
        child.arguments = [
            "--testing-library", "swift-testing", "--filter", "GoldenGCMFIPSTests/inLibgcryptsFIPSMode",
        ]
        var environment = ProcessInfo.processInfo.environment
        environment["LIBGCRYPT_FORCE_FIPS_MODE"] = "1"
        environment[Self.childVariable] = report
        child.environment = environment
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: output))
        child.standardOutput = log
        child.standardError = log
        try child.run()
        child.waitUntilExit()
        try log.close()
        let said = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(child.terminationReason == .exit && child.terminationStatus == 0, "\(said)")
        #expect(
            (try? String(contentsOfFile: report, encoding: .utf8)) == "checked in FIPS mode\n",
            "the child test did not run its checks: \(said)")
    }

    /// What the child checks, with libgcrypt in FIPS mode and running AES-256-GCM for the whole item path.
    static func checksInFIPSMode() throws {
        // libgcrypt refuses to seal an AES-256-GCM box, even an empty one, and opens one libsodium sealed.
        let key = try SecureBytes(random: AEAD.keyBytes)
        for plain in [Array("a secret".utf8), []] {
            let refused = failure {
                try key.withUnsafeBytes { (k) throws(KeychainError) in
                    try withBytes(plain) { (p) throws(KeychainError) in
                        try withBytes([1, 2, 3]) { (ad) throws(KeychainError) in
                            try AEAD.seal(p, key: k, ad: ad, sealing: .aes256GCM, engine: .libgcrypt)
                        }
                    }
                }
            }
            #expect(refused?.status == .internal, "libgcrypt sealed with AES-256-GCM: not in FIPS mode?")
            #expect(refused?.message.contains("libgcrypt could not run AES-256-GCM") == true)
        }

        let temporary = try TemporaryDirectory(prefix: "kc-golden-fips")
        let directory = try GoldenGCMKeychainTests.copy(to: temporary)
        let passphrase = GoldenGCMKeychainTests.secure(GoldenGCMKeychainTests.keychainPassphrase)
        let written = GoldenGCMKeychainTests.Item(account: "written in FIPS mode", protection: "ak", secret: "new")
        // The first unlock moves the rows' digests under the passphrase index key, sealing every row
        // again: done first, outside FIPS mode and with AES-256-GCM, so the rows the change below
        // re-wraps are GCM rows still.
        do {
            let service = try ItemService(directory: directory, kdfProfile: .interactive, sealing: .aes256GCM)
            defer { service.close() }
            try service.unlock(passphrase: passphrase)
        }
        try AEAD.withLibgcryptForGCM { () throws in
            // New rows as a machine without AES-NI seals them: XChaCha20-Poly1305.
            let service = try ItemService(directory: directory, kdfProfile: .interactive, sealing: .xchacha20Poly1305)
            defer { service.close() }
            try service.unlock(passphrase: passphrase)
            try GoldenGCMKeychainTests.expectEveryItemReadsBack(service)
            _ = try service.add(
                GoldenGCMKeychainTests.query(written, ["v_Data": .bytes(Array("new".utf8)), "pdmn": .text("ak")]),
                caller: GoldenGCMKeychainTests.app)
            let change = failure {
                try service.changePassphrase(old: passphrase, new: GoldenGCMKeychainTests.secure("another"))
            }
            #expect(change?.status == .internal)
            #expect(
                change?.message.contains("libgcrypt could not run AES-256-GCM") == true, "\(String(describing: change))"
            )
        }
        // Nothing changed: the old passphrase opens everything, the new row included.
        let service = try GoldenGCMKeychainTests.open(directory)
        defer { service.close() }
        #expect(!service.rowCheck.resealed && service.rowCheck.rows == GoldenGCMKeychainTests.items.count + 1)
        try service.unlock(passphrase: passphrase)
        try GoldenGCMKeychainTests.expectEveryItemReadsBack(service, extra: 1)
        #expect(try GoldenGCMKeychainTests.secret(service, written) == "new")
    }
}
