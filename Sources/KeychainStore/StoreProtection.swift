import KeychainCore

/// Store calls of the protection work (passphrase, unlock counter): kept apart from the item write
/// path in ItemStore.swift. All of them run inside `ItemStore.write`, so they commit (or roll back)
/// together with whatever else that transaction does.
extension StoreWriter {
    /// Stores or replaces a meta value (`INSERT … ON CONFLICT DO UPDATE`).
    public func setMeta(_ name: String, _ value: [UInt8]) throws(KeychainError) {
        let tracked = name != RowState.metaName ? rows : nil
        let old = tracked == nil ? nil : try reader.meta(name)
        try db.withStatement("INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value") {
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

    /// Deletes every item of one accessibility class; returns how many rows went.
    @discardableResult
    public func deleteItems(protectionClass: UInt8) throws(KeychainError) -> Int {
        let rows = try tracker()
        let going = try reader.fingerprints(protectionClass: protectionClass)
        let deleted = try db.withStatement("DELETE FROM items WHERE class = ?") { (s) throws(KeychainError) in
            try s.bind(1, Int64(protectionClass))
            try s.run()
            return db.changes
        }
        for row in going {
            rows.removed(row)
            try removeAttributeIndexes(ref: row.ref)
        }
        return deleted
    }
}
