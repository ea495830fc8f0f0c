import KeychainSystem

/// What the Secret Service needs from the system, on the system layer (KeychainSystem): the few
/// process facts and the clock that are not already a type of their own there (`WakePipe`, `Poll`,
/// `ProcessHandle`).
enum SystemCalls {
    /// The uid a process runs as (from /proc), or nil when it is gone.
    static func uid(of pid: Int32) -> UInt32? {
        (try? FileSystem.status("/proc/\(pid)"))?.uid
    }

    /// Sleeps for `milliseconds` (start-up waits only).
    static func sleep(milliseconds: UInt32) { KeychainSystem.sleep(microseconds: milliseconds * 1000) }

    /// `EEXIST`, as sd-bus reports a name someone else holds.
    static let alreadyExists = Errno.Code.exists.rawValue

    /// The path of a process's executable as /proc shows it, for messages (nil when unreadable).
    static func executable(of pid: Int32) -> String? {
        FileSystem.readLink("/proc/\(pid)/exe")
    }

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
