public import KeychainCore
import Synchronization

/// Bytes the daemon holds for its peers, across all connections, against one limit
/// (`maxBufferedBytes`): partial request frames, answers of many items while they are built, and
/// every answer until it is written (a connection's output buffer past `AnswerLedger.freeOutputBytes`).
/// Many peers each sending most of a large frame, or each asking for a large answer and never
/// reading it, cannot grow the daemon without bound.
public final class BufferBudget: Sendable {
    /// The most bytes held at once (`maxBufferedBytes`).
    public let limit: Int
    private let used = Atomic<Int>(0)

    /// An empty budget of `limit` bytes.
    public init(limit: Int) { self.limit = limit }

    /// Takes `bytes` more (or gives back, when negative); false when that would pass the limit
    /// (nothing is taken then).
    public func adjust(by bytes: Int) -> Bool {
        // Most reads end on a frame boundary (nothing held before or after): no atomic write then,
        // so connections on different CPUs do not pass the counter's cache line back and forth.
        if bytes == 0 { return true }
        if bytes < 0 {
            used.subtract(-bytes, ordering: .relaxed)
            return true
        }
        let now = used.add(bytes, ordering: .relaxed).newValue
        if now > limit {
            used.subtract(bytes, ordering: .relaxed)
            return false
        }
        return true
    }

    /// The bytes held now (`status` reports them as `bufferedBytes`).
    public var inUse: Int { used.load(ordering: .relaxed) }
}

/// One connection's share of the budget taken for its answers: for answers of many items while a
/// `copy` collects its matches, then for the output buffer the answers are framed in, past its first
/// `freeOutputBytes`, until the connection has written them (or closes).
/// Used by the one thread that serves the connection.
public final class AnswerLedger {
    let budget: BufferBudget
    // Used by its connection's thread only: no runtime exclusivity checks (read after every write).
    @exclusivity(unchecked) private(set) var held = 0
    /// What the output buffer holds of the budget: its capacity past `freeOutputBytes`.
    @exclusivity(unchecked) private(set) var output = 0

    /// The bytes of a connection's output buffer that count against no budget: small answers (and a
    /// pipeline of them) never touch the shared counter. It is part of the fixed allowance per
    /// connection that docs/security.md states beside `maxBufferedBytes`.
    public static let freeOutputBytes = 16 * 1024

    /// A ledger holding nothing yet of `budget`.
    public init(budget: BufferBudget) { self.budget = budget }

    /// Takes `bytes` for an answer being built; errSecAllocate when the daemon holds too much.
    func take(_ bytes: Int) throws(KeychainError) {
        guard budget.adjust(by: bytes) else {
            throw KeychainError(
                .allocate,
                "the answer is too large for keychaind to hold now (\(budget.limit >> 20) MiB for all answers and partial requests, maxBufferedBytes): ask for fewer items (kSecMatchLimit) or for their attributes without their data"
            )
        }
        held += bytes
    }

    /// Counts an output buffer of `capacity` bytes, answers framed in it, in place of what their
    /// items were counted for while they were built (freed by now); false, with the buffer counted
    /// as before, when the daemon holds too much for it to grow.
    public func holdOutput(capacity: Int) -> Bool {
        if held != 0 {
            _ = budget.adjust(by: -held)
            held = 0
        }
        let wanted = Swift.max(0, capacity - Self.freeOutputBytes)
        guard budget.adjust(by: wanted - output) else { return false }
        output = wanted
        return true
    }

    /// The error for an answer the daemon cannot hold now.
    public var outputRefusal: KeychainError {
        KeychainError(
            .allocate,
            "keychaind holds too many answers that are not read yet to hold this one now (\(budget.limit >> 20) MiB for all answers and partial requests, maxBufferedBytes); try again once its clients read their answers, or ask for the attributes without the data"
        )
    }

    /// Gives back everything taken: the answers are written (or will never be).
    public func release() {
        if held + output == 0 { return }
        _ = budget.adjust(by: -(held + output))
        held = 0
        output = 0
    }

    deinit { release() }
}
