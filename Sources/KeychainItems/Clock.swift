import KeychainSystem

/// Timestamps for cdat/mdat: wall-clock seconds, strictly increasing across the writes of this process,
/// and an update's mdat at least 1 ms past the item's previous one (as Apple does).
package final class Clock: Sendable {
    private let last = Locked<Double>(0)

    package func next(after previous: Double? = nil) -> Double {
        let wall = WallClock.now()
        return last.withLock { last in
            var t = max(wall, last + 1e-6)
            if let previous { t = max(t, previous + 1e-3) }
            last = t
            return t
        }
    }
}
