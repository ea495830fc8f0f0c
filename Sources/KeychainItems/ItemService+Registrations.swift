public import KeychainCore
public import KeychainCrypto
import KeychainStore
import KeychainSystem

/// An app registration approved with the keychain passphrase. Once a passphrase is set, a
/// registration in the user's own `apps.d` counts only if it is on the approved list: a process of
/// the same user can write that directory, read `device.key` and the database and restart the daemon,
/// so only what needs the passphrase to produce can be trusted.
///
/// Equality and hashing compare every string byte for byte (UTF-8), never by Unicode equivalence: a
/// group or path spelled with other code points is another group or path.
public struct ApprovedRegistration: Sendable, Hashable, CustomStringConvertible {
    /// The identity the registration gives its executables.
    public var applicationIdentifier: String
    /// The access groups it grants, in order (the first is the default for adds).
    public var accessGroups: [String]
    /// The executables' paths it covers.
    public var executables: [String]
    /// Whether it grants administrator calls.
    public var admin: Bool

    /// A registration with these fields; `admin` is off unless given.
    public init(applicationIdentifier: String, accessGroups: [String], executables: [String], admin: Bool = false) {
        self.applicationIdentifier = applicationIdentifier
        self.accessGroups = accessGroups
        self.executables = executables
        self.admin = admin
    }

    /// Equal when every field matches byte for byte (UTF-8), never by Unicode equivalence.
    public static func == (a: ApprovedRegistration, b: ApprovedRegistration) -> Bool {
        a.admin == b.admin && same(a.applicationIdentifier, b.applicationIdentifier)
            && same(a.accessGroups, b.accessGroups) && same(a.executables, b.executables)
    }

    /// Hashes every field's UTF-8 bytes, consistent with the byte-for-byte `==`.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(admin)
        Self.hash(applicationIdentifier, into: &hasher)
        for list in [accessGroups, executables] {
            hasher.combine(list.count)
            for s in list { Self.hash(s, into: &hasher) }
        }
    }

    /// Counts only: identifiers and paths are not secrets, but descriptions end up in logs.
    public var description: String {
        "ApprovedRegistration(\(accessGroups.count) groups, \(executables.count) executables\(admin ? ", admin" : ""))"
    }

    private static func same(_ a: String, _ b: String) -> Bool { a.utf8.elementsEqual(b.utf8) }

    private static func same(_ a: [String], _ b: [String]) -> Bool {
        a.count == b.count && zip(a, b).allSatisfy { same($0, $1) }
    }

    private static func hash(_ s: String, into hasher: inout Hasher) {
        hasher.combine(s.utf8.count)
        for byte in s.utf8 { hasher.combine(byte) }
    }

    // MARK: Stored form

    static let formatVersion: Int64 = 1

    /// `{"v": 1, "apps": [{"id": text, "groups": [text], "exe": [text], "admin": bool}, …]}` (CBOR;
    /// sealed under the registry key before it is stored).
    static func encode(_ list: [ApprovedRegistration]) -> [UInt8] {
        CBOR.encode(
            .map([
                "v": .int(formatVersion),
                "apps": .array(
                    list.map { r in
                        .map([
                            "id": .text(r.applicationIdentifier), "groups": .array(r.accessGroups.map(Value.text)),
                            "exe": .array(r.executables.map(Value.text)), "admin": .bool(r.admin),
                        ])
                    }),
            ]))
    }

    static func decode(_ bytes: [UInt8]) throws(KeychainError) -> [ApprovedRegistration] {
        let damaged = KeychainError(.decode, "the approved registrations in the database are damaged")
        guard let decoded = try? CBOR.decode(bytes), let map = decoded.map, map["v"]?.int == formatVersion,
            let apps = map["apps"]?.array
        else { throw damaged }
        var list: [ApprovedRegistration] = []
        list.reserveCapacity(apps.count)
        for app in apps {
            guard let m = app.map, let id = m["id"]?.text, let groups = m["groups"]?.array, let exes = m["exe"]?.array,
                let admin = m["admin"]?.bool
            else { throw damaged }
            let groupNames = groups.compactMap(\.text)
            let paths = exes.compactMap(\.text)
            guard groupNames.count == groups.count, paths.count == exes.count else { throw damaged }
            list.append(
                ApprovedRegistration(
                    applicationIdentifier: id, accessGroups: groupNames, executables: paths, admin: admin))
        }
        return list
    }
}

