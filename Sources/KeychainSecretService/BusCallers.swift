import KeychainCore
import KeychainItems
import KeychainRequests
import KeychainSystem

/// One connection on the bus (a unique name such as `:1.42`) as the daemon knows it: the process
/// that opened it, pinned by a pidfd at the first call, and what `AccessPolicy` decided for it
/// under a given registry generation.
final class BusCaller {
    let name: String
    let identity: PeerIdentity
    var generation: Int
    var decision: Result<Caller, KeychainError> {
        didSet { collections = Self.collections(of: decision) }
    }
    /// A registered app (its successful item calls count as activity for auto-lock).
    var registered: Bool
    /// The attributes of its last SearchItems, as a prompt shows them (what it asked for).
    var lastSearch: String?
    /// Other groups' items its searches listed, by path (`secretServiceForeignItems` "confirm";
    /// SecretService+Foreign.swift): only these foreign paths resolve for it, and a grant is here.
    var foreign: [String: ForeignItem] = [:]
    /// The caller's collections: one per access group, the first named `login` (the `default`
    /// alias), the others after their group.
    private(set) var collections: [Collection]

    init(
        name: String, identity: PeerIdentity, generation: Int, decision: Result<Caller, KeychainError>, registered: Bool
    ) {
        self.name = name
        self.identity = identity
        self.generation = generation
        self.decision = decision
        self.registered = registered
        collections = Self.collections(of: decision)
    }

    private static func collections(of decision: Result<Caller, KeychainError>) -> [Collection] {
        guard case .success(let caller) = decision else { return [] }
        return caller.accessGroups.enumerated().map {
            Collection(group: $0.element, element: Collection.element(for: $0.element, first: $0.offset == 0))
        }
    }
}

/// A collection as one caller sees it: an access group and its path element.
struct Collection: Equatable {
    let group: String
    let element: String

    var path: String { SecretService.root + "/collection/" + element }

    func itemPath(_ id: [UInt8]) -> String { path + "/" + ItemService.hex(id) }

    /// A path element for a group: letters and digits as they are, every other byte `_xx`; `login`
    /// for the caller's first group (and an escaped first letter for a later group named `login`).
    static func element(for group: String, first: Bool) -> String {
        if first { return "login" }
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for b in group.utf8 {
            if (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) {
                out.append(b)
            } else {
                out += [0x5F, hex[Int(b >> 4)], hex[Int(b & 15)]]
            }
        }
        if out == Array("login".utf8) { out = Array("_6cogin".utf8) }
        return String(decoding: out, as: UTF8.self)
    }
}

extension SecretService {
    /// Who sent `m`, decided: from the cache while the connection's process still runs and the
    /// registry is unchanged, else identified afresh. Refusals are AccessDenied with the reason.
    func identify(_ m: BusMessage) throws(BusError) -> (BusCaller, Caller) {
        guard let sender = m.sender, sender.hasPrefix(":") else { throw .accessDenied("the call has no sender") }
        let known = try connection(sender)
        switch known.decision {
        case .success(let caller): return (known, caller)
        case .failure(let error): throw .accessDenied(error.message)
        }
    }

    /// The connection `sender` (a unique name), pinned and identified: from the cache while its
    /// process still runs, else afresh; its decision brought up to the registry's generation.
    func connection(_ sender: String) throws(BusError) -> BusCaller {
        let generation = core.registryGeneration
        let known: BusCaller
        if let cached = callers[sender] {
            known = cached
        } else {
            guard callers.count < Self.maxCallers else {
                throw .limitsExceeded(
                    "too many connections use the Secret Service (\(Self.maxCallers)); try again later")
            }
            known = try identifyConnection(sender)
            callers[sender] = known
        }
        // D-Bus messages carry no sender credentials: the connection's own process must still run,
        // so a process that inherited the connection cannot go on after it (docs/security.md).
        guard known.identity.process?.isRunning == true else {
            throw .accessDenied(
                "the process that opened this bus connection (pid \(known.identity.pid)) has exited; a process that inherited the connection cannot use it — connect again"
            )
        }
        if known.generation != generation {
            let (decision, registered) = decide(known.identity, generation: generation)
            known.decision = decision
            known.registered = registered
            known.generation = generation
            // Who it is may have changed: a grant holds only for the app it was given to
            // (SecretService.grantedGroup), and a caller that is no registered app names nothing.
            if !registered { known.foreign.removeAll() }
        }
        return known
    }

