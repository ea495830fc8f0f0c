import KeychainSystem

/// Who can change a file: the checks behind trusted registrations (docs/security.md §2).
///
/// A path can be changed by whoever can write the file itself or any directory on the way to it
/// (rename or replace an entry). A directory with the sticky bit (like /tmp) lets others add entries
/// but not replace those they do not own, so it counts as safe when the entry below it is safe.
public enum TrustedPaths {
    /// The user and groups whose power over files is being judged.
    struct Principal {
        let uid: UInt32
        let groups: Set<UInt32>

        /// This process's real uid and its primary and supplementary groups.
        static func current() -> Principal {
            Principal(uid: CurrentProcess.uid, groups: Set(CurrentProcess.groups))
        }
    }

    /// Nil when `path` and every directory above it belong to root and cannot be written by group or
    /// others (a sticky root directory such as /tmp is accepted); else why not, naming the culprit.
    /// An ACL's named users and groups are limited by its mask, which is what the group mode bits
    /// show, so the mode bits decide; the ACL names who may write.
    public static func rootOwnedProblem(_ path: String) -> String? {
        for (component, isLast) in chain(of: path) {
            guard let st = try? FileSystem.status(component, followLinks: false) else {
                return "\(component) cannot be read"
            }
            if st.uid != 0 { return "\(component) is owned by uid \(st.uid), not by root" }
            let sticky = st.kind == .directory && st.isSticky
            if st.permissions & 0o022 != 0 && !(sticky && !isLast) {
                let acl =
                    st.kind == .symbolicLink ? nil : try? FileSystem.accessControlList(component, followLinks: false)
                if let writers = acl.map(namedWriters), !writers.isEmpty {
                    return "\(component) is writable by others: its ACL grants write to \(writers)"
                }
                return "\(component) is writable by group or others"
            }
        }
        return nil
    }

    /// The named users and groups an ACL lets write, after its mask: `uid 1000, gid 27`.
    static func namedWriters(_ acl: AccessControlList) -> String {
        let mask = acl.entries.first { $0.tag == .mask }?.permissions ?? 0o7
        return acl.entries.filter { ($0.tag == .user || $0.tag == .group) && $0.permissions & mask & 0o2 != 0 }
            .map { "\($0.tag == .user ? "uid" : "gid") \($0.id)" }.joined(separator: ", ")
    }

    /// Nil when `principal` cannot change the file `path` names: neither the file (after resolving
    /// symlinks) nor any directory above it, nor any directory above the path as written (which could
    /// re-point a symlink). Else why, naming the culprit. Owners, mode bits and ACLs count.
    static func modifiableProblem(_ path: String, by principal: Principal) -> String? {
        var paths = [path]
        if let real = realPath(path), real != path { paths.append(real) }
        for p in paths {
            for (component, isLast) in chain(of: p) {
                // The written path's own last component may be a symlink: its directory decides.
                let follow = !(isLast && p == path && paths.count > 1)
                guard let st = try? FileSystem.status(component, followLinks: follow) else {
                    return "\(component) cannot be read"
                }
                if st.kind == .symbolicLink { continue }
                if let problem = writeProblem(component, st, isLast: isLast, followLinks: follow, by: principal) {
                    return problem
                }
            }
        }
        return nil
    }

    /// Why `principal` can change `component` (already `stat`ed as `st`), or nil: it owns it, or may
    /// write it by its ACL when it has one, else by its mode bits. A sticky directory above an entry
    /// `principal` does not own does not count.
    static func writeProblem(
        _ component: String, _ st: FileStatus, isLast: Bool, followLinks: Bool, by principal: Principal
    ) -> String? {
        if st.uid == principal.uid { return "\(component) belongs to uid \(principal.uid)" }
        if st.kind == .directory && st.isSticky && !isLast { return nil }
        let acl: AccessControlList?
        do throws(Errno) { acl = try FileSystem.accessControlList(component, followLinks: followLinks) } catch {
            return "the ACL of \(component) cannot be read (\(error.message))"
        }
        if let acl {
            if acl.grantsWrite(uid: principal.uid, groups: principal.groups, ownerUID: st.uid, ownerGID: st.gid) {
                return "\(component) is writable by uid \(principal.uid) through its ACL"
            }
            return nil
        }
        let writable =
            st.permissions & 0o002 != 0 || (st.permissions & 0o020 != 0 && principal.groups.contains(st.gid))
        return writable ? "\(component) is writable by uid \(principal.uid)" : nil
    }

