#if canImport(Glibc)
import Glibc
#endif

/// Keeps reads apart from the moment keys change (`ItemStore.writeAlone`): a read — its rows and the
/// keys it opens them with — runs under the shared side, and the commit of a key change plus putting
/// the new keys in force runs under the exclusive side. A read therefore sees old rows with old keys
/// or new rows with new keys, never a mix.
///
/// A `pthread_rwlock_t` that prefers writers (a steady stream of reads cannot hold a key change off
/// for ever). Not reentrant on the shared side: a thread holding it must not take it again, or it
/// deadlocks as soon as a writer waits. The lock lives on the heap (it must never move).
final class TransitionLock: @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

    init() {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        var attributes = pthread_rwlockattr_t()
        pthread_rwlockattr_init(&attributes)
        pthread_rwlockattr_setkind_np(&attributes, Int32(PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP))
        pthread_rwlock_init(lock, &attributes)
        pthread_rwlockattr_destroy(&attributes)
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deinitialize(count: 1)
        lock.deallocate()
    }

    func shared<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_rwlock_rdlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    func exclusive<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_rwlock_wrlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }
}
