internal import CSupport
import Glibc

/// A self-pipe that wakes a thread waiting in `Poll.wait`: both ends close-on-exec, the read end
/// non-blocking (so `drain` never waits), the write end non-blocking (a full pipe is awake already).
public final class WakePipe: Sendable {
    private let readEnd: FileDescriptor
    private let writeEnd: FileDescriptor

    /// Opens the pipe, both ends close-on-exec and non-blocking; throws the `pipe2` errno.
    public init() throws(Errno) {
        var fds: [Int32] = [-1, -1]
        _ = try valueOrErrno("pipe2") { kc_pipe2(&fds, O_CLOEXEC | O_NONBLOCK) }
        readEnd = FileDescriptor(adopting: fds[0])
        writeEnd = FileDescriptor(adopting: fds[1])
    }

    /// Makes the read end readable.
    public func wake() {
        var one: UInt8 = 1
        _ = write(writeEnd.rawValue, &one, 1)
    }

    /// Empties the pipe.
    public func drain() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(readEnd.rawValue, &buffer, buffer.count) > 0 {}
    }

    /// The descriptor `Poll.wait` watches.
    var readDescriptor: Int32 { readEnd.rawValue }
}

/// Waiting on a descriptor someone else owns (a library's connection) and a `WakePipe` at once.
public enum Poll {
    /// Waits until `fd` has the poll `events`, `wake` is readable, or `timeoutMilliseconds` pass (-1:
    /// no limit). Returns whether `wake` fired.
    public static func wait(_ fd: Int32, events: Int16, or wake: WakePipe, timeoutMilliseconds: Int32) -> Bool {
        var fds = [
            pollfd(fd: fd, events: events, revents: 0),
            pollfd(fd: wake.readDescriptor, events: Int16(POLLIN), revents: 0),
        ]
        let n = poll(&fds, 2, timeoutMilliseconds)
        return n > 0 && fds[1].revents != 0
    }
}

extension ProcessHandle {
    /// A handle of its own on the process a borrowed pidfd `fd` pins (a close-on-exec duplicate: the
    /// owner of `fd` still closes it).
    public static func duplicating(_ fd: Int32) throws(Errno) -> ProcessHandle {
        ProcessHandle(adopting: try valueOrErrno("fcntl(F_DUPFD_CLOEXEC)") { fcntl(fd, F_DUPFD_CLOEXEC, 3) })
    }

    /// Sends `SIGTERM` to exactly this process (never to another that got its pid); false when it is gone.
    public func terminate() -> Bool {
        kc_pidfd_send_signal(rawDescriptor, SIGTERM) == 0
    }
}
