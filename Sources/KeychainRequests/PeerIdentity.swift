public import KeychainCore
public import KeychainSystem

/// A file as the kernel knows it: device and inode. Two paths name the same file when these agree;
/// a bind mount over a path, or a new file renamed over it, gives a different identity.
public struct FileIdentity: Hashable, Sendable, CustomStringConvertible {
    /// The device the file lives on (`st_dev`).
    public let device: UInt64
    /// The file's inode number on that device (`st_ino`).
    public let inode: UInt64

    /// An identity from a device and inode already read.
    public init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    /// `stat(2)` of `path`, following symlinks; nil when it cannot be read.
    public static func of(path: String) -> FileIdentity? {
        guard let st = try? FileSystem.status(path) else { return nil }
        return FileIdentity(device: st.device, inode: st.inode)
    }

    /// `dev D ino I`, for log lines and messages.
    public var description: String { "dev \(device) ino \(inode)" }
}

/// A pidfd for the process on the other end of a connection, kept open for the connection's life:
/// while it is open and the process runs, no other process can be that process.
public final class PeerProcess: Sendable {
    /// The process id the pidfd was opened for.
    public let pid: Int32
    private let handle: ProcessHandle

    package init(pid: Int32, handle: ProcessHandle) {
        self.pid = pid
        self.handle = handle
    }

    /// Whether the process still runs (its pidfd is not yet readable).
    public var isRunning: Bool { handle.isRunning }

    /// Whether the pidfd still names a running process with this pid (right after pinning).
    package var isPinned: Bool { isRunning && handle.pid == pid }

    /// Whether `other` (a pidfd the writer of a connection's first bytes passed along with them)
    /// pins this very process: both run, with this pid. Only one running process has a given pid,
    /// and a pidfd can only have been opened while its process ran — so the writer, which had this
    /// pid when it wrote and held a pidfd of a process that has run with it ever since, is this one.
    package func isSameProcess(as other: ProcessHandle) -> Bool {
        other.isRunning && other.pid == pid && isPinned
    }
}

/// The process on the other end of a connection, as far as the daemon could establish it at accept
/// time: its uid, its executable file, and whether it sees the system as the daemon does (the same user,
/// pid and mount namespaces, the same root directory).
public struct PeerIdentity: Sendable {
    /// The peer's process id, from the socket's credentials (`SO_PEERCRED`).
    public let pid: Int32
    /// The peer's user id, from the socket's credentials.
    public let uid: UInt32
    /// The path of the peer's executable as `/proc/<pid>/exe` shows it, or nil when unreadable.
    public let executable: String?
    /// The executable's device and inode (the file, not the path), read through `/proc/<pid>/exe`.
    public let executableFile: FileIdentity?
    /// Why the peer cannot be identified, for the error message the client gets.
    public let problem: String?
    /// The pinned process (nil when it could not be pinned): frames are checked against it.
    public let process: PeerProcess?
    /// Whether bytes had already arrived when the process was pinned, on a kernel without
    /// `SO_PEERPIDFD` (pinned by `pidfd_open` after accept). Those bytes may have been written by an
    /// earlier process with the same pid, so the connection's first bytes must come with a pidfd of
    /// their writer that pins this process (`PeerProcess.isSameProcess`), or nothing is answered.
    public let firstWriteNeedsProof: Bool
    /// The Flatpak app ID of a peer in a sandbox (its `/.flatpak-info`, `FlatpakInfo`): such a peer
    /// has no executable identity (`executable` is nil) and is this app ID only.
    public let flatpakAppID: String?

    /// An identity from what was read at accept time; checks nothing itself.
    public init(
        pid: Int32, uid: UInt32, executable: String?, executableFile: FileIdentity?,
        problem: String?, process: PeerProcess? = nil, firstWriteNeedsProof: Bool = false,
        flatpakAppID: String? = nil
    ) {
        self.flatpakAppID = flatpakAppID
        self.pid = pid
        self.uid = uid
        self.executable = executable
        self.executableFile = executableFile
        self.problem = problem
        self.process = process
        self.firstWriteNeedsProof = firstWriteNeedsProof
    }

    /// This process's mount namespace; a peer in another one sees other files at the same paths.
    static let ownMountNamespace = FileIdentity.of(path: "/proc/self/ns/mnt")
    /// This process's user namespace. A process of the user may make a new one without privilege,
    /// and inside it holds every capability over its own processes: it can point its
    /// `/proc/self/exe` at any file (`PR_SET_MM_MAP`), chroot and run a registered executable under
    /// an ELF interpreter of its own, or put another of its processes' pids in a frame's
    /// SCM_CREDENTIALS (in a pid namespace it made). None of that works in the daemon's namespace,
    /// and no process can return to a parent namespace, so a peer in another one is never an app.
    static let ownUserNamespace = FileIdentity.of(path: "/proc/self/ns/user")
    /// This process's pid namespace and root directory: another of either (which takes privilege
    /// in the daemon's user namespace, or a namespace of one's own) is refused too.
    static let ownPidNamespace = FileIdentity.of(path: "/proc/self/ns/pid")
    static let ownRoot = FileIdentity.of(path: "/proc/self/root")

