#if canImport(Glibc)
import Glibc
#endif
import KeychainCore
import KeychainItems
import KeychainDaemon

/// One request handler over a throw-away data directory, as the daemon builds it, with one registered
/// app so inputs reach the item layer's validation and the store.
enum FuzzHarness {
    nonisolated(unsafe) static var handler: RequestHandler?
    /// This very process, registered as the app: identification succeeds as for a real client.
    static let executable: String = {
        guard let p = realpath("/proc/self/exe", nil) else { return "/proc/self/exe" }
        defer { free(p) }
        return String(cString: p)
    }()
    static let peer = PeerIdentity(pid: getpid(), uid: getuid(), executable: executable,
                                   executableFile: FileIdentity.of(path: executable), problem: nil)

    static func setUp() {
        let tmp = getenv("TMPDIR").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        var template = Array("\(tmp)/keychaind-fuzz-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) != nil }
        guard made else { exit(2) }
        let path = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        do {
            let items = try ItemService(directory: path + "/data")
            let app = AppEntry(applicationIdentifier: "FUZZ.app", accessGroups: ["FUZZ.app", "FUZZ.shared"],
                               executables: [executable], admin: false, file: "fuzz")
            handler = RequestHandler(items: items, registry: AppRegistry(apps: [app], bundledCLI: nil))
        } catch {
            print("keychaind-fuzz: cannot create the store: \(error)")
            exit(2)
        }
    }

    /// One input: a frame body as a client would send it. Everything must come back as a response.
    static func run(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
        guard let handler, let data else { return 0 }
        let body = Array(UnsafeBufferPointer(start: data, count: size))
        _ = handler.handle(frame: body, peer: peer)
        return 0
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    FuzzHarness.run(data, size)
}
