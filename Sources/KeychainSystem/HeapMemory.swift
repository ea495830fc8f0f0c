internal import CSupport
import Synchronization

/// How freed memory goes back to the system. glibc keeps what a thread frees in that thread's arena,
/// and a heap with anything still in use above its free space is never shortened: large answers
/// built on many connections at once would leave the daemon at their peak after they are written or
/// their peers close. Large buffers are therefore mapped for themselves (unmapped when freed), and
/// the free space left in the arenas by what came with them (the database's pages read for them) is
/// given back once enough of it has been (`malloc_trim`).
public enum HeapMemory {
    /// Bytes of large buffers freed since the heap was last trimmed.
    private static let sinceTrim = Atomic<Int>(0)
    private static let trimming = Atomic<Bool>(false)
    /// How many bytes of large buffers are freed between two trims: a trim walks every arena, so
    /// it is paid for by this much copying of answers, not by each answer.
    public static let trimEvery = 4 << 20

    /// Maps allocations of `bytes` or more for themselves, unmapped when freed, and lets the top of
    /// a heap go back past `bytes` (`mallopt`); set once, the threshold no longer rises with the
    /// sizes freed as glibc's default does.
    public static func returnLargeAllocations(above bytes: Int) {
        kc_return_large_allocations(Int32(clamping: bytes))
    }

    /// Notes that a buffer of `bytes` (an answer of a large item) was freed; once `trimEvery` bytes
    /// have been, gives the arenas' free pages back to the system on this thread (unless another
    /// thread is doing it).
    public static func freed(_ bytes: Int) {
        guard sinceTrim.add(bytes, ordering: .relaxed).newValue >= trimEvery else { return }
        guard trimming.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else { return }
        sinceTrim.store(0, ordering: .relaxed)
        kc_malloc_trim()
        trimming.store(false, ordering: .releasing)
    }
}
