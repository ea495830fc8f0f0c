internal import CSupport
import Glibc

/// This process: its ids, environment, limits and hardening.
public enum CurrentProcess {
    /// This process's id.
    public static var pid: Int32 { getpid() }
    /// The real user id.
    public static var uid: UInt32 { getuid() }
    /// The effective user id.
    public static var effectiveUID: UInt32 { geteuid() }

    /// The supplementary groups and the effective group.
    public static var groups: [UInt32] {
        let count = getgroups(0, nil)
        var groups = [gid_t](repeating: 0, count: Int(max(count, 0)))
        let n = getgroups(count, &groups)
        var all = Array(groups.prefix(Int(max(n, 0))))
        all.append(getegid())
        return all
    }

    /// An environment variable; nil when unset.
    public static func environment(_ name: String) -> String? {
        getenv(name).map { String(cString: $0) }
    }

    /// Sets an environment variable (replacing it).
    public static func setEnvironment(_ name: String, _ value: String) {
        setenv(name, value, 1)
    }

    /// Removes an environment variable.
    public static func unsetEnvironment(_ name: String) {
        unsetenv(name)
    }

    /// Replaces this process with a fresh run of its own executable (same arguments and environment).
    /// Returns only when that failed.
    public static func reexecute() {
        // The real path, not /proc/self/exe, so the process keeps its name (pkill -x).
        guard let real = realpath("/proc/self/exe", nil) else { return }
        execv(real, CommandLine.unsafeArgv)
        free(real)
    }

    /// No core dumps and no ptrace by other processes of the same user (`PR_SET_DUMPABLE` 0,
    /// `RLIMIT_CORE` 0).
    public static func makeUndumpable() throws(Errno) {
        _ = try valueOrErrno("setrlimit(RLIMIT_CORE) or prctl(PR_SET_DUMPABLE)") { kc_make_undumpable() }
    }

    /// Dumpable again (`PR_SET_DUMPABLE` 1; `RLIMIT_CORE` stays 0 after `makeUndumpable`): other
    /// processes of the user may read `/proc/<pid>/exe` — which a same-uid daemon needs to identify
    /// this process — and, where `ptrace` is allowed, attach.
    public static func makeDumpable() throws(Errno) {
        _ = try valueOrErrno("prctl(PR_SET_DUMPABLE)") { kc_make_dumpable() }
    }

    /// Sets the umask to 077 (files created private by default); returns the old one.
    @discardableResult
    public static func makeUmaskPrivate() -> UInt32 { UInt32(kc_umask_private()) }

    /// Raises the soft limit of open files to the hard limit (one descriptor per client).
    public static func raiseOpenFileLimit() {
        var files = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &files) == 0, files.rlim_cur < files.rlim_max {
            files.rlim_cur = files.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &files)
        }
    }

    /// The working directory (`getcwd`); nil when it cannot be named (removed, or out of reach).
    public static func workingDirectory() -> String? {
        guard let p = getcwd(nil, 0) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }

    /// Ends the process with `status` (no clean-up of Swift objects).
    public static func exit(_ status: Int32) -> Never { Glibc.exit(status) }
}

/// Signals, delivered through a pipe to a thread that reads them (the self-pipe pattern).
public enum SignalPipe {
    /// The signals the daemon handles.
    public enum Signal: Sendable {
        case hangUp, terminate, interrupt
    }

    /// The pipe's write end, which the signal handler writes to for the life of the process.
    nonisolated(unsafe) private static var handlerEnd: FileDescriptor?

    /// Makes SIGTERM, SIGINT and SIGHUP write their number to a pipe, ignores SIGPIPE, and returns
    /// the pipe's read end; throws the errno of `pipe2`, `fcntl` or `sigaction`. A C handler does
    /// the write, so any thread may take the signal and nothing runs in signal context but that write.
    public static func install() throws(Errno) -> FileDescriptor {
        var fds: [Int32] = [-1, -1]
        _ = try valueOrErrno("pipe2") { kc_pipe2(&fds, O_CLOEXEC) }
        let readEnd = FileDescriptor(adopting: fds[0])
        let writeEnd = FileDescriptor(adopting: fds[1])
        _ = try valueOrErrno("fcntl(O_NONBLOCK)") { fcntl(fds[1], F_SETFL, O_NONBLOCK) }
        _ = try valueOrErrno("sigaction") { kc_install_signal_pipe(fds[1]) }
        // The handler writes to this descriptor for the life of the process: kept open here.
        handlerEnd = writeEnd
        signal(SIGPIPE, SIG_IGN)
        return readEnd
    }

    /// Blocks until the next signal arrives on `pipe`; nil when the pipe ends.
    public static func next(from pipe: FileDescriptor) -> Signal? {
        var byte: UInt8 = 0
        while true {
            let n = try? withUnsafeMutableBytes(of: &byte) { b in try pipe.read(into: b) }
            guard n == 1 else { return nil }
            switch Int32(byte) {
            case SIGHUP: return .hangUp
            case SIGTERM: return .terminate
            case SIGINT: return .interrupt
            default: continue
            }
        }
    }
}
