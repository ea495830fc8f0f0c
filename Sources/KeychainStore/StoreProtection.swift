import KeychainCore

/// Store calls of the protection work (passphrase, unlock counter): kept apart from the item write
/// path in ItemStore.swift. All of them run inside `ItemStore.write`, so they commit (or roll back)
/// together with whatever else that transaction does.
extension StoreWriter {
    /// Stores or replaces a meta value (`INSERT … ON CONFLICT DO UPDATE`).
    public func setMeta(_ name: String, _ value: [UInt8]) throws(KeychainError) {
        if let rows, name != RowState.metaName {
            if let old = try reader.meta(name) { rows.removed(MetaFingerprint(name: name, value: old)) }
            rows.added(MetaFingerprint(name: name, value: value))
        }
        try db.withStatement("INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value") {
            (s) throws(KeychainError) in
            try s.bind(1, text: name)
            try s.bind(2, value)
            try s.run()
        }
    }

    /// Removes a meta value (nothing happens when it does not exist).
    public func deleteMeta(_ name: String) throws(KeychainError) {
        if let rows, name != RowState.metaName, let old = try reader.meta(name) {
            rows.removed(MetaFingerprint(name: name, value: old))
        }
        try db.withStatement("DELETE FROM meta WHERE name = ?") { (s) throws(KeychainError) in
            try s.bind(1, text: name)
            try s.run()
        }
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
        for row in going { rows.removed(row) }
        return deleted
    }
}
