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
    public static func rootOwnedProblem(_ path: String) -> String? {
        for (component, isLast) in chain(of: path) {
            guard let st = try? FileSystem.status(component, followLinks: false) else {
                return "\(component) cannot be read"
            }
            if st.uid != 0 { return "\(component) is owned by uid \(st.uid), not by root" }
            let sticky = st.kind == .directory && st.isSticky
            if st.permissions & 0o022 != 0 && !(sticky && !isLast) {
                return "\(component) is writable by group or others"
            }
        }
        return nil
    }

    /// Nil when `principal` cannot change the file `path` names: neither the file (after resolving
    /// symlinks) nor any directory above it, nor any directory above the path as written (which could
    /// re-point a symlink). Else why, naming the culprit.
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
                if st.uid == principal.uid { return "\(component) belongs to uid \(principal.uid)" }
                let writable =
                    st.permissions & 0o002 != 0 || (st.permissions & 0o020 != 0 && principal.groups.contains(st.gid))
                let sticky = st.kind == .directory && st.isSticky
                if writable && !(sticky && !isLast) { return "\(component) is writable by uid \(principal.uid)" }
            }
        }
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
