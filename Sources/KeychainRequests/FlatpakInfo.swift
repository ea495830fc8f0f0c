import KeychainCore
import KeychainSystem

/// A Flatpak sandbox's `/.flatpak-info`, read the way xdg-desktop-portal reads it: through the
/// caller's process root (`/proc/<pid>/root/.flatpak-info`), a key file whose `[Application]`
/// group names the app (`name=<app id>`). Never the executable: inside a sandbox it is a file of
/// the sandbox's own choosing.
///
/// What it proves: that the process runs in a namespace whose root holds that file. Flatpak puts it
/// there read-only for every app (and writable for the app's D-Bus proxy, `isBusProxy`); an
/// unsandboxed process of the same user can make a namespace of its own with any `/.flatpak-info`
/// (bubblewrap does), and is then that app ID and nothing else — the same trust xdg-desktop-portal
/// gives (docs/security.md).
public enum FlatpakInfo {
    /// The largest `/.flatpak-info` read (Flatpak's are a few KiB).
    static let maxBytes = 64 * 1024
    /// The largest `mountinfo` read (a Flatpak sandbox's is a few KiB).
    static let maxMountTableBytes = 256 * 1024

    /// The app ID of the sandbox `pid` runs in: nil when its root has no `/.flatpak-info` (not a
    /// Flatpak sandbox), a failure with the reason when it has one that cannot be trusted or parsed.
    /// The file is opened first and the pidfd checked after, so it is the pinned process's root.
    public static func read(pid: Int32, process: PeerProcess) -> Result<String, KeychainIdentityError>? {
        let file: FileDescriptor
        do {
            file = try FileDescriptor.open(
                "/proc/\(pid)/root/.flatpak-info", [.noFollow, .noControllingTerminal, .nonBlocking])
        } catch {
            return nil
        }
        defer { file.close() }
        // The sandbox's user namespace must be keychaind's own, with the mount namespace another one
        // owned by it: Flatpak run by root, or with a setuid bubblewrap, makes no user namespace, and
        // only privilege in keychaind's namespace makes a mount namespace there. Or it must be a child
        // of keychaind's — or a grandchild whose parent owns the sandbox's mount namespace. Unprivileged
        // bubblewrap makes the second when it mounts a devpts (`--dev`, as Flatpak does for every app
        // without `--device=all`): it makes the namespaces in one user namespace (uid 0 there, for
        // devpts) and moves the app into a child of it with the user's uid, so the mounts,
        // /.flatpak-info among them, belong to a namespace in which the app has no privilege. A
        // sandboxed app that makes a namespace of its own inside (with a /.flatpak-info of another app
        // bound over its root) has its mounts owned by that new namespace, or sits deeper still, and
        // names no app.
        let trusted = (try? trustedLayout(pid: pid)) ?? false
        // And the file must be the one at the root of the process's own mount namespace: a process
        // keeps its mount namespace across chroot(2), so the layout alone does not say that the root
        // it reads from is its namespace's (a sandboxed app that may make a user namespace can
        // chroot into a root built in another namespace, through /proc/<pid>/root).
        let atItsRoot = trusted && ((try? mountedAtRoot(pid: pid, file: file)) ?? false)
        guard process.isPinned else {
            return .failure(
                KeychainIdentityError("the calling process (pid \(pid)) exited before it could be identified"))
        }
        guard trusted else {
            return .failure(
                KeychainIdentityError(
                    "pid \(pid) runs in a sandbox inside another namespace than keychaind's own children (a sandbox made inside a sandbox), so its /.flatpak-info names no app"
                ))
        }
        guard atItsRoot else {
            return .failure(
                KeychainIdentityError(
                    "the /.flatpak-info of pid \(pid) is not one of the mounts of its own mount namespace (a root changed with chroot), so it names no app"
                ))
        }
        let bytes: [UInt8]
        do {
            guard try file.isOnReadOnlyMount() || isBusProxy(pid: pid) else {
                return .failure(
                    KeychainIdentityError(
                        "pid \(pid) runs in a sandbox whose /.flatpak-info is writable, so it names no app (Flatpak mounts it read-only)"
                    ))
            }
            let st = try file.status()
            guard st.kind == .regular, st.size <= maxBytes else {
                return .failure(
                    KeychainIdentityError("the /.flatpak-info of pid \(pid) is not a regular file of at most 64 KiB"))
            }
            bytes = try file.readToEnd(chunk: 4096)
        } catch {
            return .failure(KeychainIdentityError("the /.flatpak-info of pid \(pid) cannot be read (\(error.message))"))
        }
        guard process.isPinned else {
            return .failure(
                KeychainIdentityError("the calling process (pid \(pid)) exited before it could be identified"))
        }
        guard bytes.count <= maxBytes, let appID = appID(in: bytes) else {
            return .failure(
                KeychainIdentityError(
                    "the /.flatpak-info of pid \(pid) names no valid app ID in its [Application] group"))
        }
        return .success(appID)
    }

    /// The D-Bus proxy Flatpak puts between an app and the session bus (`--talk-name`, `--own-name`).
    public static let busProxyPath = "/usr/bin/xdg-dbus-proxy"

