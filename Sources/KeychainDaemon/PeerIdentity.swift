#if canImport(Glibc)
import Glibc
#endif
import CSupport
import KeychainCore

/// The process on the other end of a connection, identified once at accept time.
public struct PeerIdentity: Sendable {
    public let pid: Int32
    public let uid: UInt32
    /// The real path of the peer's executable, or nil when it could not be read race-free.
    public let executable: String?
    /// Why `executable` is nil, for the error message the client gets.
    public let problem: String?

    public init(pid: Int32, uid: UInt32, executable: String?, problem: String?) {
        self.pid = pid
        self.uid = uid
        self.executable = executable
        self.problem = problem
    }

    /// Reads SO_PEERCRED, then the executable through a pidfd: the pidfd pins the process, so after
    /// reading `/proc/<pid>/exe` we check that the pidfd still names a live process with that pid —
    /// a pid recycled in between cannot lend its executable to an impostor.
    public static func of(socket fd: Int32) throws(KeychainError) -> PeerIdentity {
        var cred = kc_peer_cred()
        guard kc_peer_credentials(fd, &cred) == 0 else {
            throw KeychainError(.io, "SO_PEERCRED failed: \(String(cString: strerror(errno)))")
        }
        var pidfd = kc_peer_pidfd(fd)
        // Kernels before 6.5 lack SO_PEERPIDFD (ENOPROTOOPT): pidfd_open right after accept, the best
        // they allow. Any other failure means the peer is gone (6.5–6.15 refuse a pidfd for a reaped
        // peer): pidfd_open(pid) then could pin whatever process now has that recycled pid.
        if pidfd < 0 && errno == ENOPROTOOPT { pidfd = kc_pidfd_open(cred.pid) }
        guard pidfd >= 0 else {
            return PeerIdentity(pid: cred.pid, uid: cred.uid, executable: nil,
                                problem: "the calling process (pid \(cred.pid)) could not be pinned with a pidfd")
        }
        defer { close(pidfd) }
        let exe = readExecutable(pid: cred.pid)
        guard kc_pidfd_exited(pidfd) == 0, kc_pidfd_pid(pidfd) == cred.pid else {
            return PeerIdentity(pid: cred.pid, uid: cred.uid, executable: nil,
                                problem: "the calling process (pid \(cred.pid)) exited before it could be identified")
        }
        guard let exe else {
            return PeerIdentity(pid: cred.pid, uid: cred.uid, executable: nil,
                                problem: "the executable of pid \(cred.pid) cannot be read (is it non-dumpable?)")
        }
        if exe.hasSuffix(" (deleted)") {
            return PeerIdentity(pid: cred.pid, uid: cred.uid, executable: nil,
                                problem: "the executable of pid \(cred.pid) was deleted or replaced after it started")
        }
        return PeerIdentity(pid: cred.pid, uid: cred.uid, executable: exe, problem: nil)
    }

    static func readExecutable(pid: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