    /// Reads SO_PEERCRED and pins the peer with a pidfd (SO_PEERPIDFD), then reads its executable
    /// (path and file identity), namespaces and root through /proc, and checks that the pidfd still
    /// names a live process with that pid — so a pid recycled in between cannot lend its executable
    /// to an impostor.
    public static func of(socket: Socket) throws(KeychainError) -> PeerIdentity {
        let cred: PeerCredentials
        do { cred = try socket.peerCredentials() } catch { throw KeychainError(.io, error) }
        func unidentified(_ problem: String, _ process: PeerProcess? = nil) -> PeerIdentity {
            PeerIdentity(
                pid: cred.pid, uid: cred.uid, executable: nil, executableFile: nil, problem: problem, process: process)
        }
        // Kernels before 6.5 lack SO_PEERPIDFD (ENOPROTOOPT): pidfd_open right after accept pins
        // whatever process has the pid now, which may not be the one that connected (it can have
        // exited and its pid gone to another). Bytes that arrive after the pin were written by the
        // pinned process (each read's SCM_CREDENTIALS pid is checked against it while it runs);
        // bytes already waiting may be the earlier process's, so they need their writer's pidfd
        // (`firstWriteNeedsProof`). Any other failure means the peer is gone (6.5–6.15 refuse a pidfd
        // for a reaped peer): pidfd_open(pid) then could pin whatever process now has that pid.
        let handle: ProcessHandle
        var needsProof = false
        do throws(Errno) {
            do { handle = try socket.peerProcess() } catch  where error.code == .noProtocolOption {
                handle = try ProcessHandle.open(pid: cred.pid)
                needsProof = (socket.queuedBytes() ?? 1) != 0
            }
        } catch {
            return unidentified("the calling process (pid \(cred.pid)) could not be pinned with a pidfd")
        }
        return of(pid: cred.pid, uid: cred.uid, handle: handle, firstWriteNeedsProof: needsProof)
    }

    /// How this kernel lets the daemon pin a connecting process, for `status` and the log.
    public static var pinning: String {
        Socket.kernelPinsPeers
            ? "SO_PEERPIDFD"
            : "pidfd_open after accept (this kernel has no SO_PEERPIDFD); bytes sent before the pin need the writer's pidfd"
    }

    /// The same identification for a process already pinned by `handle` (a pidfd, which the identity
    /// keeps): its executable (path and file identity), namespaces and root read through /proc, then
    /// the check that the pidfd still names a live process with that pid. Used for socket peers and
    /// for callers on the session bus (whose pid comes from the bus).
    public static func of(
        pid: Int32, uid: UInt32, handle: ProcessHandle, firstWriteNeedsProof: Bool = false
    ) -> PeerIdentity {
        func unidentified(_ problem: String, _ process: PeerProcess? = nil) -> PeerIdentity {
            PeerIdentity(
                pid: pid, uid: uid, executable: nil, executableFile: nil, problem: problem, process: process,
                firstWriteNeedsProof: firstWriteNeedsProof)
        }
        let process = PeerProcess(pid: pid, handle: handle)
        let exe = readExecutable(pid: pid)
        let file = FileIdentity.of(path: "/proc/\(pid)/exe")
        let namespace = FileIdentity.of(path: "/proc/\(pid)/ns/mnt")
        let userNamespace = FileIdentity.of(path: "/proc/\(pid)/ns/user")
        let pidNamespace = FileIdentity.of(path: "/proc/\(pid)/ns/pid")
        let root = FileIdentity.of(path: "/proc/\(pid)/root")
        guard process.isPinned else {
            return unidentified("the calling process (pid \(pid)) exited before it could be identified")
        }
        guard let exe, let file else {
            return unidentified("the executable of pid \(pid) cannot be read (is it non-dumpable?)", process)
        }
        if exe.hasSuffix(" (deleted)") {
            return unidentified("the executable of pid \(pid) was deleted or replaced after it started", process)
        }
        let namespaced =
            userNamespace != ownUserNamespace || pidNamespace != ownPidNamespace || root != ownRoot
            || namespace != ownMountNamespace
        if namespaced, let sandbox = FlatpakInfo.read(pid: pid, process: process) {
            switch sandbox {
            case .success(let appID):
                return PeerIdentity(
                    pid: pid, uid: uid, executable: nil, executableFile: nil,
                    problem: "pid \(pid) runs in the Flatpak sandbox of \(appID)", process: process,
                    firstWriteNeedsProof: firstWriteNeedsProof, flatpakAppID: appID)
            case .failure(let why):
                return unidentified(why.message, process)
            }
        }
        guard let userNamespace, userNamespace == ownUserNamespace else {
            return unidentified(
                "pid \(pid) runs in another user namespace than keychaind (unshare -U, a sandbox or a container), where a process can claim an executable and credentials that are not its own; run it in keychaind's user namespace",
                process)
        }
        guard let pidNamespace, pidNamespace == ownPidNamespace, let root, root == ownRoot else {
            return unidentified(
                "pid \(pid) runs in another pid namespace or under another root directory (chroot) than keychaind; run it as keychaind sees the system",
                process)
        }
        guard let namespace, namespace == ownMountNamespace else {
            return unidentified(
                "pid \(pid) runs in another mount namespace than keychaind, where \(exe) may be another file; run it in keychaind's mount namespace",
                process)
        }
        return PeerIdentity(
            pid: pid, uid: uid, executable: exe, executableFile: file, problem: nil, process: process,
            firstWriteNeedsProof: firstWriteNeedsProof)
    }

    /// The path of `pid`'s executable as `/proc/<pid>/exe` shows it; nil when unreadable.
    public static func readExecutable(pid: Int32) -> String? {
        FileSystem.readLink("/proc/\(pid)/exe")
    }
}
