public import Foundation
internal import KeychainClient
internal import KeychainCore
import KeychainSystem

/// The error every Swift-native call throws: the `OSStatus` (as `status`, a `Status`) and the
/// daemon's one-line message. Its description never contains a secret or an attribute value.
public typealias KeychainServicesError = KeychainError

extension KeychainError {
    /// The status as Apple's `OSStatus`, to compare with `errSecItemNotFound` and friends.
    public var osStatus: OSStatus { status.rawValue }
}

/// A keychain bound to one service (and optionally one access group), with typed access to its
/// generic-password items, keyed by account — or bound to one server, with typed access to its
/// internet-password items (`kSecClassInternetPassword`), keyed by account.
///
/// ```swift
/// let keychain = Keychain(service: "com.example.app").accessibility(.afterFirstUnlock)
/// try keychain.set("s3cret", forKey: "alice")
/// let secret = try keychain.string(forKey: "alice")     // nil when absent
///
/// let site = Keychain(server: "https://example.com:8443/login", protocolType: .https)
/// try site.set("s3cret", forKey: "alice")   // srvr example.com, ptcl htps, port 8443, path /login
/// ```
///
/// A `Keychain` is an immutable value: `accessGroup(_:)`, `accessibility(_:)` and `label(_:)` return
/// a modified copy. Lookups, updates and removals use only the item's key attributes (service,
/// account, and the access group when one is set), so an item written with another accessibility
/// or label is still found — Apple's "not found, then duplicate" pitfall cannot happen. Accessibility
/// and label are applied when writing. Without an access group, `set` writes to the app's default
/// (first) group (and updates only there), while reads and removals cover all of the app's groups,
/// as SecItem does.
///
/// `set` adds, and on `errSecDuplicateItem` updates: no check-then-act race between processes.
public struct Keychain: Sendable, Equatable {
    /// Apple's accessibility classes, with their wire values.
    public enum Accessibility: String, Sendable, CaseIterable {
        case whenUnlocked = "ak"
        case afterFirstUnlock = "ck"
        case always = "dk"
        case whenPasscodeSetThisDeviceOnly = "akpu"
        case whenUnlockedThisDeviceOnly = "aku"
        case afterFirstUnlockThisDeviceOnly = "cku"
        case alwaysThisDeviceOnly = "dku"
    }

    /// Apple's `kSecAttrProtocol` values, with their wire values.
    public enum ProtocolType: String, Sendable, CaseIterable {
        case ftp = "ftp "
        case ftpAccount = "ftpa"
        case http = "http"
        case irc = "irc "
        case nntp = "nntp"
        case pop3 = "pop3"
        case smtp = "smtp"
        case socks = "sox "
        case imap = "imap"
        case ldap = "ldap"
        case appleTalk = "atlk"
        case afp = "afp "
        case telnet = "teln"
        case ssh = "ssh "
        case ftps = "ftps"
        case https = "htps"
        case httpProxy = "htpx"
        case httpsProxy = "htsx"
        case ftpProxy = "ftpx"
        case smb = "smb "
        case rtsp = "rtsp"
        case rtspProxy = "rtsx"
        case daap = "daap"
        case eppc = "eppc"
        case ipp = "ipp "
        case nntps = "ntps"
        case ldaps = "ldps"
        case telnetS = "tels"
        case imaps = "imps"
        case ircs = "ircs"
        case pop3S = "pops"
    }

    /// Apple's `kSecAttrAuthenticationType` values, with their wire values.
    public enum AuthenticationType: String, Sendable, CaseIterable {
        case ntlm = "ntlm"
        case msn = "msna"
        case dpa = "dpaa"
        case rpa = "rpaa"
        case httpBasic = "http"
        case httpDigest = "httd"
        case htmlForm = "form"
        case `default` = "dflt"
    }

    /// Where an internet-password keychain's items belong: the attributes besides the account that
    /// make an internet password unique (Apple's: server, protocol, authentication type, port, path,
    /// security domain).
    public struct Server: Sendable, Equatable {
        /// `kSecAttrServer`: the host.
        public var host: String
        /// `kSecAttrProtocol`.
        public var protocolType: ProtocolType
        /// `kSecAttrAuthenticationType`.
        public var authenticationType: AuthenticationType
        /// `kSecAttrPort`, when one is named.
        public var port: Int?
        /// `kSecAttrPath` (empty: none).
        public var path: String
        /// `kSecAttrSecurityDomain`, when one is named.
        public var securityDomain: String?

