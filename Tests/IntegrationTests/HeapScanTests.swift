import Foundation
import KeychainClient
import KeychainServices
import KeychainWire
import XCTest

/// A secret written and read through the daemon leaves no copy in its memory: every buffer it passed
/// through (socket reads, frames, the decoded request, the opened item, the response) is wiped.
///
/// The daemon normally makes itself non-dumpable, which also hides its memory from processes of its
/// own user. Debug builds honour `KEYCHAIND_TEST_DUMPABLE=1` to stay dumpable, so this test can read
/// `/proc/<pid>/mem`; release builds do not contain that switch at all (docs/security.md §1).
final class HeapScanTests: XCTestCase {
    var daemon: DaemonHarness!

    override func setUpWithError() throws {
        daemon = try DaemonHarness(start: false)
        try daemon.start(extraEnvironment: ["KEYCHAIND_TEST_DUMPABLE": "1"])
    }

    override func tearDown() {
        daemon = nil
    }

    /// 64 bytes no other program holds: a marker and random bytes.
    private func distinctiveSecret() -> [UInt8] {
        var secret = Array("KCHEAPSCAN:".utf8)
        var generator = SystemRandomNumberGenerator()
        while secret.count < 64 { secret.append(UInt8.random(in: 0x21...0x7E, using: &generator)) }
        return secret
    }

