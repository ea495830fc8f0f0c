import Glibc

/// Time since an arbitrary point that never jumps (`CLOCK_MONOTONIC`): timeouts, idle clocks, intervals.
public enum MonotonicClock {
    /// Seconds.
    public static func now() -> Double {
        let ts = read(CLOCK_MONOTONIC)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Whole milliseconds.
    public static func milliseconds() -> Int64 {
        let ts = read(CLOCK_MONOTONIC)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    /// Nanoseconds (benchmarks).
    public static func nanoseconds() -> UInt64 {
        let ts = read(CLOCK_MONOTONIC)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    /// The one place keychaind reads a clock. Both clocks exist on every Linux; a failure is a bug.
    static func read(_ clock: clockid_t) -> timespec {
        var ts = timespec()
        let rc = clock_gettime(clock, &ts)
        precondition(rc == 0, "clock_gettime failed")
        return ts
    }
}

/// Wall-clock time (`CLOCK_REALTIME`): timestamps that must mean something across restarts.
public enum WallClock {
    /// Seconds since the Unix epoch.
    public static func now() -> Double {
        let ts = MonotonicClock.read(CLOCK_REALTIME)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// Sleeps the calling thread for `microseconds` (interrupted sleeps end early; callers re-check).
public func sleep(microseconds: UInt32) {
    _ = usleep(microseconds)
}

extension WallClock {
    /// `strftime(3)` of `epoch` seconds with `format`, in the local time zone or in UTC.
    public static func format(_ epoch: Double, _ format: String, local: Bool) -> String {
        var t = time_t(epoch.rounded(.down))
        var parts = tm()
        if local {
            tzset()
            localtime_r(&t, &parts)
        } else {
            gmtime_r(&t, &parts)
        }
        var buf = [CChar](repeating: 0, count: 64)
        let n = strftime(&buf, buf.count, format, &parts)
        return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