        /// The server `host` with these attributes.
        public init(
            host: String, protocolType: ProtocolType, authenticationType: AuthenticationType = .default,
            port: Int? = nil, path: String = "", securityDomain: String? = nil
        ) {
            self.host = host
            self.protocolType = protocolType
            self.authenticationType = authenticationType
            self.port = port
            self.path = path
            self.securityDomain = securityDomain
        }
    }

    /// The service (`kSecAttrService`) of every item this keychain reads and writes (empty for an
    /// internet-password keychain).
    public let service: String
    /// The server of every internet password this keychain reads and writes; nil for a
    /// generic-password keychain.
    public let server: Server?
    /// The access group items are confined to; nil means all of the app's groups, adding to the first.
    public let accessGroup: String?
    /// The accessibility class written items get (`whenUnlocked` by default).
    public let accessibility: Accessibility
    /// The user-visible label written items get, if any.
    public let label: String?
    /// What reading (or changing) an item this keychain writes asks of the person: its
    /// `kSecAttrAccessControl` constraints; empty (the default) asks nothing.
    public private(set) var authenticationPolicy: AuthenticationPolicy = []

    /// Constraints of an item's access control that keychaind enforces, with Apple's
    /// `SecAccessControlCreateFlags` values: reading the item's data, or changing it, shows a pinentry
    /// dialog naming the app and the item (docs/protocol.md §7.2). Items with one need a keychain
    /// passphrase set.
    public struct AuthenticationPolicy: OptionSet, Sendable, Hashable {
        /// The flags as Apple numbers them.
        public let rawValue: Int64
        /// Flags from their raw value.
        public init(rawValue: Int64) { self.rawValue = rawValue }
        /// The person allows it: the keychain passphrase, or yes/no where `presenceConfirmation` says so.
        public static let userPresence = AuthenticationPolicy(rawValue: 1 << 0)
        /// The keychain passphrase.
        public static let devicePasscode = AuthenticationPolicy(rawValue: 1 << 4)
        /// Any one of the constraints.
        public static let or = AuthenticationPolicy(rawValue: 1 << 14)
        /// All of the constraints.
        public static let and = AuthenticationPolicy(rawValue: 1 << 15)
    }
    /// The connection to the daemon the calls go through.
    public let connection: KeychainConnection

    /// A keychain for `service`'s items; sends nothing to the daemon until a call.
    public init(
        service: String, accessGroup: String? = nil, accessibility: Accessibility = .whenUnlocked,
        connection: KeychainConnection = .shared
    ) {
        self.init(
            service: service, server: nil, accessGroup: accessGroup, accessibility: accessibility, label: nil,
            connection: connection)
    }

    /// An internet-password keychain for `server`'s items (KeychainAccess's `Keychain(server:protocolType:)`):
    /// a URL such as `https://example.com:8443/login` gives the host, port and path; a bare host
    /// name gives the host alone. Sends nothing to the daemon until a call.
    public init(
        server: String, protocolType: ProtocolType, authenticationType: AuthenticationType = .default,
        securityDomain: String? = nil, accessGroup: String? = nil, accessibility: Accessibility = .whenUnlocked,
        connection: KeychainConnection = .shared
    ) {
        var location = Server(
            host: server, protocolType: protocolType, authenticationType: authenticationType,
            securityDomain: securityDomain)
        if let url = URL(string: server), let host = url.host, !host.isEmpty {
            location.host = host
            location.port = url.port
            location.path = url.path
        }
        self.init(
            server: location, accessGroup: accessGroup, accessibility: accessibility, connection: connection)
    }

    /// An internet-password keychain for `server`'s items (host, port and path from the URL).
    public init(
        server: URL, protocolType: ProtocolType, authenticationType: AuthenticationType = .default,
        securityDomain: String? = nil, accessGroup: String? = nil, accessibility: Accessibility = .whenUnlocked,
        connection: KeychainConnection = .shared
    ) {
        self.init(
            server: server.absoluteString, protocolType: protocolType, authenticationType: authenticationType,
            securityDomain: securityDomain, accessGroup: accessGroup, accessibility: accessibility,
            connection: connection)
    }

    /// An internet-password keychain for the items of `server`, as given.
    public init(
        server: Server, accessGroup: String? = nil, accessibility: Accessibility = .whenUnlocked,
        connection: KeychainConnection = .shared
    ) {
        self.init(
            service: "", server: server, accessGroup: accessGroup, accessibility: accessibility, label: nil,
            connection: connection)
    }

