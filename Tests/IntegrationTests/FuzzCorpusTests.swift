import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// Replays the fuzzing corpus (Tests/FuzzCorpus: real requests, and regressions/: every input the
/// fuzzer ever crashed on) through the plain build of keychaind-fuzz, and sends the worst of them to
/// the real daemon. scripts/fuzz copies new findings into regressions/.
final class FuzzCorpusTests: XCTestCase {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("FuzzCorpus").path

    func testTheFuzzTargetReplaysTheSeedCorpusAndEveryRegressionWithoutACrash() throws {
        let fuzz = DaemonHarness.productsDirectory + "/keychaind-fuzz"
        guard FileManager.default.isExecutableFile(atPath: fuzz) else {
            return XCTFail("\(fuzz) is not built (swift build --build-tests builds every product)")
        }
        let regressions = Self.corpus + "/regressions"
        let files = try FileManager.default.contentsOfDirectory(atPath: regressions).filter { !$0.hasPrefix(".") }
        XCTAssertFalse(files.isEmpty, "regressions/ holds every crash found so far")
        let d = try DaemonHarness(start: false)
        let out = try d.run(
            fuzz, [Self.corpus, regressions], environment: ["SWIFT_BACKTRACE": "enable=no", "TMPDIR": d.root])
        XCTAssertEqual(
            out.status, 0, "a corpus input crashed keychaind-fuzz:\n\(out.stdout)\n\(out.stderr.suffix(4000))")
        XCTAssertTrue(out.stdout.contains("without a crash"), out.stdout)
    }

    /// Found by the fuzzer: tag 1 heads nested without limit recursed once per byte; a 100 KB frame of
    /// 0xC1 overflowed a connection thread's stack and killed the daemon, before any identity check.
    /// An unregistered peer may now send at most 16 KiB, so the long chains come from a registered app.
    func testALongChainOfTagsIsErrSecParamAndTheDaemonKeepsServing() throws {
        let unregistered = try DaemonHarness(apps: [])
        try tagChains([3_000], unregistered)
        let big = try unregistered.connect()
        try big.sendRaw([0, 1, 0x86, 0xA0] + [0xA1, 0x61, 0x76] + [UInt8](repeating: 0xC1, count: 10))
        let refused = try big.receive()
        XCTAssertEqual(refused.status, .param)
        XCTAssertTrue(refused.message?.contains("exceeds the limit of 16384 bytes") ?? false, refused.message ?? "")
        try tagChains([3_000, 100_000, 1_048_000], try DaemonHarness())
    }

    func tagChains(_ sizes: [Int], _ d: DaemonHarness) throws {
        for n in sizes {
            let c = try d.connect()
            let body: [UInt8] = [0xA1, 0x61, 0x76] + [UInt8](repeating: 0xC1, count: n) + [0x01]
            let n = UInt32(body.count)
            try c.sendRaw(
                [
                    UInt8(n >> 24), UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8),
                    UInt8(truncatingIfNeeded: n),
                ] + body)
            let r = try c.receive()
            XCTAssertEqual(r.status, .param)
            XCTAssertTrue(r.message?.contains("tag 1 must hold") ?? false, r.message ?? "")
        }
        XCTAssertEqual(try d.connect().call("status").status, .success, "the daemon survived")
    }
}
