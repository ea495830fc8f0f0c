public import KeychainCore

/// Store calls of the protection work (passphrase, unlock counter): kept apart from the item write
/// path in ItemStore.swift. All of them run inside `ItemStore.write`, so they commit (or roll back)
/// together with whatever else that transaction does.
extension StoreWriter {
    /// Stores or replaces a meta value (`INSERT … ON CONFLICT DO UPDATE`).
    public func setMeta(_ name: String, _ value: [UInt8]) throws(KeychainError) {
        let tracked = name != RowState.metaName ? rows : nil
        let old = tracked == nil ? nil : try reader.meta(name)
        try db.withStatement(
            "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value"
        ) {
            (s) throws(KeychainError) in
            try s.bind(1, text: name)
            try s.bind(2, value)
            try s.run()
        }
        if let tracked {
            if let old { tracked.removed(MetaFingerprint(name: name, value: old)) }
            tracked.added(MetaFingerprint(name: name, value: value))
        }
    }

    /// Removes a meta value (nothing happens when it does not exist).
    public func deleteMeta(_ name: String) throws(KeychainError) {
        let tracked = name != RowState.metaName ? rows : nil
        let old = tracked == nil ? nil : try reader.meta(name)
        try db.withStatement("DELETE FROM meta WHERE name = ?") { (s) throws(KeychainError) in
            try s.bind(1, text: name)
            try s.run()
        }
        if let tracked, let old { tracked.removed(MetaFingerprint(name: name, value: old)) }
    }

    /// Deletes every item of one accessibility class (its rows with the presence bit too:
    /// `ProtectionClass.presenceBit`), with their Secret Service attribute-index entries; returns how
    /// many rows went.
    @discardableResult
    public func deleteItems(protectionClass: UInt8) throws(KeychainError) -> Int {
        let rows = try tracker()
        let going = try reader.fingerprintSum(protectionClass: protectionClass, key: rows.key)
        let refs = try db.withStatement("SELECT ref FROM items WHERE class & 127 = ?") {
            (s) throws(KeychainError) -> [[UInt8]] in
            try s.bind(1, Int64(protectionClass))
            var refs: [[UInt8]] = []
            while try s.step() { refs.append(s.blob(0)) }
            return refs
        }
        let deleted = try db.withStatement("DELETE FROM items WHERE class & 127 = ?") { (s) throws(KeychainError) in
            try s.bind(1, Int64(protectionClass))
            try s.run()
            return db.changes
        }
        rows.removed(count: going.count, sum: going.sum)
        for ref in refs { try removeAttributeIndexes(ref: ref) }
        return deleted
    }

    /// Rows handed to `rewrapItemKeys`' closure per batch.
    public static let rewrapBatchSize = 256

    /// Replaces the sealed item key of every row whose class is in `classes` with what `rewrap`
    /// returns for it (nil leaves that row as it is), reading `batchSize` rows at a time in rowid
    /// order, so memory stays flat however many items there are. Nothing else in a row changes; the
    /// row state follows each rewritten row (its item-key nonce, hence its fingerprint, is new).
    /// Runs inside the caller's transaction. Returns how many rows were rewritten.
    @discardableResult
    public func rewrapItemKeys(
        classes: [UInt8], batchSize: Int = StoreWriter.rewrapBatchSize,
        _ rewrap: (SealedItemKey) throws(KeychainError) -> [UInt8]?
    ) throws(KeychainError) -> Int {
        let rows = try tracker()
        guard !classes.isEmpty else { return 0 }
        let select = """
            SELECT rowid, item_key, \(RowFingerprint.columns) FROM items
            WHERE class IN (\(classes.map { String($0) }.joined(separator: ","))) AND rowid > ? ORDER BY rowid LIMIT ?
            """
        var after = Int64.min
        var rewritten = 0
        while true {
            var batch: [(rowid: Int64, sealed: [UInt8], before: RowFingerprint)] = []
            batch.reserveCapacity(batchSize)
            try db.withStatement(select) { (s) throws(KeychainError) in
                try s.bind(1, after)
                try s.bind(2, Int64(max(1, batchSize)))
                while try s.step() { batch.append((s.int64(0), s.blob(1), RowFingerprint(s, first: 2))) }
            }
            guard let last = batch.last else { break }
            for row in batch {
                let key = SealedItemKey(
                    ref: row.before.ref, protectionClass: UInt8(truncatingIfNeeded: row.before.protectionClass),
                    uniqueIndex: row.before.uniqueIndex, sealed: row.sealed)
                guard let replacement = try rewrap(key) else { continue }
                try db.withStatement("UPDATE items SET item_key = ? WHERE rowid = ?") { (s) throws(KeychainError) in
                    try s.bind(1, replacement)
                    try s.bind(2, row.rowid)
                    try s.run()
                }
                var changed = row.before
                changed.itemKeyNonce = Array(replacement.prefix(RowFingerprint.sealedPrefixBytes))
                rows.removed(row.before)
                rows.added(changed)
                rewritten += 1
            }
            after = last.rowid
        }
        return rewritten
    }
}

/// One row's sealed item key and what its associated data is made of (see `rewrapItemKeys`).
public struct SealedItemKey: Sendable {
    /// The row's persistent reference id, part of the sealed key's associated data.
    public let ref: [UInt8]
    /// The row's accessibility class (Apple's keybag number), whose class key sealed the item key.
    public let protectionClass: UInt8
    /// The row's uniqueness digest, part of the sealed key's associated data.
    public let uniqueIndex: [UInt8]
    /// The item key as sealed now, to be opened and sealed again under the new class key.
    public let sealed: [UInt8]
}