    private init(
        service: String, server: Server?, accessGroup: String?, accessibility: Accessibility, label: String?,
        connection: KeychainConnection
    ) {
        self.service = service
        self.server = server
        self.accessGroup = accessGroup
        self.accessibility = accessibility
        self.label = label
        self.connection = connection
    }

    /// Equal when they name the same configuration and share the same connection object.
    public static func == (a: Keychain, b: Keychain) -> Bool {
        a.service == b.service && a.server == b.server && a.accessGroup == b.accessGroup
            && a.accessibility == b.accessibility
            && a.label == b.label && a.authenticationPolicy == b.authenticationPolicy && a.connection === b.connection
    }

    /// A copy bound to `group` (nil: the app's groups, with the first as default for writes).
    public func accessGroup(_ group: String?) -> Keychain {
        var copy = Keychain(
            service: service, server: server, accessGroup: group, accessibility: accessibility, label: label,
            connection: connection)
        copy.authenticationPolicy = authenticationPolicy
        return copy
    }

    /// A copy that writes items with `accessibility`.
    public func accessibility(_ accessibility: Accessibility) -> Keychain {
        var copy = Keychain(
            service: service, server: server, accessGroup: accessGroup, accessibility: accessibility, label: label,
            connection: connection)
        copy.authenticationPolicy = authenticationPolicy
        return copy
    }

    /// A copy that writes items with this user-visible label.
    public func label(_ label: String?) -> Keychain {
        var copy = Keychain(
            service: service, server: server, accessGroup: accessGroup, accessibility: accessibility, label: label,
            connection: connection)
        copy.authenticationPolicy = authenticationPolicy
        return copy
    }

    /// A copy that writes items whose data asks the person before it is read (`[]`: asks nothing).
    public func authenticationPolicy(_ policy: AuthenticationPolicy) -> Keychain {
        var copy = self
        copy.authenticationPolicy = policy
        return copy
    }

    // MARK: Requests

    private func base() throws(KeychainError) -> [String: Value] {
        var q: [String: Value]
        if let server {
            guard !server.host.isEmpty else { throw .param("the keychain's server must not be empty") }
            q = [
                "class": .text(ItemClass.internetPassword.code), "srvr": .text(server.host),
                "ptcl": .text(server.protocolType.rawValue), "atyp": .text(server.authenticationType.rawValue),
                "path": .text(server.path),
            ]
            if let port = server.port {
                guard (0...65535).contains(port) else { throw .param("the keychain's port must be 0…65535") }
                q["port"] = .int(Int64(port))
            }
            if let domain = server.securityDomain { q["sdmn"] = .text(domain) }
        } else {
            guard !service.isEmpty else { throw .param("the keychain's service must not be empty") }
            q = ["class": .text(ItemClass.genericPassword.code), "svce": .text(service)]
        }
        if let accessGroup { q["agrp"] = .text(accessGroup) }
        return q
    }

    private func key(_ account: String) throws(KeychainError) -> [String: Value] {
        guard !account.isEmpty else { throw .param("the key (account) must not be empty") }
        var q = try base()
        q["acct"] = .text(account)
        return q
    }

    private func readQuery(_ account: String) throws(KeychainError) -> [String: Value] {
        var q = try key(account)
        q["r_Data"] = .bool(true)
        q["m_Limit"] = .text("m_LimitOne")
        return q
    }

    private func written(_ data: Data) -> [String: Value] {
        var a: [String: Value] = ["v_Data": .secret(SecretBytes(data)), "pdmn": .text(accessibility.rawValue)]
        if let label { a["labl"] = .text(label) }
        if !authenticationPolicy.isEmpty { a["accc"] = .map(["flags": .int(authenticationPolicy.rawValue)]) }
        return a
    }

    private func addQuery(_ account: String, _ data: Data) throws(KeychainError) -> [String: Value] {
        try key(account).merging(written(data)) { _, new in new }
    }

    /// The item `set` collided with: without an access group the add went to the app's default group,
    /// so the update is confined to that group rather than touching same-named items in shared groups.
    private func updateQuery(_ account: String, defaultGroup: String?) throws(KeychainError) -> [String: Value] {
        var q = try key(account)
        if accessGroup == nil, let defaultGroup { q["agrp"] = .text(defaultGroup) }
        return q
    }

