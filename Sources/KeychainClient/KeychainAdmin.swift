public import KeychainCore

/// What `keychainctl status` shows: the daemon's state as the `status` operation reports it.
public struct KeychainDaemonStatus: Sendable, Hashable {
    /// The daemon's version string.
    public var version: String
    /// Whether the keychain is locked now.
    public var locked: Bool
    /// Whether a keychain passphrase has been set.
    public var passphraseSet: Bool
    /// How many items the database holds (0 when the daemon does not report it).
    public var items: Int
    /// Seconds since the daemon started.
    public var uptime: Double
    /// How many clients are connected now.
    public var connections: Int
    /// Accessibility class (`ak`, `ck`, …) → whether its items can be read right now.
    public var classes: [String: Bool]
    /// The application-identifier the daemon gave the caller.
    public var caller: String
    /// Whether the caller may make administrator calls.
    public var admin: Bool
    /// The caller's access groups in order (the first is the default for adds); empty if not reported.
    public var groups: [String]
    /// The whole result map, including keys this client does not know yet.
    public var raw: [String: Value]

    /// Decodes a `status` result map; missing keys read as empty or zero; throws `.decode` if it is not a map.
    public init(_ value: Value) throws(KeychainError) {
        guard case .map(let m) = value else { throw KeychainError(.decode, "status result is not a map") }
        raw = m
        version = m["version"]?.text ?? ""
        locked = m["locked"]?.bool ?? false
        passphraseSet = m["passphraseSet"]?.bool ?? false
        items = m["items"]?.int.map { Int($0) } ?? 0
        switch m["uptime"] {
        case .float(let d)?: uptime = d
        case .int(let i)?: uptime = Double(i)
        default: uptime = 0
        }
        connections = m["connections"]?.int.map { Int($0) } ?? 0
        var classes: [String: Bool] = [:]
        for (k, v) in m["classes"]?.map ?? [:] { classes[k] = v.bool ?? false }
        self.classes = classes
        caller = m["caller"]?.text ?? ""
        admin = m["admin"]?.bool ?? false
        groups = (m["groups"]?.array ?? []).compactMap(\.text)
    }
}

/// The administrator's calls (`keychainctl status | lock | unlock | passwd | backup | restore`).
///
/// Passphrases are byte arrays so callers can wipe them after use; they are never logged or printed.
/// Everything but `status` needs an admin caller (`errSecMissingEntitlement` otherwise).
public struct KeychainAdmin: Sendable {
    /// The connection the calls go through.
    public let connection: KeychainConnection

    /// Administrator calls over `connection` (the shared one by default); sends nothing until a call.
    public init(connection: KeychainConnection = .shared) {
        self.connection = connection
    }

    /// The daemon's state; any caller may ask; throws when the daemon cannot be reached.
    public func status() throws(KeychainError) -> KeychainDaemonStatus {
        guard let v = try connection.call(.status) else { throw KeychainError(.decode, "status returned no result") }
        return try KeychainDaemonStatus(v)
    }

    /// Locks the keychain: items become unreadable until `unlock`; needs an admin caller.
    public func lock() throws(KeychainError) {
        _ = try connection.call(.lock)
    }

    /// Unlocks the keychain with its passphrase; never logs the bytes.
    public func unlock(passphrase: [UInt8]) throws(KeychainError) {
        _ = try connection.call(.unlock, arguments: ["passphrase": .bytes(passphrase)])
    }

    /// Sets (old = nil, when none is set yet) or changes the passphrase. Setting the first one
    /// approves exactly the registration files of the user's apps.d in `approving`, each with what
    /// the admin was shown of it (`previewApproval`), and nothing else; the daemon refuses the whole
    /// change (errSecParam) when one of them now says anything else. Returns the identifiers approved.
    @discardableResult
    public func changePassphrase(
        old: [UInt8]?, new: [UInt8], approving: [(file: String, expect: Value)] = []
    ) throws(KeychainError) -> [String] {
        var args: [String: Value] = ["new": .bytes(new)]
        if let old { args["old"] = .bytes(old) }
        if !approving.isEmpty {
            args["approve"] = .array(approving.map { .map(["file": .text($0.file), "expect": $0.expect]) })
        }
        let result = try connection.call(.passwd, arguments: args)
        return (result?.map?["approved"]?.array ?? []).compactMap(\.text)
    }

