import KeychainCore
import KeychainDaemon
import KeychainItems
import KeychainRequests
import KeychainSystem
import KeychainWire

/// One request handler over a throw-away data directory, as the daemon builds it, with one registered
/// app so inputs reach the item layer's validation and the store.
enum FuzzHarness {
    nonisolated(unsafe) static var handler: RequestHandler?
    /// One client's session across all inputs, so a `copy` seen before is served from its memo.
    nonisolated(unsafe) static var session: RequestHandler.Session?
    /// This very process, registered as the app: identification succeeds as for a real client.
    static let executable: String = FileSystem.realPath("/proc/self/exe") ?? "/proc/self/exe"
    static let peer = PeerIdentity(
        pid: CurrentProcess.pid, uid: CurrentProcess.uid, executable: executable,
        executableFile: FileIdentity.of(path: executable), problem: nil)

    static func setUp() {
        let tmp = CurrentProcess.environment("TMPDIR").flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        guard let path = try? FileSystem.makeTemporaryDirectory(in: tmp, prefix: "keychaind-fuzz-") else {
            CurrentProcess.exit(2)
        }
        do {
            let items = try ItemService(directory: path + "/data")
            let app = AppEntry(
                applicationIdentifier: "FUZZ.app", accessGroups: ["FUZZ.app", "FUZZ.shared"],
                executables: [executable], admin: false, file: "fuzz")
            handler = RequestHandler(items: items, registry: AppRegistry(apps: [app], bundledCLI: nil))
            session = RequestHandler.Session(peer)
        } catch {
            print("keychaind-fuzz: cannot create the store: \(error)")
            CurrentProcess.exit(2)
        }
    }

    /// One input: a frame body as a client would send it. Everything must come back as a response.
    /// A `copy` of the common request shape is answered in the session (from a compiled query of its
    /// template when an earlier input had the same one), asked again (now from the session's memo)
    /// and once more without a memo: all three answers must be the same, or the memo changed meaning.
    static func run(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
        guard let handler, let session, let data else { return 0 }
        let body = Array(UnsafeBufferPointer(start: data, count: size))
        let first = handler.handle(frame: body, session: session).response
        guard body.withUnsafeBytes({ RequestShape.scan($0) })?.op == .copy else { return 0 }
        let remembered = handler.handle(frame: body, session: session).response
        let full = handler.handle(frame: body, peer: peer).response
        for (answer, how) in [(first, "the template memo"), (remembered, "the copy memo")]
        where answer.status != full.status || answer.result != full.result {
            fatalError("\(how) answered \(answer.status) where the full path answered \(full.status)")
        }
        return 0
    }
}

/// libFuzzer's entry point: hands one input to the request handler as a frame body; always returns 0.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    FuzzHarness.run(data, size)
}
