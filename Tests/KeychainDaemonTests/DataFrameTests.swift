import Foundation
import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainSystem
import KeychainWire
import Testing

@testable import KeychainDaemon
@testable import KeychainRequests

/// A `copy` of one item's data that a connection serves from its memo is opened into a buffer on
/// the stack and framed from there (`ItemService.withData`, `Response.appendSuccess(id:data:to:)`).
/// What the client receives must not change: the same frame, byte for byte, as the full path, after
/// the answers already waiting in the output, found or not, locked or not.
@Suite("Data framed in place")
struct DataFrameTests {
    /// A handler over a store in a temporary directory, with this process registered as the app.
    final class Fixture {
        let directory: String
        let items: ItemService
        let handler: RequestHandler
        let peer: ConnectionPeer
        let caller = Caller(applicationIdentifier: "TEAM.app", accessGroups: ["TEAM.app", "TEAM.shared"])

        init() throws {
            directory = try FileSystem.makeTemporaryDirectory(in: NSTemporaryDirectory(), prefix: "kc-data-frame-")
            items = try ItemService(directory: directory + "/data", kdfProfile: .interactive)
            let executable = FileSystem.realPath("/proc/self/exe") ?? "/proc/self/exe"
            let app = AppEntry(
                applicationIdentifier: caller.applicationIdentifier, accessGroups: caller.accessGroups,
                executables: [executable], admin: false, file: "test")
            handler = RequestHandler(items: items, registry: AppRegistry(apps: [app], bundledCLI: nil))
            peer = ConnectionPeer(
                PeerIdentity(
                    pid: CurrentProcess.pid, uid: CurrentProcess.uid, executable: executable,
                    executableFile: FileIdentity.of(path: executable), problem: nil))
        }

        /// Closes the store and removes its directory.
        func remove() {
            items.close()
            try? FileManager.default.removeItem(atPath: directory)
        }

        /// The frame body a client sends for `op` with `query`.
        func body(_ id: Int64, _ op: String, _ query: [String: Value]) -> [UInt8] {
            CBOR.encode(Request(id: id, op: op, query: query).value)
        }

        /// What a connection appends to an output already holding `prefix` for `body`, served with
        /// `memo` (nil: the full path every time).
        func answer(_ body: [UInt8], memo: CopyMemo?, after prefix: [UInt8]) -> [UInt8] {
            var output = SecretBytes(prefix)
            let close = body.withUnsafeBytes { handler.respond(frame: $0, peer: peer, memo: memo, into: &output) }
            #expect(!close, "a well-formed request closed the connection")
            return output.unprotectedArray
        }
    }

    static func copyQuery(_ account: String) -> [String: Value] {
        ["class": .text("genp"), "svce": .text("svc"), "acct": .text(account), "r_Data": .bool(true)]
    }

    @Test("a copy served from the memo frames its data as the full path does, after what is waiting")
    func framesAsTheFullPath() throws {
        let fx = try Fixture()
        defer { fx.remove() }
        let prefix: [UInt8] = [0xAA, 0xBB, 0xCC]
        for (account, secret) in [("alice", "alice-secret"), ("bob", String(repeating: "b", count: 3000))] {
            var add = Self.copyQuery(account)
            add["r_Data"] = nil
            add["v_Data"] = .bytes(Array(secret.utf8))
            let added = fx.answer(fx.body(1, "add", add), memo: nil, after: [])
            #expect(added == Response(id: 1).frame(), "add \(account)")
        }
        // The query shape takes the lent path (one item's data alone) and the memo's fast path.
        #expect(fx.items.lendsData(try fx.items.compileCopy(Self.copyQuery("alice"), caller: fx.caller)))
        #expect(fx.body(2, "copy", Self.copyQuery("alice")).withUnsafeBytes { RequestShape.scan($0) } != nil)

        let memo = CopyMemo()
        // Compiled, then from the memo; another account from the template, twice (in place, then
        // recompiled and kept), then from the memo; one that names nothing; ids of every head size.
        let accounts = ["alice", "alice", "bob", "bob", "bob", "carol", "carol", "alice"]
        let ids: [Int64] = [0, 23, 24, 300, 70_000, 1 << 33, .max, 5]
        var lent = 0
        for (account, id) in zip(accounts, ids) {
            let body = fx.body(id, "copy", Self.copyQuery(account))
            let viaMemo = fx.answer(body, memo: memo, after: prefix)
            let full = fx.answer(body, memo: nil, after: prefix)
            #expect(viaMemo == full, "\(account) id \(id)")
            if account == "carol" {
                // The status as the full path gives it, whatever its message.
                let response = try Self.response(Array(viaMemo.dropFirst(prefix.count)))
                #expect(response.status == .itemNotFound && response.id == id)
                #expect(Array(viaMemo.prefix(prefix.count)) == prefix)
            } else {
                let secret = account == "alice" ? "alice-secret" : String(repeating: "b", count: 3000)
                let expected = Response(id: id, result: .bytes(Array(secret.utf8))).frame()
                #expect(viaMemo == prefix + expected, "\(account) id \(id)")
                lent += 1
            }
        }
        #expect(lent == 6)
    }

    @Test("a copy from the memo of a locked item answers errSecInteractionNotAllowed and nothing else")
    func lockedItemAnswersTheErrorAlone() throws {
        let fx = try Fixture()
        defer { fx.remove() }
        var add = Self.copyQuery("alice")
        add["r_Data"] = nil
        add["v_Data"] = .bytes(Array("alice-secret".utf8))
        _ = fx.answer(fx.body(1, "add", add), memo: nil, after: [])
        let passphrase = try Array("pw".utf8).withUnsafeBytes { try SecureBytes(copying: $0) }
        _ = try fx.items.changePassphrase(old: nil, new: passphrase)
        let memo = CopyMemo()
        let body = fx.body(2, "copy", Self.copyQuery("alice"))
        // Compiled and kept, then served from the memo while unlocked: the data.
        for _ in 0..<2 {
            #expect(
                fx.answer(body, memo: memo, after: [0x01])
                    == [0x01] + Response(id: 2, result: .bytes(Array("alice-secret".utf8))).frame())
        }
        try fx.items.lock()
        let viaMemo = fx.answer(body, memo: memo, after: [0x01])
        let full = fx.answer(body, memo: nil, after: [0x01])
        #expect(viaMemo == full)
        #expect(viaMemo.first == 0x01)
        let response = try Self.response(Array(viaMemo.dropFirst()))
        #expect(response.status == .interactionNotAllowed && response.id == 2 && response.result == nil)
        #expect(!viaMemo.containsSubsequence(Array("alice-secret".utf8)))
    }

    /// The one response in `frame` (a length header and a CBOR map, nothing after it).
    static func response(_ frame: [UInt8]) throws -> Response {
        try #require(frame.count >= 4)
        let length = frame.prefix(4).reduce(0) { $0 << 8 | Int($1) }
        try #require(frame.count == 4 + length, "more or less than one frame")
        return try Response(try CBOR.decode(Array(frame.dropFirst(4))))
    }
}

extension Array where Element == UInt8 {
    fileprivate func containsSubsequence(_ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, needle.count <= count else { return needle.isEmpty }
        return (0...(count - needle.count)).contains { Array(self[$0..<$0 + needle.count]) == needle }
    }
}