    /// Whether `pid` is Flatpak's D-Bus proxy for an app: the bus names it, not the app, as the caller.
    /// Flatpak runs it in a bubblewrap sandbox of its own whose `/.flatpak-info`, a copy of the app's,
    /// is a plain file on the sandbox's writable root (`bwrap --file`), so the read-only rule cannot
    /// hold there. It is trusted when the process runs the system's xdg-dbus-proxy (the same file as
    /// keychaind's `/usr/bin/xdg-dbus-proxy`, which the user cannot modify) in keychaind's own pid
    /// namespace: Flatpak starts the proxy there, while every Flatpak app runs in a pid namespace of
    /// its own that neither it nor anything it starts can leave — so no app can be, or make, a
    /// process of that layout, nor reach the proxy's file.
    static func isBusProxy(pid: Int32) -> Bool {
        guard let proxy = FileIdentity.of(path: busProxyPath),
            FileIdentity.of(path: "/proc/\(pid)/exe") == proxy
        else { return false }
        return FileIdentity.of(path: "/proc/\(pid)/ns/pid") == PeerIdentity.ownPidNamespace
    }

    /// Whether `file` (opened through `/proc/<pid>/root`) lies on a mount that `pid`'s own
    /// `mountinfo` shows at `/.flatpak-info` (Flatpak's read-only bind) or at `/` (a file on the
    /// sandbox's root, as the D-Bus proxy's). `mountinfo` lists the mounts of the process's mount
    /// namespace as seen from its root: a process whose root was moved by chroot into a tree of
    /// another namespace sees none of that tree's mounts there.
    static func mountedAtRoot(pid: Int32, file: FileDescriptor) throws(Errno) -> Bool {
        let id = try file.mountID()
        let table = try FileDescriptor.open("/proc/\(pid)/mountinfo", [.noControllingTerminal])
        defer { table.close() }
        // A sandbox has tens of mounts; a namespace made to have thousands (to make every
        // identification read megabytes) names no app.
        var text = [UInt8](repeating: 0, count: maxMountTableBytes + 1)
        var filled = 0
        while filled < text.count {
            var failure: Errno?
            let n = text.withUnsafeMutableBytes { (b) -> Int in
                do throws(Errno) {
                    return try table.read(into: UnsafeMutableRawBufferPointer(rebasing: b[filled...]))
                } catch {
                    failure = error
                    return 0
                }
            }
            if let failure { throw failure }
            if n == 0 { break }
            filled += n
        }
        guard filled <= maxMountTableBytes else { return false }
        text.removeLast(text.count - filled)
        // Each line: mount id, parent id, major:minor, root, mount point, …
        for line in text.split(separator: UInt8(ascii: "\n")) {
            let fields = line.split(separator: UInt8(ascii: " "), maxSplits: 5)
            guard fields.count >= 5, Int(String(decoding: fields[0], as: UTF8.self)) == id else { continue }
            let point = String(decoding: fields[4], as: UTF8.self)
            return point == "/.flatpak-info" || point == "/"
        }
        return false
    }

    /// Whether `pid`'s namespaces are laid out as Flatpak lays out a sandbox (`read` says which).
    static func trustedLayout(pid: Int32) throws(Errno) -> Bool {
        let userNamespace = try FileDescriptor.open("/proc/\(pid)/ns/user")
        defer { userNamespace.close() }
        let mounts = try FileDescriptor.open("/proc/\(pid)/ns/mnt")
        defer { mounts.close() }
        let owner = try mounts.namespaceOwner()
        defer { owner.close() }
        let mountOwner = try owner.status().identity
        let own = try userNamespace.status().identity
        if own == PeerIdentity.ownUserNamespace {
            let mountNamespace = try mounts.status().identity
            return mountOwner == own && mountNamespace != PeerIdentity.ownMountNamespace
        }
        let parentNamespace = try userNamespace.namespaceParent()
        defer { parentNamespace.close() }
        let parent = try parentNamespace.status().identity
        if parent == PeerIdentity.ownUserNamespace { return true }
        let grandparent = try parentNamespace.namespaceParent()
        defer { grandparent.close() }
        let above = try grandparent.status().identity
        return above == PeerIdentity.ownUserNamespace && mountOwner == parent
    }

    /// The `name` of the `[Application]` group of a key file, when it is a valid app ID.
    public static func appID(in bytes: [UInt8]) -> String? {
        guard let text = String(validating: bytes, as: UTF8.self) else { return nil }
        var group = ""
        var name: String?
        for raw in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = raw.hasSuffix("\r") ? raw.dropLast() : raw[...]
            if line.hasPrefix("#") || line.allSatisfy({ $0 == " " || $0 == "\t" }) { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { return nil }
                group = String(line.dropFirst().dropLast())
                continue
            }
            guard group == "Application", let eq = line.firstIndex(of: "=") else { continue }
            let key = line[..<eq].trimmingSpaces
            guard key == "name" else { continue }
            // A key twice in one group: the key file is ambiguous, so it names nobody.
            guard name == nil else { return nil }
            name = String(line[line.index(after: eq)...].trimmingSpaces)
        }
        guard let name, isValidAppID(name) else { return nil }
        return name
    }

    /// Flatpak's rule for an app ID (a D-Bus well-known name): at most 255 bytes, at least three
    /// elements separated by dots, each non-empty, of ASCII letters, digits, `_` and `-`, not
    /// starting with a digit.
    public static func isValidAppID(_ id: String) -> Bool {
        let bytes = Array(id.utf8)
        guard !bytes.isEmpty, bytes.count <= 255 else { return false }
        let elements = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard elements.count >= 3 else { return false }
        for element in elements {
            guard let first = element.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else {
                return false
            }
            for b in element {
                let ok =
                    (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(b)
                    || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(b)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b) || b == UInt8(ascii: "_")
                    || b == UInt8(ascii: "-")
                guard ok else { return false }
            }
        }
        return true
    }
}

extension Substring {
    fileprivate var trimmingSpaces: Substring {
        var s = self
        while let c = s.first, c == " " || c == "\t" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" { s = s.dropLast() }
        return s
    }
}

extension FileStatus {
    fileprivate var identity: FileIdentity { FileIdentity(device: device, inode: inode) }
}
