import Foundation
import KeychainCore
import KeychainItems
import KeychainSystem
import Testing

@testable import KeychainDaemon
@testable import KeychainRequests

#if canImport(Glibc)
    import Glibc
#endif

/// The access policy as a table (docs/security.md §2): every op for every kind of caller, then the item-level
/// group rules, then what identification makes of peers that are not who they claim to be.
@Suite("AccessPolicyTable")
struct AccessPolicyTableTests {
    typealias Action = KeychainCore.Operation

    enum Who: String, CaseIterable {
        case unregistered, app, admin
        var caller: Caller? {
            switch self {
            case .unregistered: return nil
            case .app: return Caller(applicationIdentifier: "T.app", accessGroups: ["T.app", "T.shared"])
            case .admin: return Caller(applicationIdentifier: "T.admin", accessGroups: ["T.admin"], isAdmin: true)
            }
        }
    }

    enum Expect: Equatable { case allow, presence, missingEntitlement }

    /// What `decide` answers, with and without a passphrase set.
    static func expected(_ action: Action, _ who: Who, passphraseSet: Bool) -> Expect {
        if action == .status { return .allow }
        switch who {
        case .unregistered: return .missingEntitlement
        case .app:
            switch action {
            case .add, .copy, .update, .delete, .lock, .unlock: return .allow
            default: return .missingEntitlement
            }
        case .admin:
            switch action {
            case .backup, .restore, .approve, .revoke: return passphraseSet ? .presence : .allow
            default: return .allow
            }
        }
    }