/// The approved registrations: a `meta` row sealed under the registry key, a key in the keyring
/// wrapped by the master key (Vault.swift). With a passphrase set, only the passphrase reaches it.
extension ItemService {
    static let registrationsMeta = "apps"

    /// The approved registrations. nil while they cannot be read: a passphrase is set and it has not
    /// been given since the keychain opened (by `unlock`, `changePassphrase` or
    /// `setApprovedRegistrations`; `lock` does not make them unreadable again). [] when none were
    /// approved. Without a passphrase: whatever was stored, or []. A stored list that does not open or
    /// decode (tampered with, damaged) is errSecDecode.
    public func approvedRegistrations() throws(KeychainError) -> [ApprovedRegistration]? {
        // Inside one read, so a concurrent change is seen whole: the new row with the new key or the
        // old row with the old key.
        try store.read { (r) throws(KeychainError) -> [ApprovedRegistration]? in
            let key: SecureBytes?
            switch vault.registryKey {
            case .unavailable: return nil
            case .absent: key = nil
            case .available(let k): key = k
            }
            guard let sealed = try r.meta(Self.registrationsMeta) else { return [] }
            let damaged = KeychainError(
                .decode,
                "the approved registrations in the database are damaged or were tampered with; approve the registrations again with the passphrase"
            )
            guard let key else { throw damaged }
            let plain: [UInt8]
            do { plain = try Vault.openRegistry(sealed, key: key) } catch { throw damaged }
            return try ApprovedRegistration.decode(plain)
        }
    }

    /// Replaces the approved list. `passphrase` must be the keychain passphrase when one is set
    /// (errSecAuthFailed when it is missing or wrong; a wrong one counts as a failed unlock and the
    /// wrong-passphrase delays apply, as for `unlock` and `changePassphrase`; a right one clears the
    /// count); it is ignored when none is set. Each call draws a fresh registry key, so an older list
    /// cannot be put back on its own. The list is readable afterwards, locked or not.
    public func setApprovedRegistrations(_ list: [ApprovedRegistration], passphrase: SecureBytes?) throws(KeychainError)
    {
        try protectionLock.withLock { (_) throws(KeychainError) in
            let protected = vault.hasPassphrase
            if protected {
                guard passphrase != nil else {
                    throw KeychainError(.authFailed, "a passphrase is set: registrations can only be approved with it")
                }
                try checkNoDelay()
            }
            let plain = ApprovedRegistration.encode(list)
            let pending: Vault.PendingRegistry
            do throws(KeychainError) {
                pending = try vault.prepareRegistryChange(passphrase: protected ? passphrase : nil)
            } catch  where error.status == .authFailed && protected {
                throw try recordFailure()
            }
            try store.writeAlone(
                { (w) throws(KeychainError) in
                    try w.setMeta("keyring", pending.keyring)
                    try w.setMeta(Self.registrationsMeta, Vault.sealRegistry(plain, key: pending.registryKey))
                    if protected { try w.deleteMeta(Self.failuresMeta) }
                }, committed: { vault.adopt(pending) })
            // As after a passphrase change: the previous keyring does not stay behind in the WAL.
            store.truncateLog()
        }
    }

    /// Checks the keychain passphrase (presence) without changing any state: errSecAuthFailed when it
    /// is missing or wrong. The wrong-passphrase delays and the failure count apply exactly as for
    /// `unlock` (a wrong one is counted, a right one clears the count). Succeeds when no passphrase
    /// is set, whatever is passed.
    public func verifyPresence(passphrase: SecureBytes?) throws(KeychainError) {
        try protectionLock.withLock { (_) throws(KeychainError) in
            guard vault.hasPassphrase else { return }
            guard let passphrase else {
                throw KeychainError(.authFailed, "a passphrase is set: this needs it")
            }
            try checkNoDelay()
            do throws(KeychainError) {
                try vault.verify(passphrase: passphrase)
            } catch  where error.status == .authFailed {
                throw try recordFailure()
            }
            try clearFailures()
        }
    }
}
