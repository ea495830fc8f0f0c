/// What `keychainctl status` shows: the daemon's state as the `status` operation reports it.
public struct KeychainDaemonStatus: Sendable, Hashable {
    public var version: String
    public var locked: Bool
    public var passphraseSet: Bool
    public var items: Int
    public var uptime: Double
    public var connections: Int
    /// Accessibility class (`ak`, `ck`, …) → whether its items can be read right now.
    public var classes: [String: Bool]
    /// The application-identifier the daemon gave the caller.
    public var caller: String
    public var admin: Bool
    /// The caller's access groups in order (the first is the default for adds); empty if not reported.
    public var groups: [String]
    /// The whole result map, including keys this client does not know yet.
    public var raw: [String: Value]

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
    public let connection: KeychainConnection

    public init(connection: KeychainConnection = .shared) {
        self.connection = connection
    }

    public func status() throws(KeychainError) -> KeychainDaemonStatus {
        guard let v = try connection.call(.status) else { throw KeychainError(.decode, "status returned no result") }
        return try KeychainDaemonStatus(v)
    }

    public func lock() throws(KeychainError) {
        _ = try connection.call(.lock)
    }

    public func unlock(passphrase: [UInt8]) throws(KeychainError) {
        _ = try connection.call(.unlock, arguments: ["passphrase": .bytes(passphrase)])
    }

    /// Sets (old = nil, when none is set yet) or changes the passphrase.
    public func changePassphrase(old: [UInt8]?, new: [UInt8]) throws(KeychainError) {
        var args: [String: Value] = ["new": .bytes(new)]
        if let old { args["old"] = .bytes(old) }
        _ = try connection.call(.passwd, arguments: args)
    }

    /// The content of a backup file, encrypted under `passphrase`; the caller writes the file.
    public func backup(passphrase: [UInt8]) throws(KeychainError) -> [UInt8] {
        guard let bytes = try connection.call(.backup, arguments: ["passphrase": .bytes(passphrase)])?.bytes else {
            throw KeychainError(.decode, "backup returned no bytes")
        }
        return bytes
    }

    /// Restores a backup's items; returns how many were restored and how many skipped.
    public func restore(passphrase: [UInt8], data: [UInt8]) throws(KeychainError) -> (restored: Int, skipped: Int) {
        let result = try connection.call(.restore, arguments: ["passphrase": .bytes(passphrase), "data": .bytes(data)])
        let m = result?.map ?? [:]
        return (Int(m["restored"]?.int ?? 0), Int(m["skipped"]?.int ?? 0))
    }

    // async variants: same calls, the task suspends instead of blocking a thread.

    public func status() async throws(KeychainError) -> KeychainDaemonStatus {
        guard let v = try await connection.call(.status) else { throw KeychainError(.decode, "status returned no result") }
        return try KeychainDaemonStatus(v)
    }

    public func lock() async throws(KeychainError) {
        _ = try await connection.call(.lock)
    }

    public func unlock(passphrase: [UInt8]) async throws(KeychainError) {
        _ = try await connection.call(.unlock, arguments: ["passphrase": .bytes(passphrase)])
    }
}