    /// The keychain passphrase an admin sends to prove the user's presence (while one is set).
    private func presence(_ args: [String: Value], _ keychainPassphrase: [UInt8]?) -> [String: Value] {
        var a = args
        if let keychainPassphrase { a["keychainPassphrase"] = .bytes(keychainPassphrase) }
        return a
    }

    /// The content of a backup file, encrypted under `passphrase`; the caller writes the file.
    /// `keychainPassphrase`: the keychain's own passphrase, needed while one is set.
    public func backup(passphrase: [UInt8], keychainPassphrase: [UInt8]? = nil) throws(KeychainError) -> [UInt8] {
        guard
            let bytes = try connection.call(
                .backup, arguments: presence(["passphrase": .bytes(passphrase)], keychainPassphrase))?.plainBytes
        else {
            throw KeychainError(.decode, "backup returned no bytes")
        }
        return bytes
    }

    /// Restores a backup's items; returns how many were restored and how many skipped.
    public func restore(passphrase: [UInt8], data: [UInt8], keychainPassphrase: [UInt8]? = nil) throws(KeychainError)
        -> (restored: Int, skipped: Int)
    {
        let result = try connection.call(
            .restore, arguments: presence(["passphrase": .bytes(passphrase), "data": .bytes(data)], keychainPassphrase))
        let m = result?.map ?? [:]
        return (Int(m["restored"]?.int ?? 0), Int(m["skipped"]?.int ?? 0))
    }

    /// Approves the registration file `file` (a name in the daemon's user apps.d); returns its
    /// application-identifier. `expect`: the registration as the caller saw it (`previewApproval`,
    /// or what it wrote); the daemon refuses (errSecParam) when the file now says anything else, so
    /// a process that rewrites the file in between gets nothing approved.
    public func approve(file: String, expect: Value? = nil, keychainPassphrase: [UInt8]?) throws(KeychainError)
        -> String
    {
        var args: [String: Value] = ["file": .text(file)]
        if let expect { args["expect"] = expect }
        let result = try connection.call(.approve, arguments: presence(args, keychainPassphrase))
        return result?.map?["approved"]?.text ?? ""
    }

    /// What approving `file` would approve, as the daemon reads the file now (a map of its
    /// application-identifier, keychain-access-groups, executables and admin), approving nothing and
    /// needing no passphrase. Pass it to `approve(file:expect:keychainPassphrase:)`.
    public func previewApproval(file: String) throws(KeychainError) -> Value {
        let result = try connection.call(.approve, arguments: ["file": .text(file), "preview": .bool(true)])
        guard let registration = result?.map?["registration"], registration.map != nil else {
            throw KeychainError(.decode, "approve preview returned no registration")
        }
        return registration
    }

    /// Revokes the approval of `applicationIdentifier`.
    public func revoke(applicationIdentifier: String, keychainPassphrase: [UInt8]?) throws(KeychainError) {
        _ = try connection.call(
            .revoke, arguments: presence(["application-identifier": .text(applicationIdentifier)], keychainPassphrase))
    }

    // async variants: same calls, the task suspends instead of blocking a thread.

    /// The daemon's state, suspending instead of blocking a thread.
    public func status() async throws(KeychainError) -> KeychainDaemonStatus {
        guard let v = try await connection.call(.status) else {
            throw KeychainError(.decode, "status returned no result")
        }
        return try KeychainDaemonStatus(v)
    }

    /// Locks the keychain, suspending instead of blocking a thread; needs an admin caller.
    public func lock() async throws(KeychainError) {
        _ = try await connection.call(.lock)
    }

    /// Unlocks the keychain with its passphrase, suspending instead of blocking; never logs the bytes.
    public func unlock(passphrase: [UInt8]) async throws(KeychainError) {
        _ = try await connection.call(.unlock, arguments: ["passphrase": .bytes(passphrase)])
    }
}
