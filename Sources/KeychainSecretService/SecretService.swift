import CSystemd
import Foundation
import KeychainCore
import KeychainCrypto
public import KeychainItems
import KeychainPrompt
public import KeychainRequests
import KeychainSystem
import Synchronization

/// Why the Secret Service cannot start (keychaind then refuses to start, saying so).
public struct SecretServiceError: Error, CustomStringConvertible {
    /// One line saying what prevented the start, such as another provider holding the bus name.
    public let description: String
}

/// The freedesktop Secret Service (`org.freedesktop.secrets`, spec 0.2) served by keychaind itself,
/// on a thread of its own beside the socket listener: there is no bridge process to trust. Every
/// method call is tied to the calling process through the bus (its pid, pinned with a pidfd at
/// first use), identified with the daemon's own registry, and decided by `AccessPolicy`; a caller
/// sees only its own access groups, each shown as one collection (docs/secret-service.md).
///
/// All bus state lives on the bus thread; other threads only set `stopping` and wake it.
public final class SecretService: @unchecked Sendable {
    /// The well-known bus name the service owns on the session bus.
    public static let busName = "org.freedesktop.secrets"
    /// The bus itself: the destination of its methods, the sender of its replies and signals.
    static let busDriver = "org.freedesktop.DBus"
    static let root = "/org/freedesktop/secrets"

    let core: RequestCore
    /// How a passphrase prompt asks a person and unlocks with the answer (the daemon's, wired by
    /// keychaind's main).
    let passphrasePrompts: PassphrasePrompts
    let items: ItemService
    let mode: AccessPolicy.UnregisteredBusCallers
    /// Whether a registered app's searches also list other groups' items for a per-item
    /// confirmation (SecretService+Foreign.swift).
    let foreignItems: AccessPolicy.ForeignBusItems
    let bus: BusConnection
    /// The largest secret accepted (what a socket client could still read back in one frame).
    let maxSecretBytes: Int
    /// The most secret bytes one GetSecrets answers with (a socket client's frame limit): a caller
    /// that asks for much and reads nothing fills the bus's buffers, which stalls every caller.
    let maxReplyBytes: Int
    let wake: WakePipe
    /// The one executable that may call the Secret portal's backend (`portalFrontendPath`).
    let portalFrontend: String
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    private var running = false

    // Bus-thread state.
    var callers: [String: BusCaller] = [:]
    var sessions: [String: TransferSession] = [:]
    var prompts: [String: PendingPrompt] = [:]
    /// The prompt whose pinentry is showing (one at a time), and what pinentry threads answered.
    var asking: String?
    let answers = Mutex<[(path: String, outcome: PromptOutcome)]>([])
    var nextObject: UInt64 = 1
    var waitingLogged = false

    static let maxCallers = 16384
    static let maxSessionsPerCaller = 32
    static let maxPromptsPerCaller = 32
    /// For all callers together: each DH session's key is guarded memory (a few mappings apiece),
    /// and 700 connections × 32 sessions ran keychaind out of mappings (an attack review's finding).
    static let maxSessions = 1024
    /// For all callers together: a pending prompt keeps the paths it was asked for.
    static let maxPrompts = 128
    /// Paths in one GetSecrets, Unlock or Lock: each costs a lookup on the bus thread, and a
    /// prompt keeps them (800 000 made-up paths held the thread for 17 s; an attack review's finding).
    static let maxObjectsPerCall = 4096