    @Test(arguments: Action.allCases)
    func everyOpForEveryCaller(_ action: Action) {
        for who in Who.allCases {
            for passphraseSet in [false, true] {
                let decision = AccessPolicy.decide(
                    action, caller: who.caller, unidentified: "not registered", passphraseSet: passphraseSet)
                let got: Expect
                switch decision {
                case .allow: got = .allow
                case .allowWithPresence: got = .presence
                case .deny(let e):
                    #expect(e.status == .missingEntitlement, "\(action) \(who): \(e)")
                    got = .missingEntitlement
                }
                #expect(
                    got == Self.expected(action, who, passphraseSet: passphraseSet),
                    "\(action.rawValue) by \(who.rawValue), passphrase \(passphraseSet)")
            }
        }
    }

    @Test func anUnregisteredCallerIsToldWhy() {
        guard
            case .deny(let e) = AccessPolicy.decide(
                .copy, caller: nil, unidentified: "executable /x is not registered", passphraseSet: true)
        else {
            Issue.record("not denied")
            return
        }
        #expect(e.message == "executable /x is not registered")
    }

    // MARK: Groups

    @Test func anAppNamingAForeignGroupIsMissingEntitlement() throws {
        let app = Who.app.caller!
        #expect(
            throws: KeychainError(.missingEntitlement, "the caller is not entitled to the access group named in agrp")
        ) {
            try AccessPolicy.checkEntitlement("T.other", app)
        }
        try AccessPolicy.checkEntitlement("T.shared", app)
        #expect(try AccessPolicy.scope(naming: nil, app) == ["T.app", "T.shared"])
        #expect(try AccessPolicy.scope(naming: nil, Who.admin.caller!) == nil, "an admin's query spans every group")
    }

    @Test func groupsCompareByteForByte() throws {
        let nfc = "caf\u{E9}"
        let nfd = "cafe\u{301}"
        #expect(nfc == nfd, "Swift calls them equal")
        let app = Caller(accessGroups: [nfc])
        #expect(throws: KeychainError.self) { try AccessPolicy.checkEntitlement(nfd, app) }
        #expect(try AccessPolicy.scope(naming: nil, Caller(accessGroups: [nfc, nfd, nfc])) == [nfc, nfd])
    }

    @Test(arguments: [AccessPolicy.Reach.readSecrets, .write])
    func anAdminProvesPresenceOutsideItsOwnGroups(_ reach: AccessPolicy.Reach) throws {
        var admin = Who.admin.caller!
        admin.hasPresence = false
        try AccessPolicy.checkAdminReach(["T.admin"], reach, admin)
        do {
            try AccessPolicy.checkAdminReach(["T.admin", "T.app"], reach, admin)
            Issue.record("an admin without presence reached another group")
        } catch {
            #expect(error.status == .authFailed && error.needsPassphrase)
        }
        admin.hasPresence = true
        try AccessPolicy.checkAdminReach(["T.app"], reach, admin)
        // Apps never get that far (their scope is their groups); the check leaves them alone.
        try AccessPolicy.checkAdminReach(["T.app"], reach, Who.app.caller!)
    }

    // MARK: Frames

    @Test func everyFrameComesFromTheIdentifiedProcess() {
        #expect(AccessPolicy.checkWriter(writerPID: 10, identifiedPID: 10, identifiedIsRunning: true) == nil)
        #expect(
            AccessPolicy.checkWriter(writerPID: 11, identifiedPID: 10, identifiedIsRunning: true)?.status
                == .missingEntitlement,
            "a foreign frame sender")
        #expect(
            AccessPolicy.checkWriter(writerPID: 10, identifiedPID: 10, identifiedIsRunning: false)?.status
                == .missingEntitlement,
            "the identified process is gone: its pid may be someone else's now")
        #expect(
            AccessPolicy.checkWriter(writerPID: 0, identifiedPID: 10, identifiedIsRunning: true)?.status
                == .missingEntitlement,
            "no credentials on the bytes")
    }

    @Test func onlyTheDaemonsOwnUserIsAdmitted() {
        #expect(AccessPolicy.admit(peerUID: 1000, daemonUID: 1000) == nil)
        #expect(AccessPolicy.admit(peerUID: 1001, daemonUID: 1000)?.status == .missingEntitlement)
    }

    // MARK: Identification

    /// A registry with one app whose executable is a real file, and peers claiming to run it.
    @Test func identificationNeedsTheRegisteredFileItselfInTheDaemonsNamespace() throws {
        let dir = NSTemporaryDirectory() + "policy-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let exe = dir + "/app"
        try Data("#!".utf8).write(to: URL(fileURLWithPath: exe))
        let other = dir + "/other"
        try Data("#!".utf8).write(to: URL(fileURLWithPath: other))
        let entry = AppEntry(
            applicationIdentifier: "T.app", accessGroups: ["T.app"], executables: [exe], admin: false, file: "t")
        let registry = AppRegistry(apps: [entry], bundledCLI: nil)
        func peer(_ path: String?, file: FileIdentity?, problem: String? = nil) -> PeerIdentity {
            PeerIdentity(pid: 42, uid: getuid(), executable: path, executableFile: file, problem: problem)
        }
        let real = try #require(FileIdentity.of(path: exe))
        #expect((try? registry.identify(peer(exe, file: real)).get())?.applicationIdentifier == "T.app")
        // Replaced executable: a process still running the old file (another inode) at that path.
        let replaced = registry.identify(peer(exe, file: FileIdentity.of(path: other)))
        #expect(replaced.failureMessage?.contains("does not run the file registered at \(exe)") == true)
        // Another mount namespace: PeerIdentity refuses before any lookup.
        let namespaced = registry.identify(
            peer(nil, file: nil, problem: "pid 42 runs in another mount namespace than keychaind"))
        #expect(namespaced.failureMessage?.contains("another mount namespace") == true)
        // Unregistered: says how to register.
        let unknown = registry.identify(peer(other, file: FileIdentity.of(path: other)))
        #expect(unknown.failureMessage?.contains("is not registered") == true)
    }

    @Test func thisProcessIsIdentifiedFromItsOwnSocketPair() throws {
        var fds: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let socket = Socket(adopting: fds[0])
        defer {
            socket.close()
            close(fds[1])
        }
        let me = try PeerIdentity.of(socket: socket)
        #expect(me.pid == getpid() && me.uid == getuid() && me.problem == nil)
        #expect(me.executableFile == FileIdentity.of(path: "/proc/self/exe"))
        #expect(me.process?.isRunning == true)
    }
}

extension Result where Failure == KeychainIdentityError {
    var failureMessage: String? {
        if case .failure(let e) = self { return e.message }
        return nil
    }
}
