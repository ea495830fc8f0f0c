public import KeychainCore
package import KeychainCrypto
import KeychainStore

/// An item's `kSecAttrAccessControl` (wire key `accc`) with the constraints keychaind enforces:
/// `.userPresence` and `.devicePasscode`, alone or joined by `.or` / `.and` (docs/protocol.md,
/// "Access control"). Reading such an item's data, or changing it, asks the person through pinentry
/// (KeychainDaemon/RequestHandler+Presence.swift); its row carries `ProtectionClass.presenceBit` in
/// the class column, so the read paths see it without opening anything.
///
/// On the wire a request carries `{"flags": n, "pdmn": class}` (Apple's `SecAccessControlCreateFlags`
/// values; `pdmn` optional, the protection class the access control names); the item stores and
/// returns `{"flags": n}` beside its `pdmn`.
package struct AccessControl: Equatable, Sendable {
    /// The wire key.
    package static let key = "accc"
    /// Apple's flag values (SecAccessControl.h).
    package static let userPresence: Int64 = 1 << 0
    package static let devicePasscode: Int64 = 1 << 4
    package static let or: Int64 = 1 << 14
    package static let and: Int64 = 1 << 15
    /// The constraints keychaind cannot enforce, by name (errSecUnimplemented).
    static let unsupported: [(Int64, String)] = [
        (1 << 1, "biometryAny"), (1 << 3, "biometryCurrentSet"), (1 << 5, "watch"),
        (1 << 30, "privateKeyUsage"), (1 << 31, "applicationPassword"),
    ]

    /// The flags, as Apple numbers them.
    package let flags: Int64
    /// The protection class the request's access control named (nil: none, or a stored one).
    package var protection: ProtectionClass?

    /// Whether a yes/no confirmation can satisfy it (where the config allows one): `.userPresence`
    /// alone, or `.or` with `.devicePasscode`. Anything else needs the keychain passphrase.
    package var confirmable: Bool {
        flags & Self.userPresence != 0 && (flags & Self.devicePasscode == 0 || flags & Self.or != 0)
    }

    /// How it is stored with the item and returned in its attributes.
    package var stored: Value { .map(["flags": .int(flags)]) }

    /// The flags' names, for messages and `keychainctl` (`userPresence`, `devicePasscode or userPresence`).
    package var summary: String {
        var names: [String] = []
        if flags & Self.devicePasscode != 0 { names.append("devicePasscode") }
        if flags & Self.userPresence != 0 { names.append("userPresence") }
        return names.joined(separator: flags & Self.or != 0 ? " or " : " and ")
    }

    /// The access control a stored item carries, or nil.
    package init?(stored value: Value?) {
        guard case .map(let m)? = value, case .int(let flags)? = m["flags"] else { return nil }
        self.flags = flags
    }

    /// A request's `accc` value, checked: errSecUnimplemented naming any constraint keychaind cannot
    /// enforce; errSecParam for a malformed value.
    package init(wire value: Value) throws(KeychainError) {
        let shape = "accc (kSecAttrAccessControl) must be a map {\"flags\": n, \"pdmn\": class}"
        guard case .map(let m) = value else { throw .param("\(shape), not \(value.kindName)") }
        for key in m.keys where key != "flags" && key != "pdmn" {
            throw .param("\(shape); it has an unknown key \(printableKey(key))")
        }
        guard case .int(let flags)? = m["flags"], flags >= 0, flags <= Int64(UInt32.max) else {
            throw .param("\(shape) whose flags are a SecAccessControlCreateFlags value")
        }
        let refused = Self.unsupported.filter { flags & $0.0 != 0 }.map(\.1)
        let known = Self.userPresence | Self.devicePasscode | Self.or | Self.and
        let unknown = flags & ~known & ~Self.unsupported.reduce(0) { $0 | $1.0 }
        if !refused.isEmpty || unknown != 0 {
            let names = refused + (unknown != 0 ? ["unknown flags 0x" + String(unknown, radix: 16)] : [])
            throw KeychainError(
                .unimplemented,
                "kSecAttrAccessControl (\"accc\") with \(names.joined(separator: ", ")) is not supported: keychaind can ask for the person's presence (.userPresence) or the keychain passphrase (.devicePasscode) only"
            )
        }
        if flags & Self.or != 0 && flags & Self.and != 0 {
            throw .param("kSecAttrAccessControl (\"accc\") cannot have both .or and .and")
        }
        guard flags & (Self.userPresence | Self.devicePasscode) != 0 else {
            throw .param(
                "kSecAttrAccessControl (\"accc\") without constraints: name its protection class with kSecAttrAccessible"
            )
        }
        self.flags = flags
        switch m["pdmn"] {
        case nil: protection = nil
        case .text(let code)?:
            guard let p = ProtectionClass(code: code) else {
                throw .param(
                    "the protection class of kSecAttrAccessControl (\"accc\") is not a kSecAttrAccessible value")
            }
            protection = p
        case let other?:
            throw .param("the protection class of kSecAttrAccessControl (\"accc\") must be text, not \(other.kindName)")
        }
    }
}