    /// Connects to the session bus and takes `org.freedesktop.secrets`, serving over `core` and asking
    /// for the passphrase through `prompts`: what
    /// unregistered callers get is `unregistered`, and no secret in or out is larger than a socket
    /// client could read back (`maxFrameBytes`). When another provider holds the name: with
    /// `replace`, takes it over if that provider allows it; otherwise fails naming it.
    public init(
        core: RequestCore, prompts: PassphrasePrompts, unregistered: AccessPolicy.UnregisteredBusCallers,
        foreignItems: AccessPolicy.ForeignBusItems = .refuse, maxFrameBytes: Int, replace: Bool,
        portalFrontend: String = SecretService.portalFrontendPath
    ) throws(SecretServiceError) {
        self.core = core
        self.portalFrontend = portalFrontend
        passphrasePrompts = prompts
        items = core.items
        mode = unregistered
        self.foreignItems = foreignItems
        maxSecretBytes = max(1024, maxFrameBytes - 4096)
        maxReplyBytes = maxFrameBytes
        do throws(Errno) { wake = try WakePipe() } catch {
            throw SecretServiceError(description: "cannot create a pipe: \(error.message)")
        }
        do throws(BusError) {
            bus = try BusConnection()
        } catch {
            throw SecretServiceError(description: error.message)
        }
        if var errno = bus.requestName(Self.busName, replace: replace) {
            // --replace, and the holder does not let the name go (GNOME Keyring keeps it): stop it.
            if replace && errno == SystemLayer.alreadyExists && stopHolder() {
                errno = bus.requestName(Self.busName, replace: true) ?? 0
            }
            if errno != 0 {
                throw SecretServiceError(description: nameTaken(errno: errno, replace: replace))
            }
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        do throws(BusError) {
            try bus.addFallback(
                Self.root,
                handler: { m, userdata, _ in
                    guard let m, let userdata else { return 0 }
                    return Unmanaged<SecretService>.fromOpaque(userdata).takeUnretainedValue().handle(
                        BusMessage(retaining: m))
                }, userdata: me)
            try bus.addFallback(
                Self.portalPath,
                handler: { m, userdata, _ in
                    guard let m, let userdata else { return 0 }
                    return Unmanaged<SecretService>.fromOpaque(userdata).takeUnretainedValue().handlePortal(
                        BusMessage(retaining: m))
                }, userdata: me)
            try bus.addMatch(
                "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged'",
                handler: { m, userdata, _ in
                    guard let m, let userdata else { return 0 }
                    Unmanaged<SecretService>.fromOpaque(userdata).takeUnretainedValue().nameOwnerChanged(
                        BusMessage(retaining: m))
                    return 0
                }, userdata: me)
        } catch {
            throw SecretServiceError(description: error.message)
        }
        Log.info(
            "secret service: serving on the session bus",
            [
                ("name", Self.busName), ("unique", bus.uniqueName),
                ("unregistered", mode.rawValue), ("foreignItems", foreignItems.rawValue),
            ])
        core.setStatus(of: "secretService", statusFields, note: Self.isolationNote(mode))
    }

    /// The pid that owns `org.freedesktop.secrets` now, from the bus.
    private func holder() -> Int32? {
        guard
            let call = try? bus.newCall(
                destination: Self.busDriver, path: "/org/freedesktop/DBus",
                interface: "org.freedesktop.DBus", member: "GetConnectionUnixProcessID"),
            (try? call.append(string: Self.busName)) != nil,
            let reply = try? bus.call(call), let pid = try? reply.readUInt32()
        else { return nil }
        return Int32(bitPattern: pid)
    }

    /// `--replace` when the holder does not allow replacement: pins the holder with a pidfd, checks
    /// that it is still the holder and runs as this user, sends it SIGTERM through the pidfd, and
    /// waits (up to 15 s) for the name to be free. Returns whether it is.
    private func stopHolder() -> Bool {
        guard let pid = holder(), SystemLayer.uid(of: pid) == SystemLayer.uid else { return false }
        guard let process = try? ProcessHandle.open(pid: pid) else { return false }
        guard holder() == pid, process.terminate() else { return false }
        Log.write(
            .notice, "secret service: --replace: asked the provider holding the name to stop",
            [("pid", String(pid)), ("executable", SystemLayer.executable(of: pid) ?? "?")])
        for _ in 0..<150 {
            if holder() == nil { return true }
            SystemLayer.sleep(milliseconds: 100)
        }
        return false
    }

    /// The message for a name someone else holds: who holds it, and what to do.
    private func nameTaken(errno: Int32, replace: Bool) -> String {
        guard errno == SystemLayer.alreadyExists else {
            return "cannot take the bus name \(Self.busName): \(SystemLayer.describe(errno: errno))"
        }
        var holder = "another process"
        if let pid = self.holder() {
            holder = "pid \(pid)" + (SystemLayer.executable(of: pid).map { " (\($0))" } ?? "")
        }
        if replace {
            return
                "another Secret Service provider holds \(Self.busName) and did not stop when asked (SIGTERM): \(holder). Stop it (for GNOME Keyring: systemctl --user stop gnome-keyring-daemon.service gnome-keyring-daemon.socket), then start keychaind again"
        }
        return
            "another Secret Service provider holds \(Self.busName): \(holder). Stop it first (for GNOME Keyring: systemctl --user stop gnome-keyring-daemon.service gnome-keyring-daemon.socket), or start keychaind with --replace to take the name over"
    }

    static func isolationNote(_ mode: AccessPolicy.UnregisteredBusCallers) -> String {
        switch mode {
        case .shared:
            return
                "Secret Service: processes that are not registered apps share one collection on the session bus (access group \(AccessPolicy.secretServiceSharedGroup)), as with every other desktop keyring; set \"secretServiceUnregistered\": \"refuse\" in keychaind.json to turn them away"
        case .refuse:
            return "Secret Service: only registered apps are served on the session bus; other processes are refused"
        }
    }

    private var statusFields: [String: Value] {
        [
            "busName": .text(Self.busName), "unregistered": .text(mode.rawValue),
            "foreignItems": .text(foreignItems.rawValue),
            "sharedGroup": mode == .shared ? .text(AccessPolicy.secretServiceSharedGroup) : .null,
        ]
    }

    // MARK: Thread

    /// Serves on a thread of its own until `stop`.
    public func start() {
        running = true
        let thread = Thread { [self] in
            self.loop()
            self.finished.signal()
        }
        thread.stackSize = 1 << 20
        thread.name = "secret-service"
        thread.start()
    }

    /// Stops serving (any thread): the call in progress finishes first. Safe to call twice.
    public func stop() {
        guard running, !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wake.wake()
        finished.wait()
    }

    private func loop() {
        while !stopping.load(ordering: .acquiring) {
            var r = bus.process()
            while r > 0 && !stopping.load(ordering: .relaxed) { r = bus.process() }
            if r < 0 {
                Log.error(
                    "secret service: the session bus connection was lost; no longer serving it", [("errno", String(-r))]
                )
                core.setStatus(of: "secretService", nil, note: "")
                return
            }
            takeAnswers()
            checkPrompts()
            var timeout = bus.timeoutMilliseconds
            if prompts.values.contains(where: { $0.waiting }) { timeout = timeout < 0 ? 250 : min(timeout, 250) }
            if Poll.wait(bus.fd, events: Int16(truncatingIfNeeded: bus.events), or: wake, timeoutMilliseconds: timeout)
            {
                wake.drain()
            }
        }
        bus.flush()
        core.setStatus(of: "secretService", nil, note: "")
        Log.info("secret service: stopped")
    }

    // MARK: Dispatch

    /// Every method call to our paths: identify the caller, serve, reply (an error reply for any
    /// failure). Returns 1 (handled), or 0 for what is not a method call.
    func handle(_ m: BusMessage) -> Int32 {
        guard m.isMethodCall else { return 0 }
        do throws(BusError) {
            // Any call may carry a secret (CreateItem, SetSecret; in a plain session in the clear), and
            // its reply too: sd-bus wipes both when it frees them.
            try m.markSensitive()
            if let reply = try serve(m) { bus.send(reply) }
        } catch {
            bus.replyError(to: m, error)
        }
        return 1
    }

    // MARK: Connections that leave

    /// The bus's NameOwnerChanged: a connection that left loses what it held. The match rule's
    /// sender does not filter here: dbus-daemon honours it for broadcasts, but a connection can send
    /// the signal to keychaind directly, and sd-bus cannot compare a well-known sender name with a
    /// message's unique one. The bus sends as `org.freedesktop.DBus`, which no connection can be.
    func nameOwnerChanged(_ m: BusMessage) {
        guard m.sender == Self.busDriver else {
            Log.debug("secret service: a NameOwnerChanged not sent by the bus ignored", [("sender", m.sender ?? "-")])
            return
        }
        guard (try? m.expect("sss")) != nil, let name = try? m.readString(), name.hasPrefix(":"),
            (try? m.readString()) != nil, let newOwner = try? m.readString(), newOwner.isEmpty
        else { return }
        // A unique name is never reused: everything tied to it goes.
        let known = callers.removeValue(forKey: name) != nil
        let (sessionsBefore, promptsBefore) = (sessions.count, prompts.count)
        sessions = sessions.filter { $0.value.owner != name }
        prompts = prompts.filter { $0.value.owner != name }
        if known || sessions.count != sessionsBefore || prompts.count != promptsBefore {
            Log.debug(
                "secret service: a caller left the bus",
                [
                    ("name", name), ("sessions", String(sessionsBefore - sessions.count)),
                    ("prompts", String(promptsBefore - prompts.count)),
                ])
        }
    }
}

/// A transfer session (`OpenSession`): owned by one connection; a DH session holds its AES key.
final class TransferSession {
    let owner: String
    let key: SecureBytes?

