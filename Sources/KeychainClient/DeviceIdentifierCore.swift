public import KeychainCore

/// The device-identifier convention shared by `DeviceIdentifier`, `keychainctl device-id` and the
/// Python client (docs/internal/contracts.md): one `genp` item per access group,
/// `svce` = `com.keychaind.device-identifier`, `acct` = `device-id`, `pdmn` = `cku`, `v_Data` = the
/// upper-case UUID string (36 ASCII bytes).
///
/// Without a group, the identifier is that of the caller's default (first) access group, taken from
/// the `groups` list of the `status` operation.
///
/// Algorithm: copy; if not found add a fresh random UUID; if the add reports a duplicate, another
/// process won the race, so copy again. The database decides the race atomically, so every process
/// of the group ends up with the winner's value.
public enum DeviceIdentifierConvention {
    /// The service (`svce`) of the device-identifier item.
    public static let service = "com.keychaind.device-identifier"
    /// The account (`acct`) of the device-identifier item.
    public static let account = "device-id"
    /// The accessibility (`pdmn`) of the item: after first unlock, this device only.
    public static let accessibility = "cku"

    /// The key attributes of the item (group optional: nil = the caller's default group for adds,
    /// all of its groups for lookups).
    public static func query(accessGroup: String?) -> [String: Value] {
        var q: [String: Value] = ["class": .text("genp"), "svce": .text(service), "acct": .text(account)]
        if let accessGroup { q["agrp"] = .text(accessGroup) }
        return q
    }

    /// The identifier as its canonical upper-case string, created on first use.
    public static func resolve(accessGroup: String?, connection: KeychainConnection = .shared) throws(KeychainError)
        -> String
    {
        // Without a group, a lookup would span all of the app's groups and could return another
        // group's identifier: pin the default (first) group, which the daemon reports in `status`.
        var accessGroup = accessGroup
        if accessGroup == nil { accessGroup = try KeychainAdmin(connection: connection).status().groups.first }
        if let found = try lookup(accessGroup, connection) { return found }
        var add = query(accessGroup: accessGroup)
        add["pdmn"] = .text(accessibility)
        add["v_Data"] = .bytes(Array(randomUUIDString().utf8))
        do throws(KeychainError) {
            _ = try connection.call(.add, query: add)
        } catch  where error.status == .duplicateItem {
            // Lost the race: fall through and read the winner's value.
        }
        guard let stored = try lookup(accessGroup, connection) else {
            throw KeychainError(
                .itemNotFound, "the device identifier item vanished right after it was created (deleted concurrently?)")
        }
        return stored
    }

    /// Same as `resolve`, suspending instead of blocking.
    public static func resolve(accessGroup: String?, connection: KeychainConnection = .shared)
        async throws(KeychainError) -> String
    {
        var accessGroup = accessGroup
        if accessGroup == nil { accessGroup = try await KeychainAdmin(connection: connection).status().groups.first }
        if let found = try await lookup(accessGroup, connection) { return found }
        var add = query(accessGroup: accessGroup)
        add["pdmn"] = .text(accessibility)
        add["v_Data"] = .bytes(Array(randomUUIDString().utf8))
        do throws(KeychainError) {
            _ = try await connection.call(.add, query: add)
        } catch  where error.status == .duplicateItem {
        }
        guard let stored = try await lookup(accessGroup, connection) else {
            throw KeychainError(
                .itemNotFound, "the device identifier item vanished right after it was created (deleted concurrently?)")
        }
        return stored
    }

    private static func lookupQuery(_ group: String?) -> [String: Value] {
        var q = query(accessGroup: group)
        q["r_Data"] = .bool(true)
        q["m_Limit"] = .text("m_LimitOne")
        return q
    }

    private static func lookup(_ group: String?, _ connection: KeychainConnection) throws(KeychainError) -> String? {
        do throws(KeychainError) {
            return try parse(connection.call(.copy, query: lookupQuery(group)))
        } catch  where error.status == .itemNotFound {
            return nil
        }
    }

    private static func lookup(_ group: String?, _ connection: KeychainConnection) async throws(KeychainError)
        -> String?
    {
        do throws(KeychainError) {
            return try parse(await connection.call(.copy, query: lookupQuery(group)))
        } catch  where error.status == .itemNotFound {
            return nil
        }
    }

    private static func parse(_ value: Value?) throws(KeychainError) -> String {
        guard let b = value?.plainBytes, let s = canonicalUUID(b) else {
            throw KeychainError(
                .decode, "the device identifier item (\(service)/\(account)) does not hold a UUID string")
        }
        return s
    }

    /// The upper-case form of a textual UUID (8-4-4-4-12 hex digits), or nil when `bytes` is not one.
    public static func canonicalUUID(_ bytes: [UInt8]) -> String? {
        guard bytes.count == 36 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(36)
        for (i, c) in bytes.enumerated() {
            if i == 8 || i == 13 || i == 18 || i == 23 {
                guard c == UInt8(ascii: "-") else { return nil }
                out.append(c)
            } else if (48...57).contains(c) || (65...70).contains(c) {
                out.append(c)
            } else if (97...102).contains(c) {
                out.append(c - 32)
            } else {
                return nil
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// A random (version 4) UUID in upper case, from the system's cryptographic generator.
    public static func randomUUIDString() -> String {
        var rng = SystemRandomNumberGenerator()
        var bytes = (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
        bytes[6] = (bytes[6] & 0x0F) | 0x40
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        for (i, b) in bytes.enumerated() {
            if i == 4 || i == 6 || i == 8 || i == 10 { out.append(UInt8(ascii: "-")) }
            out.append(hex[Int(b >> 4)])
            out.append(hex[Int(b & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