/// The items a request would read the data of (or change) that need the person first, so the
/// transport can ask before it runs the request again with the `PresenceGrant` of the answers.
public struct PresenceItem: Sendable {
    /// The item's persistent-reference id (what a `PresenceGrant` names).
    public let ref: [UInt8]
    /// Whether a yes/no confirmation may do (`.userPresence`), where the config allows one; else
    /// the keychain passphrase.
    public let confirmable: Bool
    /// The item as a person recognises it: `service=… account=…`, `server=… account=…`, or `label=…`.
    public let description: String
}

/// What the person allowed for one request: the items (by persistent-reference id) whose data it
/// may read or change. Any other item that needs presence is errSecInteractionNotAllowed with
/// `needsPresence`, or left out of the answer when `skipOthers` (kSecUseAuthenticationUISkip).
public struct PresenceGrant: Sendable {
    /// The items allowed.
    public var refs: Set<[UInt8]> = []
    /// Leave out the other items that need presence instead of failing.
    public var skipOthers = false

    /// Nothing allowed yet.
    public init() {}
}

extension ItemService {
    /// errSecInteractionNotAllowed for an item that needs the person, with `needsPresence` set so
    /// the transport may ask and try again.
    static let presenceNeeded: KeychainError = {
        var e = KeychainError(
            .interactionNotAllowed, "the item's access control needs the person's confirmation, which was not given")
        e.needsPresence = true
        return e
    }()

    /// Throws `presenceNeeded`; out of line, so the read path that tests the bit carries only the test.
    @inline(never)
    static func refuseWithoutPresence() throws(KeychainError) -> Never { throw presenceNeeded }

    /// Whether the data of the row `ref` may be read under `grant`: true when granted, false to
    /// leave it out (skipped), else throws `presenceNeeded`. Off the hot path: only rows with the
    /// presence bit get here.
    @inline(never)
    static func presenceAllows(_ ref: UnsafeRawBufferPointer, _ grant: PresenceGrant?) throws(KeychainError) -> Bool {
        guard let grant else { throw presenceNeeded }
        if grant.refs.contains(Array(ref)) { return true }
        if grant.skipOthers { return false }
        throw presenceNeeded
    }

    /// `presenceAllows` for a row's `ref` column as an array.
    @inline(never)
    static func presenceAllows(_ ref: [UInt8], _ grant: PresenceGrant?) throws(KeychainError) -> Bool {
        guard let grant else { throw presenceNeeded }
        if grant.refs.contains(ref) { return true }
        if grant.skipOthers { return false }
        throw presenceNeeded
    }

    /// The items of a `copy` (or `update`) `query` of `caller` whose data it would read (or
    /// change) and that need the person: the matches it would take, in order, up to its limit,
    /// those with the presence bit opened (attributes only) for their description.
    public func itemsNeedingPresence(_ query: [String: Value], for operation: Operation, caller: Caller)
        throws(KeychainError) -> [PresenceItem]
    {
        let parsed = try ParsedQuery(query, for: operation)
        let scope = try AccessPolicy.scope(naming: parsed.attributes[.accessGroup]?.text, caller)
        let filter = rowFilter(parsed, scope: scope, withSecret: false, indexer: try? vault.indexer())
        let maximum = operation == .copy ? parsed.limit.maximum : Int.max
        var found: [PresenceItem] = []
        var matches = 0
        try store.read { (reader) throws(KeychainError) in
            try reader.forEach(filter) { (row) throws(KeychainError) -> Bool in
                let item = try codec.open(row, withSecret: false)
                guard Self.matches(item, parsed, scope) else { return true }
                matches += 1
                if row.protectionClass & ProtectionClass.presenceBit != 0,
                    let control = AccessControl(stored: item.attributes[AccessControl.key])
                {
                    found.append(
                        PresenceItem(
                            ref: row.ref, confirmable: control.confirmable,
                            description: Self.presenceDescription(item.attributes)))
                }
                return matches < maximum
            }
        }
        return found
    }

    /// An item as a person recognises it in a prompt (never its data).
    static func presenceDescription(_ attributes: [String: Value]) -> String {
        func text(_ key: String) -> String? {
            switch attributes[key] {
            case .text(let t)?: return t
            case .bytes(let b)?: return String(validating: b, as: UTF8.self) ?? "\(b.count) bytes"
            default: return nil
            }
        }
        var parts: [String] = []
        if let s = text("svce"), !s.isEmpty { parts.append("service=\(s)") }
        if let s = text("srvr"), !s.isEmpty { parts.append("server=\(s)") }
        if let a = text("acct"), !a.isEmpty { parts.append("account=\(a)") }
        if parts.isEmpty, let l = text("labl") { parts.append("label=\(l)") }
        return parts.isEmpty ? "an item without service, account or label" : parts.joined(separator: " ")
    }
}