    init(owner: String, key: SecureBytes?) {
        self.owner = owner
        self.key = key
    }

    /// (parameters, value) for a secret sent to the client.
    func seal(_ secret: [UInt8]) throws(BusError) -> (parameters: [UInt8], value: [UInt8]) {
        guard let key else { return ([], secret) }
        do {
            let (iv, ciphertext) = try TransferCrypto.encrypt(secret, key: key)
            return (iv, ciphertext)
        } catch { throw SecretService.busError(error) }
    }

    /// The secret a client sent.
    func open(parameters: [UInt8], value: [UInt8]) throws(BusError) -> [UInt8] {
        guard let key else {
            guard parameters.isEmpty else { throw .invalidArgs("a plain session's secrets carry no parameters") }
            return value
        }
        do { return try TransferCrypto.decrypt(iv: parameters, ciphertext: value, key: key) } catch {
            throw SecretService.busError(error)
        }
    }
}

/// A prompt (`Unlock` of a locked keychain): `Prompt` shows a passphrase dialog through pinentry
/// (SecretService+Prompt.swift); it completes when the keychain is unlocked, by that dialog or from
/// elsewhere (`keychainctl unlock`), and is dismissed by its owner, a cancel, or wrong passphrases.
struct PendingPrompt {
    let owner: String
    /// The objects to report unlocked on completion.
    var objects: [String]
    /// What the dialog says: who asks, and for what.
    var request: PromptRequest
    /// `Prompt` was called: waiting for the unlock.
    var waiting = false
    /// Its dialog was shown, or could not be (then it waits for an unlock from elsewhere).
    var asked = false
    /// A Secret portal call waiting for the unlock (its prompt is keyed by the request handle and
    /// answers that call instead of emitting `Completed`).
    var portal: PortalWait?
    /// Items of other groups the person is asked about (`secretServiceForeignItems` "confirm"):
    /// once the keychain is unlocked, a yes/no dialog; a yes grants them to the owner's connection
    /// and the prompt completes with `objects` and these.
    var foreign: [String] = []
    /// The passphrase part is done (or was not needed): the yes/no dialog is next.
    var confirming = false
    /// What the yes/no dialog named: each foreign path's group, the lock count it was shown at, and
    /// the app it named.
    var named: [String: String] = [:]
    var locksWhenAsked = 0
    var askedFor = ""
}
