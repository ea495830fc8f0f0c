internal import CSupport
import Glibc

/// A POSIX access ACL (`system.posix_acl_access`), as the kernel stores it: who may read, write or
/// search a file beyond what its mode bits say.
///
/// Read from the extended attribute and parsed here (no libacl): a 4-byte little-endian header
/// (version 2), then 8-byte entries of tag (u16), permissions (u16) and id (u32).
public struct AccessControlList: Sendable, Equatable {
    /// What an entry applies to.
    public enum Tag: UInt16, Sendable {
        /// The file's owner (`ACL_USER_OBJ`).
        case owner = 0x01
        /// A named user (`ACL_USER`).
        case user = 0x02
        /// The file's group (`ACL_GROUP_OBJ`).
        case owningGroup = 0x04
        /// A named group (`ACL_GROUP`).
        case group = 0x08
        /// The most any named user, the owning group or a named group gets (`ACL_MASK`).
        case mask = 0x10
        /// Everyone else (`ACL_OTHER`).
        case other = 0x20
    }

    /// One entry.
    public struct Entry: Sendable, Equatable {
        /// What the entry applies to.
        public let tag: Tag
        /// Read 4, write 2, execute or search 1.
        public let permissions: UInt16
        /// The uid of a `.user` entry, the gid of a `.group` entry; unused for the others.
        public let id: UInt32

        /// An entry from its fields.
        public init(tag: Tag, permissions: UInt16, id: UInt32 = UInt32.max) {
            self.tag = tag
            self.permissions = permissions
            self.id = id
        }
    }

    /// The write permission bit of an entry.
    public static let write: UInt16 = 0o2

    /// The entries, in the order stored.
    public let entries: [Entry]

    /// An ACL of these entries.
    public init(entries: [Entry]) {
        self.entries = entries
    }

    /// Parses the extended attribute's value; nil when it is not a version-2 ACL of whole, known entries.
    public init?(attribute bytes: [UInt8]) {
        guard bytes.count >= 4, (bytes.count - 4) % 8 == 0 else { return nil }
        func u16(_ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { UInt32(u16(at)) | UInt32(u16(at + 2)) << 16 }
        guard u32(0) == 2 else { return nil }
        var entries: [Entry] = []
        var at = 4
        while at < bytes.count {
            guard let tag = Tag(rawValue: u16(at)) else { return nil }
            entries.append(Entry(tag: tag, permissions: u16(at + 2), id: u32(at + 4)))
            at += 8
        }
        self.entries = entries
    }

    /// The attribute's value for these entries (tests write ACLs with it).
    public var attribute: [UInt8] {
        var out: [UInt8] = [2, 0, 0, 0]
        for e in entries {
            for (value, width) in [(UInt32(e.tag.rawValue), 2), (UInt32(e.permissions), 2), (e.id, 4)] {
                for i in 0..<width { out.append(UInt8(truncatingIfNeeded: value >> (8 * UInt32(i)))) }
            }
        }
        return out
    }

    /// Whether a process of `uid` with `groups` may write a file of owner `ownerUID` and group
    /// `ownerGID` that has this ACL, decided as the kernel does (`posix_acl_permission`): the owner
    /// entry for the owner; else a named user entry for `uid`, limited by the mask; else a write
    /// from any matching group entry (the owning group or a named one), limited by the mask, and
    /// none if some group matched; else the other entry.
    public func grantsWrite(uid: UInt32, groups: Set<UInt32>, ownerUID: UInt32, ownerGID: UInt32) -> Bool {
        let mask = entries.first { $0.tag == .mask }?.permissions ?? 0o7
        func masked(_ p: UInt16) -> Bool { p & mask & Self.write != 0 }
        if uid == ownerUID {
            return entries.contains { $0.tag == .owner && $0.permissions & Self.write != 0 }
        }
        if let named = entries.first(where: { $0.tag == .user && $0.id == uid }) {
            return masked(named.permissions)
        }
        var groupMatched = false
        for e in entries {
            let matches =
                (e.tag == .owningGroup && groups.contains(ownerGID)) || (e.tag == .group && groups.contains(e.id))
            guard matches else { continue }
            groupMatched = true
            if masked(e.permissions) { return true }
        }
        if groupMatched { return false }
        return entries.contains { $0.tag == .other && $0.permissions & Self.write != 0 }
    }
}

extension FileSystem {
    /// The access ACL of `path` (`getxattr` of `system.posix_acl_access`, or `lgetxattr` with
    /// `followLinks: false`): nil when it has none beyond its mode bits, or its file system keeps none.
    /// Throws when it cannot be read, or does not parse (the error's code is then EINVAL).
    public static func accessControlList(_ path: String, followLinks: Bool = true) throws(Errno) -> AccessControlList? {
        let name = "system.posix_acl_access"
        let follow: Int32 = followLinks ? 1 : 0
        func call() -> String { followLinks ? "getxattr \(path)" : "lgetxattr \(path)" }
        // Most files have none: one call into a small buffer (16 entries), and nothing built for ENODATA
        // (this runs for every directory above a registered executable on every identification).
        var code: Int32 = 0
        let small = withUnsafeTemporaryAllocation(byteCount: 4 + 16 * 8, alignment: 8) { buffer -> [UInt8]? in
            let n = kc_get_xattr(path, name, buffer.baseAddress, buffer.count, follow)
            if n < 0 {
                code = errno
                return nil
            }
            return Array(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
        }
        if let small {
            guard let acl = AccessControlList(attribute: small) else { throw Errno(EINVAL, call: call()) }
            return acl
        }
        if code == ENODATA || code == EOPNOTSUPP { return nil }
        guard code == ERANGE || code == EINTR else { throw Errno(code, call: call()) }
        while true {
            let size: Int
            do throws(Errno) { size = try valueOrErrno(call()) { kc_get_xattr(path, name, nil, 0, follow) } } catch {
                if error.code.rawValue == ENODATA || error.code.rawValue == EOPNOTSUPP { return nil }
                throw error
            }
            var bytes = [UInt8](repeating: 0, count: size)
            let n = bytes.withUnsafeMutableBytes { kc_get_xattr(path, name, $0.baseAddress, $0.count, follow) }
            if n < 0 {
                // ERANGE: it grew between the two calls; ENODATA: it was removed.
                if errno == ERANGE || errno == EINTR { continue }
                if errno == ENODATA { return nil }
                throw Errno.current(call())
            }
            guard let acl = AccessControlList(attribute: Array(bytes[0..<n])) else { throw Errno(EINVAL, call: call()) }
            return acl
        }
    }
}