    /// Pins the process behind a new unique name and identifies it: its credentials from the bus
    /// (`GetConnectionCredentials`: uid, pid, and `ProcessFD` where the bus offers one), a pidfd
    /// (that fd, or `pidfd_open(pid)` at once), then the bus asked again — the name must still have
    /// an owner with that pid, so the pidfd is not a recycled pid's process of a connection already
    /// gone. Then the same identification as a socket peer (`PeerIdentity`, `AppRegistry.identify`).
    private func identifyConnection(_ sender: String) throws(BusError) -> BusCaller {
        let first: BusCredentials
        do throws(BusError) { first = try credentials(sender) } catch {
            throw .accessDenied("the bus has no credentials for \(BusPath.printable(sender)): \(error.message)")
        }
        if let refusal = AccessPolicy.admit(peerUID: first.uid, daemonUID: SystemLayer.uid) {
            throw .accessDenied(refusal.message)
        }
        let handle: ProcessHandle
        if let given = first.process {
            handle = given
        } else {
            do throws(Errno) { handle = try ProcessHandle.open(pid: first.pid) } catch {
                throw .accessDenied(
                    "the calling process (pid \(first.pid)) could not be pinned with a pidfd (\(error.message))")
            }
        }
        let again: BusCredentials
        do throws(BusError) { again = try credentials(sender) } catch {
            throw .accessDenied("the calling connection left the bus before it could be identified")
        }
        guard again.pid == first.pid, again.uid == first.uid else {
            throw .accessDenied("the bus reported changing credentials for \(BusPath.printable(sender))")
        }
        let identity = PeerIdentity.of(pid: first.pid, uid: first.uid, handle: handle)
        let generation = core.registryGeneration
        let (decision, registered) = decide(identity, generation: generation)
        switch decision {
        case .success(let c):
            Log.info(
                "secret service: caller identified",
                [
                    ("pid", String(identity.pid)),
                    ("app", registered ? c.applicationIdentifier : "(unregistered, shared collection)"),
                ])
        case .failure:
            Log.info("secret service: caller refused", [("pid", String(identity.pid))])
        }
        return BusCaller(
            name: sender, identity: identity, generation: generation, decision: decision, registered: registered)
    }

    /// The registry's answer for a pinned peer, then the access policy's for the bus.
    private func decide(_ identity: PeerIdentity, generation: Int) -> (Result<Caller, KeychainError>, registered: Bool)
    {
        let (result, _) = core.identify(identity)
        switch result {
        case .success(let app) where app.onBus:
            return (
                AccessPolicy.secretServiceCaller(
                    app: RequestCore.caller(for: app), unidentified: "", unregistered: mode), true
            )
        case .success(let app):
            // A registered app that did not ask for the bus in a root-owned registration, while a
            // passphrase is set: on the bus it is a process like any other (AppEntry.onBus).
            let why =
                "\(app.applicationIdentifier) is not identified on the session bus while a passphrase is set: only a root-owned registration with \"secretService\": true makes it so (docs/secret-service.md)"
            return (AccessPolicy.secretServiceCaller(app: nil, unidentified: why, unregistered: mode), false)
        case .failure(let why):
            return (AccessPolicy.secretServiceCaller(app: nil, unidentified: why.message, unregistered: mode), false)
        }
    }

    struct BusCredentials {
        var uid: UInt32
        var pid: Int32
        /// A pidfd the bus handed over (`ProcessFD`), duplicated for us; nil when it has none.
        var process: ProcessHandle?
    }

    /// `org.freedesktop.DBus.GetConnectionCredentials(name)`.
    private func credentials(_ name: String) throws(BusError) -> BusCredentials {
        let call = try bus.newCall(
            destination: SecretService.busDriver, path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus", member: "GetConnectionCredentials")
        try call.append(string: name)
        let reply = try bus.call(call)
        try reply.expect("a{sv}")
        var uid: UInt32?
        var pid: UInt32?
        var process: ProcessHandle?
        _ = try reply.enter("a", "{sv}")
        while try reply.enter("e", "sv") {
            let key = try reply.readString()
            guard let (_, contents) = try reply.peek() else { throw .failed("malformed credentials") }
            switch (key, contents) {
            case ("UnixUserID", "u"?):
                _ = try reply.enter("v", "u")
                uid = try reply.readUInt32()
                try reply.exit()
            case ("ProcessID", "u"?):
                _ = try reply.enter("v", "u")
                pid = try reply.readUInt32()
                try reply.exit()
            case ("ProcessFD", "h"?):
                _ = try reply.enter("v", "h")
                let fd = try reply.readFD()
                try reply.exit()
                if process == nil { process = try? ProcessHandle.duplicating(fd) }
            default:
                try reply.skip("v")
            }
            try reply.exit()
        }
        try reply.exit()
        guard let uid, let pid, pid > 0 else {
            throw .failed("the bus gave no uid and pid")
        }
        return BusCredentials(uid: uid, pid: Int32(bitPattern: pid), process: process)
    }
}
