import KeychainRequests
import KeychainSystem

/// What the Secret Service takes from the system layer (KeychainSystem) beyond the types it uses
/// as they are (`WakePipe`, `Poll`, `ProcessHandle`): a few process facts, errno texts and the clock,
/// in the forms sd-bus and the bus code want them. It makes no system call of its own.
enum SystemLayer {
    /// The uid a process runs as (from /proc), or nil when it is gone.
    static func uid(of pid: Int32) -> UInt32? {
        (try? FileSystem.status("/proc/\(pid)"))?.uid
    }

    /// Sleeps for `milliseconds` (start-up waits only).
    static func sleep(milliseconds: UInt32) { KeychainSystem.sleep(microseconds: milliseconds * 1000) }

    /// `EEXIST`, as sd-bus reports a name someone else holds.
    static let alreadyExists = Errno.Code.exists.rawValue

    /// The path of a process's executable as /proc shows it, for messages (nil when unreadable).
    static func executable(of pid: Int32) -> String? { PeerIdentity.readExecutable(pid: pid) }

    static var uid: UInt32 { CurrentProcess.uid }
    static func describe(errno e: Int32) -> String { Errno(e, call: "").message }

    /// CLOCK_MONOTONIC in microseconds (sd-bus's clock for timeouts).
    static func monotonicMicroseconds() -> UInt64 { MonotonicClock.nanoseconds() / 1000 }

    /// The bytes of a NUL-terminated string, exactly (no UTF-8 repair).
    static func bytes(ofCString p: UnsafePointer<CChar>) -> [UInt8] {
        var n = 0
        while p[n] != 0 { n += 1 }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }
}
