#if canImport(Glibc)
import Glibc
#endif
import CSupport
import CSystemd

/// The Linux calls the Secret Service makes, all in one place: the wake-up descriptor of the bus
/// thread, waiting on it and the bus, duplicating a pidfd the bus hands over, pinning a pid.
enum SystemCalls {
    /// A self-pipe (read end, write end), both close-on-exec, the write end non-blocking; nil on failure.
    static func makeWakePipe() -> (read: Int32, write: Int32)? {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { return nil }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        _ = fcntl(fds[0], F_SETFL, O_NONBLOCK)
        _ = fcntl(fds[1], F_SETFL, O_NONBLOCK)
        return (fds[0], fds[1])
    }

    /// Makes the pipe readable (wakes the bus thread); a full pipe is already awake.
    static func wake(_ writeFD: Int32) {
        var one: UInt8 = 1
        _ = write(writeFD, &one, 1)
    }

    /// Empties the pipe.
    static func drain(_ readFD: Int32) {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(readFD, &buffer, buffer.count) > 0 {}
    }

    /// Waits until `busFD` has the `busEvents` poll events, `wakeFD` is readable, or `timeoutMs`
    /// passes (-1: no limit). Returns whether the wake descriptor fired.
    static func wait(busFD: Int32, busEvents: Int16, wakeFD: Int32, timeoutMs: Int32) -> Bool {
        var fds = [pollfd(fd: busFD, events: busEvents, revents: 0), pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)]
        let n = poll(&fds, 2, timeoutMs)
        return n > 0 && fds[1].revents != 0
    }

    /// A close-on-exec duplicate of `fd` (a descriptor the bus message owns); -1 on failure.
    static func duplicate(_ fd: Int32) -> Int32 {
        fcntl(fd, F_DUPFD_CLOEXEC, 3)
    }

    /// pidfd_open(pid): pins the process with that pid now (-1 with errno on failure).
    static func pidfdOpen(_ pid: Int32) -> Int32 {
        kc_pidfd_open(pid)
    }

    /// Sends SIGTERM to the process a pidfd pins (never to whatever process has its pid by then).
    static func terminate(pidfd: Int32) -> Bool {
        pidfd_send_signal(pidfd, SIGTERM, nil, 0) == 0
    }

    /// The uid a process runs as (from /proc), or nil when it is gone.
    static func uid(of pid: Int32) -> UInt32? {
        var st = stat()
        guard stat("/proc/\(pid)", &st) == 0 else { return nil }
        return st.st_uid
    }

    /// Sleeps for `milliseconds` (start-up waits only).
    static func sleep(milliseconds: UInt32) { usleep(milliseconds * 1000) }

    static let alreadyExists = EEXIST

    /// Closes a descriptor this code owns.
    static func close(_ fd: Int32) {
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    /// The path of a process's executable as /proc shows it, for messages (nil when unreadable).
    static func executable(of pid: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static var uid: UInt32 { getuid() }
    static var errnoDescription: String { describe(errno: errno) }
    static func describe(errno e: Int32) -> String { String(cString: strerror(e)) }

    /// CLOCK_MONOTONIC in microseconds (sd-bus's clock for timeouts).
    static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
    }

    /// The bytes of a NUL-terminated string, exactly (no UTF-8 repair).
    static func bytes(ofCString p: UnsafePointer<CChar>) -> [UInt8] {
        Array(UnsafeRawBufferPointer(start: p, count: strlen(p)))
    }
}
