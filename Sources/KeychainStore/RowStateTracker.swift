import KeychainCrypto

/// The row state as the writer sees it: what is committed, plus the changes of the open group
/// transaction and of the write running in it. Only touched with the `WriterGate` mutex held.
final class RowStateTracker {
    let key: SecureBytes
    private(set) var committed: RowState
    /// The generation kept outside the database (nil in stores opened without one).
    let mark: GenerationMark?

    private struct Delta {
        var count: Int64 = 0
        var sum = Sum256()
        var touched = false
    }
    private var group = Delta()
    private var body = Delta()

    init(key: SecureBytes, committed: RowState, mark: GenerationMark?) {
        self.key = key
        self.committed = committed
        self.mark = mark
    }

    func added(_ row: RowFingerprint) {
        body.count += 1
        body.sum = body.sum + row.value(key: key)
        body.touched = true
    }

    func removed(_ row: RowFingerprint) {
        body.count -= 1
        body.sum = body.sum - row.value(key: key)
        body.touched = true
    }

    /// `count` rows whose fingerprints add up to `sum` went (a bulk delete, summed while scanning).
    func removed(count: Int64, sum: Sum256) {
        body.count -= count
        body.sum = body.sum - sum
        body.touched = true
    }

    func added(_ meta: MetaFingerprint) {
        body.sum = body.sum + meta.value(key: key)
        body.touched = true
    }

    func removed(_ meta: MetaFingerprint) {
        body.sum = body.sum - meta.value(key: key)
        body.touched = true
    }

    func added(_ entry: AttributeIndexFingerprint) {
        body.sum = body.sum + entry.value(key: key)
        body.touched = true
    }

    func removed(_ entry: AttributeIndexFingerprint) {
        body.sum = body.sum - entry.value(key: key)
        body.touched = true
    }

    /// The running write was released into the group (its savepoint kept).
    func bodyKept() {
        if body.touched {
            group.count += body.count
            group.sum = group.sum + body.sum
            group.touched = true
        }
        body = Delta()
    }

    /// The running write was rolled back to its savepoint.
    func bodyDropped() { body = Delta() }

    /// The state the group's commit must record, or nil when the group changed no rows.
    var pending: RowState? {
        guard group.touched else { return nil }
        return RowState(
            count: committed.count + group.count, generation: committed.generation &+ 1,
            sum: committed.sum + group.sum)
    }

    /// The group committed: `pending` is now the committed state.
    func groupCommitted() {
        if let pending {
            committed = pending
            mark?.committed(pending.generation)
        }
        group = Delta()
        body = Delta()
    }

    /// The store is closing: the mark catches up with the last commit.
    func closing() { mark?.flush(committed.generation) }

    /// The group rolled back.
    func groupAbandoned() {
        group = Delta()
        body = Delta()
    }
}