    private func defaultGroup() throws(KeychainError) -> String? {
        accessGroup == nil ? try KeychainAdmin(connection: connection).status().groups.first : nil
    }

    private func defaultGroup() async throws(KeychainError) -> String? {
        accessGroup == nil ? try await KeychainAdmin(connection: connection).status().groups.first : nil
    }

    private func keysQuery() throws(KeychainError) -> [String: Value] {
        var q = try base()
        q["r_Attributes"] = .bool(true)
        q["m_Limit"] = .text("m_LimitAll")
        return q
    }

    private static func accounts(_ v: Value?) -> [String] {
        let items: [Value]
        switch v {
        case .array(let a)?: items = a
        case .map?: items = [v!]
        default: items = []
        }
        // An account written as Data by SecItem code (as some wrappers do) is listed by its UTF-8 text.
        return items.compactMap { item -> String? in
            switch item.map?["acct"] {
            case .text(let s)?: return s
            case .bytes(let b)?: return String(validating: b, as: UTF8.self)
            case .secret(let s)?: return s.withUnsafeBytes { String(validating: $0, as: UTF8.self) }
            default: return nil
            }
        }.sorted()
    }

    private static func data(_ v: Value?) throws(KeychainError) -> Data {
        switch v {
        case .secret(let s)?: return s.withUnsafeBytes { Data($0) }
        case .bytes(let b)?: return Data(b)
        default: throw KeychainError(.decode, "keychaind returned no data for the item")
        }
    }

    private static func string(_ d: Data?) throws(KeychainError) -> String? {
        guard let d else { return nil }
        guard let s = String(data: d, encoding: .utf8) else {
            throw KeychainError(.decode, "the item's data is not UTF-8 text; read it with data(forKey:)")
        }
        return s
    }

    // MARK: Blocking API

    /// The item's data, or nil when there is no such item.
    public func data(forKey key: String) throws(KeychainError) -> Data? {
        do throws(KeychainError) {
            return try Self.data(connection.call(.copy, query: readQuery(key)))
        } catch  where error.status == .itemNotFound {
            return nil
        }
    }

    /// The item's data as UTF-8 text, or nil when there is no such item.
    public func string(forKey key: String) throws(KeychainError) -> String? {
        var data = try data(forKey: key)
        defer { if data != nil { data!.resetBytes(in: data!.startIndex..<data!.endIndex) } }  // the text is a copy
        return try Self.string(data)
    }

    /// Whether an item exists for `key` (its data is not read).
    public func contains(_ key: String) throws(KeychainError) -> Bool {
        do throws(KeychainError) {
            _ = try connection.call(.copy, query: self.key(key))
            return true
        } catch  where error.status == .itemNotFound {
            return false
        }
    }

    /// Stores `data` for `key`: adds the item, or updates it (data, accessibility, label) if it exists.
    public func set(_ data: Data, forKey key: String) throws(KeychainError) {
        let add = try addQuery(key, data)
        for _ in 0..<3 {
            do throws(KeychainError) {
                _ = try connection.call(.add, query: add)
                return
            } catch  where error.status == .duplicateItem {}
            do throws(KeychainError) {
                _ = try connection.call(
                    .update, query: updateQuery(key, defaultGroup: try defaultGroup()), attributes: written(data))
                return
            } catch  where error.status == .itemNotFound {}  // removed in between: add again
        }
        throw KeychainError(.duplicateItem, "the item kept being added and removed concurrently")
    }

    /// Stores `string` as UTF-8 for `key`.
    public func set(_ string: String, forKey key: String) throws(KeychainError) {
        var data = Data(string.utf8)
        // The caller's String cannot be wiped; this copy of it can.
        defer { data.resetBytes(in: data.startIndex..<data.endIndex) }
        try set(data, forKey: key)
    }

    /// Removes the item for `key`; removing an absent item is not an error.
    public func removeValue(forKey key: String) throws(KeychainError) {
        do throws(KeychainError) {
            _ = try connection.call(.delete, query: self.key(key))
        } catch  where error.status == .itemNotFound {}
    }

    /// The keys (accounts) of this service's items, sorted.
    public func allKeys() throws(KeychainError) -> [String] {
        do throws(KeychainError) {
            return Self.accounts(try connection.call(.copy, query: keysQuery()))
        } catch  where error.status == .itemNotFound {
            return []
        }
    }

