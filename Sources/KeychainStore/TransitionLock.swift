import KeychainSystem

/// Keeps reads apart from the moment keys change (`ItemStore.writeAlone`): a read — its rows and the
/// keys it opens them with — runs under the shared side, and the commit of a key change plus putting
/// the new keys in force runs under the exclusive side. A read therefore sees old rows with old keys
/// or new rows with new keys, never a mix.
///
/// A reader–writer lock that prefers writers (a steady stream of reads cannot hold a key change off
/// for ever). Not reentrant on the shared side: a thread holding it must not take it again, or it
/// deadlocks as soon as a writer waits.
final class TransitionLock: Sendable {
    private let lock = ReadWriteLock()

    func shared<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        try lock.shared(body)
    }

    func exclusive<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        try lock.exclusive(body)
    }
}