    /// What a component of a path was when it was found safe: a change of owner, mode or ACL, or
    /// another file renamed into its place, gives another stamp (the inode's change time moves on).
    struct Stamp: Equatable {
        let device: UInt64
        let inode: UInt64
        let changeTime: Int64
        let permissions: UInt32
        let uid: UInt32
        let gid: UInt32

        /// `judgedByOwnerAlone`: a sticky directory above the entry, judged by its owner and mode
        /// (its ACL is not read), whose change time moves with every entry made in it (/tmp).
        init(_ st: FileStatus, judgedByOwnerAlone: Bool) {
            device = st.device
            inode = st.inode
            changeTime = judgedByOwnerAlone ? 0 : st.changeTime
            permissions = st.permissions
            uid = st.uid
            gid = st.gid
        }
    }

    /// Paths found unmodifiable at identification, with the stamps of their components then; shared by
    /// the threads that identify peers. Holds only registered executables' paths.
    final class UnmodifiableCache: @unchecked Sendable {
        // Safety: `safe` is read and written only with `lock` held.
        private let lock = Lock()
        private var safe: [String: [Stamp]] = [:]

        func isSafe(_ path: String, _ stamps: [Stamp]) -> Bool { lock.withLock { safe[path] == stamps } }
        func remember(_ path: String, _ stamps: [Stamp]) { lock.withLock { safe[path] = stamps } }
        /// How many paths are remembered as safe.
        var count: Int { lock.withLock { safe.count } }
    }

    /// How long a component must have been unchanged before its stamp is cached, in nanoseconds. The
    /// kernel stamps change times from a coarse clock (a tick of a few milliseconds), so two changes
    /// within a tick can leave the same change time; one cached that recently could hide the second.
    static let settledNanoseconds: Int64 = 1_000_000_000

    /// `modifiableProblem` at identification time, for `path` as the kernel names a running
    /// executable (`/proc/<pid>/exe`: absolute, symlinks resolved). One `lstat` per component; the
    /// owners, mode bits and ACLs are judged again only when a component's stamp differs from the one
    /// it had when last found safe (or changed less than a second before that).
    static func modifiableProblemNow(
        _ path: String, by principal: Principal, cache: UnmodifiableCache, settled: Int64 = settledNanoseconds
    ) -> String? {
        let components = chain(of: path)
        var stamps: [Stamp] = []
        var statuses: [FileStatus] = []
        stamps.reserveCapacity(components.count)
        statuses.reserveCapacity(components.count)
        for (component, isLast) in components {
            guard let st = try? FileSystem.status(component, followLinks: false) else {
                return "\(component) cannot be read"
            }
            // Not a resolved path any more (a directory replaced by a symlink): judge it in full.
            if st.kind == .symbolicLink { return modifiableProblem(path, by: principal) }
            stamps.append(Stamp(st, judgedByOwnerAlone: st.kind == .directory && st.isSticky && !isLast))
            statuses.append(st)
        }
        if cache.isSafe(path, stamps) { return nil }
        for ((component, isLast), st) in zip(components, statuses) {
            if let problem = writeProblem(component, st, isLast: isLast, followLinks: false, by: principal) {
                return problem
            }
        }
        let before = Int64(WallClock.now() * 1e9) - settled
        if stamps.allSatisfy({ $0.changeTime < before }) { cache.remember(path, stamps) }
        return nil
    }

    /// `/a/b/c` → `/`, `/a`, `/a/b`, `/a/b/c` (the last one flagged).
    static func chain(of path: String) -> [(String, Bool)] {
        var out: [(String, Bool)] = [("/", false)]
        var current = ""
        let parts = path.split(separator: "/")
        for (i, part) in parts.enumerated() {
            current += "/" + part
            out.append((current, i == parts.count - 1))
        }
        if parts.isEmpty { out[0].1 = true }
        return out
    }

    static func realPath(_ path: String) -> String? {
        FileSystem.realPath(path)
    }
}