    /// Removes every item of this service (in its access group, or all of the app's groups).
    public func removeAll() throws(KeychainError) {
        do throws(KeychainError) {
            _ = try connection.call(.delete, query: base())
        } catch  where error.status == .itemNotFound {}
    }

    // MARK: async API (suspends; never blocks a cooperative thread while waiting for the daemon)

    /// The item's data, or nil when there is no such item, suspending instead of blocking.
    public func data(forKey key: String) async throws(KeychainError) -> Data? {
        do throws(KeychainError) {
            return try Self.data(await connection.call(.copy, query: readQuery(key)))
        } catch  where error.status == .itemNotFound {
            return nil
        }
    }

    /// The item's data as UTF-8 text, or nil when there is no such item, suspending instead of blocking.
    public func string(forKey key: String) async throws(KeychainError) -> String? {
        try Self.string(await data(forKey: key))
    }

    /// Whether an item exists for `key` (its data is not read), suspending instead of blocking.
    public func contains(_ key: String) async throws(KeychainError) -> Bool {
        do throws(KeychainError) {
            _ = try await connection.call(.copy, query: self.key(key))
            return true
        } catch  where error.status == .itemNotFound {
            return false
        }
    }

    /// Stores `data` for `key` (adds, or updates if it exists), suspending instead of blocking.
    public func set(_ data: Data, forKey key: String) async throws(KeychainError) {
        let add = try addQuery(key, data)
        for _ in 0..<3 {
            do throws(KeychainError) {
                _ = try await connection.call(.add, query: add)
                return
            } catch  where error.status == .duplicateItem {}
            do throws(KeychainError) {
                _ = try await connection.call(
                    .update, query: updateQuery(key, defaultGroup: try await defaultGroup()), attributes: written(data))
                return
            } catch  where error.status == .itemNotFound {}
        }
        throw KeychainError(.duplicateItem, "the item kept being added and removed concurrently")
    }

    /// Stores `string` as UTF-8 for `key`, suspending instead of blocking.
    public func set(_ string: String, forKey key: String) async throws(KeychainError) {
        try await set(Data(string.utf8), forKey: key)
    }

    /// Removes the item for `key` (an absent item is not an error), suspending instead of blocking.
    public func removeValue(forKey key: String) async throws(KeychainError) {
        do throws(KeychainError) {
            _ = try await connection.call(.delete, query: self.key(key))
        } catch  where error.status == .itemNotFound {}
    }

    /// The keys (accounts) of this service's items, sorted, suspending instead of blocking.
    public func allKeys() async throws(KeychainError) -> [String] {
        do throws(KeychainError) {
            return Self.accounts(try await connection.call(.copy, query: keysQuery()))
        } catch  where error.status == .itemNotFound {
            return []
        }
    }

    /// Removes every item of this service, suspending instead of blocking.
    public func removeAll() async throws(KeychainError) {
        do throws(KeychainError) {
            _ = try await connection.call(.delete, query: base())
        } catch  where error.status == .itemNotFound {}
    }
}

extension Keychain: CustomStringConvertible {
    /// Names the configuration only; never reads or prints items.
    public var description: String {
        if let server {
            return
                "Keychain(server: \(server.host), protocolType: \(server.protocolType), accessGroup: \(accessGroup ?? "default"), accessibility: \(accessibility))"
        }
        return
            "Keychain(service: \(service), accessGroup: \(accessGroup ?? "default"), accessibility: \(accessibility))"
    }
}

/// This device's identifier for an access group: one random UUID, created on first use and then
/// the same for every app of the group, across restarts and reinstalls, and when many processes
/// ask at once (the daemon lets exactly one add win; the others read the winner's value).
public enum DeviceIdentifier {
    /// The UUID of `accessGroup` (nil: the app's default, first, access group).
    public static func current(accessGroup: String? = nil, connection: KeychainConnection = .shared)
        throws(KeychainError) -> UUID
    {
        try uuid(DeviceIdentifierConvention.resolve(accessGroup: accessGroup, connection: connection))
    }

    /// Same, suspending instead of blocking.
    public static func current(accessGroup: String? = nil, connection: KeychainConnection = .shared)
        async throws(KeychainError) -> UUID
    {
        try uuid(await DeviceIdentifierConvention.resolve(accessGroup: accessGroup, connection: connection))
    }

    private static func uuid(_ s: String) throws(KeychainError) -> UUID {
        guard let u = UUID(uuidString: s) else { throw KeychainError(.decode, "the device identifier is not a UUID") }
        return u
    }
}
