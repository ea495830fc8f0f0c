#if canImport(Glibc)
import Glibc
#endif

/// A value that only one thread at a time may touch, guarded by a pthread mutex.
///
/// keychaind uses this instead of `Synchronization.Mutex`: on Linux that type is built on raw futex
/// calls which ThreadSanitizer cannot see, so every access it guards was reported as a race and the
/// sanitizer runs were noise. ThreadSanitizer intercepts `pthread_mutex_lock`, so with `Locked` its
/// reports are real. The mutex lives on the heap (it must never move) and is destroyed in `deinit`.
public final class Locked<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    public init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with the lock held. `body` must not call back into the same `Locked` (not reentrant).
    public func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}

/// A mutex guarding a stretch of code rather than a value (`Locked<Void>` would hand ThreadSanitizer
/// a zero-sized value whose address aliases the object header, which it reports as a race).
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
