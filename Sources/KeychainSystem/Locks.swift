import Glibc

/// A mutex guarding a stretch of code, built on `pthread_mutex_t`.
///
/// keychaind uses this (and `Locked`) instead of `Synchronization.Mutex`: on Linux that type is built
/// on raw futex calls which ThreadSanitizer cannot see, so every access it guarded was reported as a
/// race and the sanitizer runs were noise. ThreadSanitizer intercepts `pthread_mutex_lock`, so with
/// these its reports are real. The mutex lives on the heap (it must never move) and is destroyed in
/// `deinit`.
public final class Lock: @unchecked Sendable {
    // Safety: the pthread mutex is the synchronisation; the pointer itself never changes.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    /// A new mutex, held by no one.
    public init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        let rc = pthread_mutex_init(mutex, nil)
        precondition(rc == 0, "pthread_mutex_init failed")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with the lock held (not reentrant). Inlinable, as are `Locked.withLock` and
    /// `ReadWriteLock`'s: called from another module, a generic function is not specialised, and its
    /// closure contexts, metadata and witness calls cost a few hundred instructions around the two
    /// calls into libc, several times in every request.
    @inlinable
    public func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }

    /// Takes the lock (pair with `unlock`; prefer `withLock`).
    public func lock() { pthread_mutex_lock(mutex) }

    /// Lets go of the lock taken with `lock`.
    public func unlock() { pthread_mutex_unlock(mutex) }

    /// Waits on `condition`, letting go of this lock meanwhile (it is held again on return). Call
    /// with the lock held, in a loop that re-checks what is waited for.
    public func wait(_ condition: Condition) {
        pthread_cond_wait(condition.condition, mutex)
    }
}

/// A condition variable used with a `Lock` (`Lock.wait`).
public final class Condition: @unchecked Sendable {
    // Safety: the pthread condition is the synchronisation; the pointer itself never changes.
    fileprivate let condition: UnsafeMutablePointer<pthread_cond_t>

    /// A new condition variable.
    public init() {
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        let rc = pthread_cond_init(condition, nil)
        precondition(rc == 0, "pthread_cond_init failed")
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deinitialize(count: 1)
        condition.deallocate()
    }

    /// Wakes every thread waiting on this condition.
    public func broadcast() { pthread_cond_broadcast(condition) }
}

/// A value that only one thread at a time may touch. (For a lock without a value use `Lock`:
/// `Locked<Void>` hands ThreadSanitizer a zero-sized value whose address aliases the object header,
/// which it reports as a race.)
///
/// Sendable only when the value is: a `Locked` must not become a way to share a value that is not
/// safe to hand to another thread.
public final class Locked<Value> {
    @usableFromInline let lock = Lock()
    /// The value, on the heap beside the object rather than a stored `var`: the mutex already makes
    /// every access exclusive, and a stored property would add the runtime's exclusivity check (an
    /// access record in thread-local storage, about 80 instructions) to every `withLock`, several
    /// times per request. A nested `withLock` on the same `Locked` deadlocks either way.
    @usableFromInline let storage: UnsafeMutablePointer<Value>

    /// A lock guarding `value`.
    public init(_ value: Value) {
        storage = .allocate(capacity: 1)
        storage.initialize(to: value)
    }

    deinit {
        storage.deinitialize(count: 1)
        storage.deallocate()
    }

    /// Runs `body` with the lock held. `body` must not call back into the same `Locked` (not reentrant).
    @inlinable
    public func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        try lock.withLock { () throws(E) -> R in try body(&storage.pointee) }
    }
}

// Safety: every access to the value goes through `withLock`, which holds the mutex.
extension Locked: @unchecked Sendable where Value: Sendable {}

/// A reader–writer lock (`pthread_rwlock_t`) that prefers writers, so a steady stream of readers
/// cannot hold a writer off for ever. Not reentrant on the shared side: a thread holding it must not
/// take it again, or it deadlocks as soon as a writer waits. Lives on the heap (it must never move).
public final class ReadWriteLock: @unchecked Sendable {
    // Safety: the pthread rwlock is the synchronisation; the pointer itself never changes.
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

    /// A new lock, held by no one.
    public init() {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        var attributes = pthread_rwlockattr_t()
        pthread_rwlockattr_init(&attributes)
        pthread_rwlockattr_setkind_np(&attributes, Int32(PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP))
        let rc = pthread_rwlock_init(lock, &attributes)
        pthread_rwlockattr_destroy(&attributes)
        precondition(rc == 0, "pthread_rwlock_init failed")
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deinitialize(count: 1)
        lock.deallocate()
    }

    /// Runs `body` holding the shared side.
    @inlinable
    public func shared<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lockShared()
        defer { unlock() }
        return try body()
    }

    /// Runs `body` holding the exclusive side.
    @inlinable
    public func exclusive<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lockExclusive()
        defer { unlock() }
        return try body()
    }

    @usableFromInline func lockShared() { pthread_rwlock_rdlock(lock) }
    @usableFromInline func lockExclusive() { pthread_rwlock_wrlock(lock) }
    @usableFromInline func unlock() { pthread_rwlock_unlock(lock) }
}

/// A one-shot hand-over of a value from one thread to another that waits for it (a POSIX semaphore).
public final class OneShot<Value: Sendable>: @unchecked Sendable {
    // Safety: `value` is written once before sem_post and read only after sem_wait returns: the
    // semaphore orders the two (and ThreadSanitizer sees it, as it intercepts sem_post/sem_wait).
    private let semaphore: UnsafeMutablePointer<sem_t>
    private var value: Value?

    /// An empty hand-over: `wait` blocks until `resume`.
    public init() {
        semaphore = .allocate(capacity: 1)
        semaphore.initialize(to: sem_t())
        sem_init(semaphore, 0, 0)
    }

    deinit {
        sem_destroy(semaphore)
        semaphore.deinitialize(count: 1)
        semaphore.deallocate()
    }

    /// Hands `value` over (once).
    public func resume(_ value: Value) {
        self.value = value
        sem_post(semaphore)
    }

    /// Blocks until `resume` has run, then returns its value.
    public func wait() -> Value {
        _ = try? valueOrErrno("sem_wait") { sem_wait(semaphore) }  // EINTR is retried there
        return value!
    }
}

private final class ThreadBody {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}

/// Threads without Foundation (so keychainctl stays light).
public enum Threads {
    /// Starts a detached POSIX thread with `stackSize` bytes of stack running `body`.
    public static func start(stackSize: Int = 256 * 1024, _ body: @escaping @Sendable () -> Void) throws(Errno) {
        let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
        var attr = pthread_attr_t()
        pthread_attr_init(&attr)
        pthread_attr_setdetachstate(&attr, Int32(PTHREAD_CREATE_DETACHED))
        pthread_attr_setstacksize(&attr, stackSize)
        var tid = pthread_t()
        let rc = pthread_create(
            &tid, &attr,
            { raw in
                let body = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
                body.run()
                return nil
            }, box)
        pthread_attr_destroy(&attr)
        if rc != 0 {
            Unmanaged<ThreadBody>.fromOpaque(box).release()
            throw Errno(rc, call: "pthread_create")
        }
    }
}
