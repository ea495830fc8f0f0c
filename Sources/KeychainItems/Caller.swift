/// Who is asking: the calling application's keychain access groups, resolved by the daemon.
public struct Caller: Sendable, Hashable {
    /// Ordered; the first is where an add without `agrp` goes. Empty means no entitlement at all.
    public var accessGroups: [String]
    /// May name any group, and a query without `agrp` searches every group.
    public var isAdmin: Bool

    public init(accessGroups: [String], isAdmin: Bool = false) {
        self.accessGroups = accessGroups
        self.isAdmin = isAdmin
    }
}