    /// Where in the daemon's readable memory any 16-byte piece of `secret` appears.
    private func copies(of secret: [UInt8], in pid: Int32) throws -> [String] {
        let maps = try String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8)
        let mem = open("/proc/\(pid)/mem", O_RDONLY)
        guard mem >= 0 else { throw HarnessError("cannot open /proc/\(pid)/mem: errno \(errno)") }
        defer { close(mem) }
        let pieces = stride(from: 0, to: secret.count, by: 16).map { Array(secret[$0..<min($0 + 16, secret.count)]) }
        var found: [String] = []
        var scanned = 0
        var skipped = 0
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, fields[1].hasPrefix("r") else { continue }
            let name = fields.count >= 6 ? String(fields[5]) : "[anonymous]"
            if name == "[vvar]" || name == "[vsyscall]" || name == "[vvar_vclock]" { continue }
            let range = fields[0].split(separator: "-").compactMap { UInt64($0, radix: 16) }
            guard range.count == 2 else { continue }
            // A sanitizer runtime reserves terabytes of shadow memory; reading it would take hours.
            // The daemon's own heap arenas, stacks and images are far smaller than this.
            if range[1] - range[0] > Self.largestMapping {
                skipped += 1
                continue
            }
            var offset = range[0]
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            while offset < range[1] {
                let want = Int(min(UInt64(buffer.count), range[1] - offset))
                let n = buffer.withUnsafeMutableBytes {
                    pread(mem, $0.baseAddress, want, off_t(Int64(bitPattern: offset)))
                }
                guard n > 0 else { break }
                scanned += n
                for (i, piece) in pieces.enumerated() {
                    let hit = buffer.withUnsafeBytes { b in
                        piece.withUnsafeBytes { p in Self.contains(UnsafeRawBufferPointer(rebasing: b[0..<n]), p) }
                    }
                    if hit {
                        found.append("piece \(i) in \(name) (\(fields[0]))")
                        if i == 1 {
                            found.append(
                                buffer.withUnsafeBytes { b in
                                    piece.withUnsafeBytes { p in
                                        Self.context(of: p, in: UnsafeRawBufferPointer(rebasing: b[0..<n]))
                                    }
                                })
                        }
                    }
                }
                // Overlap the next read so a piece split across two reads is still found.
                offset += UInt64(max(n - 16, 1))
            }
        }
        XCTAssertGreaterThan(scanned, 1 << 20, "the scan read almost nothing of the daemon's memory")
        if skipped > 0 {
            // Only under ASan/TSan: their allocators keep the heap inside such reservations, so the
            // scan could not see the daemon's heap and would prove nothing. The plain debug run of
            // the suite (scripts/test runs it before the sanitizers) is the one that makes the claim.
            throw XCTSkip(
                "a sanitizer runtime keeps the daemon's heap in \(skipped) mappings over \(Self.largestMapping >> 30) GiB, too large to read"
            )
        }
        return found
    }

    /// Mappings larger than this are not read (see `copies`).
    private static let largestMapping: UInt64 = 4 << 30

    /// The bytes around the first occurrence of `needle` (hex, the needle itself masked), to tell
    /// which buffer kept it.
    private static func context(of needle: UnsafeRawBufferPointer, in haystack: UnsafeRawBufferPointer) -> String {
        guard let base = haystack.baseAddress else { return "" }
        var at = 0
        while at + needle.count <= haystack.count {
            if memcmp(base + at, needle.baseAddress!, needle.count) == 0 {
                let from = max(0, at - 96)
                let to = min(haystack.count, at + needle.count + 96)
                let hex = (from..<to).map { i in
                    (at..<(at + needle.count)).contains(i) ? "**" : String(format: "%02x", haystack[i])
                }
                return "context: " + hex.joined()
            }
            at += 1
        }
        return ""
    }

    /// Whether `needle` occurs in `haystack` (memchr for its first byte, then memcmp).
    private static func contains(_ haystack: UnsafeRawBufferPointer, _ needle: UnsafeRawBufferPointer) -> Bool {
        guard let base = haystack.baseAddress, let first = needle.first, haystack.count >= needle.count else {
            return false
        }
        var at = 0
        let last = haystack.count - needle.count
        while at <= last {
            guard let hit = memchr(base + at, Int32(first), last - at + 1) else { return false }
            let i = base.distance(to: UnsafeRawPointer(hit))
            if memcmp(base + i, needle.baseAddress!, needle.count) == 0 { return true }
            at = i + 1
        }
        return false
    }

    func testASecretWrittenAndReadLeavesNoCopyInTheDaemon() throws {
        let pid = try XCTUnwrap(daemon.process?.processIdentifier)
        let secret = distinctiveSecret()
        let connection = KeychainConnection(socketPath: daemon.socketPath)
        let keychain = Keychain(service: "com.example.heapscan", connection: connection)
        try keychain.set(Data(secret), forKey: "account")
        for _ in 0..<3 { XCTAssertEqual(try keychain.data(forKey: "account"), Data(secret)) }
        // The client has the answer as soon as the daemon wrote it, possibly before the daemon's
        // thread zeroed its buffers (right after the write). One more request on the same connection,
        // answered, means the daemon has finished with the one before.
        XCTAssertNil(try keychain.data(forKey: "no such account"))
        let whileConnected = try copies(of: secret, in: pid)
        XCTAssertEqual(
            whileConnected, [], "the secret is still in the daemon's memory while the client stays connected")
        connection.retarget(socketPath: "/nonexistent")  // drops the link: the daemon's connection thread ends
        XCTAssertTrue(
            daemon.waitFor {
                (try? daemon.connect().call("status").result?.map?["connections"]?.int) == 1
            })
        let afterClose = try copies(of: secret, in: pid)
        XCTAssertEqual(afterClose, [], "the secret is still in the daemon's memory after the connection ended")
    }

    /// The scan finds what is there: the daemon's socket path, which it keeps in its heap (a path
    /// this test made up), and not a secret the daemon was never given.
    func testTheScanSeesTheDaemonsMemory() throws {
        let pid = try XCTUnwrap(daemon.process?.processIdentifier)
        let own = try copies(of: Array(daemon.socketPath.utf8), in: pid)
        XCTAssertFalse(own.isEmpty, "the scan did not find the daemon's own socket path in its memory")
        let absent = try copies(of: distinctiveSecret(), in: pid)
        XCTAssertTrue(absent.isEmpty)
    }
}
