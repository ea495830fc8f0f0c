public import KeychainCore

/// The Secret Service attribute index (`item_attributes`, schema version 2): one row per keyed digest
/// of an item's (name, value) attribute pairs, plus a mark on every item that has its own attributes.
/// The digests come from the blind-index key, like the item columns; nothing readable is stored.
///
/// Each entry counts in the row-state sum (`AttributeIndexFingerprint`), so entries removed, added or
/// moved to another item are a refusal to start like a changed item row. The item layer still checks
/// decrypted attributes against every search, so a forged entry can hide an item from a search at
/// most, never show another item's data.
extension StoreWriter {
    /// Writes `indexes` for the item `ref` (inside the item's own write).
    func addAttributeIndexes(ref: [UInt8], _ indexes: [[UInt8]]) throws(KeychainError) {
        guard !indexes.isEmpty else { return }
        let rows = try tracker()
        // Distinct by construction (the item layer de-duplicates); a repeat would be a constraint error.
        try db.withStatement("INSERT INTO item_attributes (ix, ref) VALUES (?, ?)") { (s) throws(KeychainError) in
            for ix in indexes {
                s.reset()
                try s.bind(1, ix)
                try s.bind(2, ref)
                try s.run()
            }
        }
        for ix in indexes { rows.added(AttributeIndexFingerprint(index: ix, ref: ref)) }
    }

    /// Removes every entry of the item `ref`.
    func removeAttributeIndexes(ref: [UInt8]) throws(KeychainError) {
        let rows = try tracker()
        let existing = try reader.attributeIndexes(ref: ref)
        guard !existing.isEmpty else { return }
        try db.withStatement("DELETE FROM item_attributes WHERE ref = ?") { (s) throws(KeychainError) in
            try s.bind(1, ref)
            try s.run()
        }
        for ix in existing { rows.removed(AttributeIndexFingerprint(index: ix, ref: ref)) }
    }
}

extension StoreReader {
    /// The attribute-index entries of the item `ref`.
    public func attributeIndexes(ref: [UInt8]) throws(KeychainError) -> [[UInt8]] {
        try db.withStatement("SELECT ix FROM item_attributes WHERE ref = ?") { (s) throws(KeychainError) in
            try s.bind(1, ref)
            var out: [[UInt8]] = []
            while try s.step() { out.append(s.blob(0)) }
            return out
        }
    }
}
