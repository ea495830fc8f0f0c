/// What a request asks keychaind to do: the `op` of a request on the wire (docs/protocol.md), the
/// action the access policy decides on, and the SecItem call whose rules a query is parsed under.
/// One list, shared by the wire, the item layer and the daemon.
public enum Operation: String, Sendable, CaseIterable {
    /// The four SecItem calls.
    case add, copy, update, delete
    /// Administration and status (docs/protocol.md §11).
    case status, lock, unlock, passwd, backup, restore
    /// Registrations: approve an `apps.d` file, revoke an approval (admins, with the passphrase).
    case approve, revoke
    /// Sync through a shared folder: status, pairing, key rotation (admins; docs/sync.md).
    case sync

    /// The four SecItem calls.
    public var isItemOperation: Bool { self == .add || self == .copy || self == .update || self == .delete }

    /// Apple's name of the call (`SecItemAdd` …) for the item operations, else the wire name.
    public var callName: String {
        switch self {
        case .add: return "SecItemAdd"
        case .copy: return "SecItemCopyMatching"
        case .update: return "SecItemUpdate"
        case .delete: return "SecItemDelete"
        default: return rawValue
        }
    }
}
