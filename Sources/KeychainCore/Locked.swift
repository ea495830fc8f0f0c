#if canImport(Glibc)
import Glibc
#endif

/// A mutex guarding a stretch of code, built on `pthread_mutex_t`.
///
/// keychaind uses this (and `Locked`) instead of `Synchronization.Mutex`: on Linux that type is built
/// on raw futex calls which ThreadSanitizer cannot see, so every access it guarded was reported as a
/// race and the sanitizer runs were noise. ThreadSanitizer intercepts `pthread_mutex_lock`, so with
/// these its reports are real. The mutex lives on the heap (it must never move) and is destroyed in
/// `deinit`.
public final class Lock: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    public init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with the lock held (not reentrant).
    public func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }
}

/// A value that only one thread at a time may touch. (For a lock without a value use `Lock`:
/// `Locked<Void>` hands ThreadSanitizer a zero-sized value whose address aliases the object header,
/// which it reports as a race.)
public final class Locked<Value>: @unchecked Sendable {
    private let lock = Lock()
    private var value: Value

    public init(_ value: Value) { self.value = value }

    /// Runs `body` with the lock held. `body` must not call back into the same `Locked` (not reentrant).
    public func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        try lock.withLock { () throws(E) -> R in try body(&value) }
    }
}
