package import KeychainCore
package import KeychainCrypto
package import KeychainStore
package import KeychainSystem

/// An item after opening its row: the decrypted attributes (and the secret when it was asked for).
package struct OpenedItem {
    package var row: StoredItem
    package var protection: ProtectionClass
    /// Wire key → stored value: every attribute set, plus agrp, pdmn, sync, svce, acct, cdat, mdat.
    package var attributes: [String: Value]
    /// Opened into wiping storage: zeroed when the last copy goes.
    package var secret: SecretBytes?
}

/// Seals items into rows and opens rows into items.
///
/// Each row has its own random 32-byte item key, sealed by its class key; the attributes (CBOR map)
/// and the secret are sealed separately by the item key, so attribute-only reads never open the
/// secret. Every ciphertext's associated data is the row's identity — its persistent-ref id, its class
/// and which part it is — so a part moved into another row, or a changed class column, fails to open
/// (errSecDecode) instead of yielding another item's data.
///
/// New rows are sealed with `sealing` (AES-256-GCM where the CPU runs it); a row is opened with the
/// construction its sealed item key names, so rows written before, or on another CPU, keep opening.
package struct ItemCodec: Sendable {
    let vault: Vault
    var sealing: ItemSealing = .preferred

    enum Part: UInt8 {
        case itemKey = 0x4B
        case attributes = 0x41
        case secret = 0x53
    }  // 'K' 'A' 'S'

    /// The associated data of one part of a row. The item key's also covers the uniqueness digest
    /// (`key_ix`), so unwrapping it proves the row's (agrp, svce, acct, sync) digest is the one sealed:
    /// point lookups that ask for no attributes can then skip opening them. It starts with the format
    /// version: "kc1" for rows sealed with XChaCha20-Poly1305, "kc2" for AES-256-GCM, so a class key's
    /// boxes of one construction are never valid input to the other.
    static func associatedData(
        ref: [UInt8], column: UInt8, part: Part, uniqueIndex: [UInt8] = [], sealing: ItemSealing
    ) -> [UInt8] {
        var ad: [UInt8] = [0x6B, 0x63, version(sealing)]
        ad.reserveCapacity(3 + ref.count + 2 + uniqueIndex.count)
        ad.append(contentsOf: ref)
        ad.append(column)
        ad.append(part.rawValue)
        if part == .itemKey { ad.append(contentsOf: uniqueIndex) }
        return ad
    }

    /// The last byte of "kc1" / "kc2".
    private static func version(_ sealing: ItemSealing) -> UInt8 { sealing == .xchacha20Poly1305 ? 0x31 : 0x32 }

    /// `associatedData` built on the stack for `body` (the same bytes, no heap allocation), from a
    /// row's columns in place: the read path opens two boxes per item.
    static func withAssociatedData<R>(
        ref: UnsafeRawBufferPointer, column: UInt8, part: Part,
        uniqueIndex: UnsafeRawBufferPointer = UnsafeRawBufferPointer(start: nil, count: 0), sealing: ItemSealing,
        _ body: (UnsafeRawBufferPointer) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        let tail = part == .itemKey ? uniqueIndex.count : 0
        let size = 3 + ref.count + 2 + tail
        return try withUnsafeTemporaryAllocation(byteCount: size, alignment: 1) { (buffer) throws(KeychainError) -> R in
            buffer[0] = 0x6B
            buffer[1] = 0x63
            buffer[2] = version(sealing)  // "kc1" / "kc2": format version
            UnsafeMutableRawBufferPointer(rebasing: buffer[3..<3 + ref.count]).copyMemory(from: ref)
            buffer[3 + ref.count] = column
            buffer[4 + ref.count] = part.rawValue
            if tail > 0 {
                UnsafeMutableRawBufferPointer(rebasing: buffer[(5 + ref.count)...]).copyMemory(from: uniqueIndex)
            }
            return try body(UnsafeRawBufferPointer(buffer))
        }
    }

    // MARK: Opening

    /// Opens a row: the attributes always, the secret when `withSecret`. A locked class is
    /// errSecInteractionNotAllowed; anything damaged or moved is errSecDecode.
    /// `classKey` opens the item key instead of the vault's key of its class (a key change opens the
    /// rows with the keys from before it).
    package func open(
        _ row: StoredItem, withSecret: Bool, withAttributes: Bool = true,
        classKey: ((ProtectionClass) -> SecureBytes?)? = nil
    ) throws(KeychainError) -> OpenedItem {
        let protectionClass = row.protectionClass
        // The columns in place: a row's getters copy, and every row a read finds is opened.
        let opened = try row.withSealedColumns { (c) throws(KeychainError) in
            try open(
                c, protectionClass: protectionClass, withSecret: withSecret, withAttributes: withAttributes,
                classKey: classKey)
        }
        return OpenedItem(
            row: row, protection: opened.protection, attributes: opened.attributes, secret: opened.secret)
    }

    /// `open` of a row given as its class and sealed columns in place (a key-only read opens them
    /// straight from the store, without a row): the same checks, in the same order.
    package func open(
        _ c: StoredItem.SealedColumns, protectionClass: UInt8, withSecret: Bool, withAttributes: Bool,
        classKey: ((ProtectionClass) -> SecureBytes?)? = nil
    ) throws(KeychainError) -> (protection: ProtectionClass, attributes: [String: Value], secret: SecretBytes?) {
        // The secret comes back beside the attributes (a variable set from inside the closures would
        // cost a runtime exclusivity check on every open).
        typealias Opened = (protection: ProtectionClass, attributes: [String: Value], secret: SecretBytes?)
        func opened(_ protection: ProtectionClass, _ ik: UnsafeRawBufferPointer, _ sealing: ItemSealing)
            throws(KeychainError) -> Opened
        {
            let attributes =
                withAttributes
                ? try openAttributes(c, protection: protection, column: protectionClass, itemKey: ik, sealing: sealing)
                : [:]
            guard withSecret else { return (protection, attributes, nil) }
            let secret = try Self.withAssociatedData(
                ref: c.ref, column: protectionClass, part: .secret, sealing: sealing
            ) { (sad) throws(KeychainError) in
                try AEAD.openSecret(c.secret, key: ik, ad: sad, what: "item secret", sealing: sealing)
            }
            return (protection, attributes, secret)
        }
        if let classKey { return try withItemKey(c, protectionClass: protectionClass, classKey: classKey, opened) }
        return try withItemKey(c, protectionClass: protectionClass, opened)
    }

    /// Opens only the secret of a row given in place, straight into the place `place` gives it (a
    /// copy that returns nothing but the data is answered with a frame whose byte string is opened
    /// where it lies: the plaintext is written once, into the answer's wiping storage). The same
    /// checks as `open`, in the same order; `place` is called once, with the secret's length, after
    /// the row's checks have passed and its item key has opened. A row with the presence bit (an
    /// item whose access control needs the person) is `ItemService.presenceNeeded`: this path has
    /// no grant.
    func openSecret(
        _ c: StoredItem.SealedColumns, protectionClass: UInt8, into place: ItemService.DataPlacement
    ) throws(KeychainError) {
        try withItemKey(c, protectionClass: protectionClass, refusingPresence: true) {
            (protection, ik, sealing) throws(KeychainError) in
            guard c.secret.count >= sealing.overhead else {
                throw KeychainError(.decode, "item secret is damaged (too short)")
            }
            try place(c.secret.count - sealing.overhead) { (plain) throws(KeychainError) in
                try Self.withAssociatedData(ref: c.ref, column: protectionClass, part: .secret, sealing: sealing) {
                    (sad) throws(KeychainError) in
                    try AEAD.open(c.secret, key: ik, ad: sad, into: plain, what: "item secret", sealing: sealing)
                }
            }
        }
    }

    /// The checks every open makes (class, id, item-key layout), then `body` with the item key opened
    /// into a stack buffer (zeroed afterwards), by the vault's key of the item's class. A locked
    /// class is errSecInteractionNotAllowed. `refusingPresence`: a row with the presence bit is
    /// `ItemService.presenceNeeded` (found by the class check every row passes, so the others pay
    /// nothing for it).
    @inline(__always)
    private func withItemKey<R>(
        _ c: StoredItem.SealedColumns, protectionClass: UInt8, refusingPresence: Bool = false,
        _ body: (ProtectionClass, UnsafeRawBufferPointer, ItemSealing) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        let (protection, sealing) = try Self.checked(
            c, protectionClass: protectionClass, refusingPresence: refusingPresence)
        let classKey = try vault.openingKey(protection)
        return try Self.withItemKey(c, column: protectionClass, protection, sealing, classKey, body)
    }

    /// `withItemKey` by the class key `given` returns instead of the vault's (a key change opens the
    /// rows with the keys from before it). Kept apart so that every read's path carries no closure.
    private func withItemKey<R>(
        _ c: StoredItem.SealedColumns, protectionClass: UInt8, classKey given: (ProtectionClass) -> SecureBytes?,
        _ body: (ProtectionClass, UnsafeRawBufferPointer, ItemSealing) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        let (protection, sealing) = try Self.checked(c, protectionClass: protectionClass, refusingPresence: false)
        guard let key = given(protection) else {
            throw KeychainError(.internal, "no \(protection.code) class key to open an item with")
        }
        return try Self.withItemKey(
            c, column: protectionClass, protection, sealing, Vault.OpeningKey(key: key, prepared: nil), body)
    }

    /// The class (from the class column, presence bit and all), id and item-key layout of a row,
    /// checked.
    @inline(__always)
    private static func checked(_ c: StoredItem.SealedColumns, protectionClass: UInt8, refusingPresence: Bool)
        throws(KeychainError) -> (ProtectionClass, ItemSealing)
    {
        let known =
            refusingPresence ? ProtectionClass(rawValue: protectionClass) : ProtectionClass(column: protectionClass)
        guard let protection = known else {
            if refusingPresence && ProtectionClass(column: protectionClass) != nil {
                try ItemService.refuseWithoutPresence()
            }
            throw KeychainError(.decode, "an item in the database is damaged (unknown class or id)")
        }
        guard c.ref.count == PersistentRef.idLength else {
            throw KeychainError(.decode, "an item in the database is damaged (unknown class or id)")
        }
        guard let sealing = ItemSealing(sealedItemKey: c.wrappedKey) else {
            throw KeychainError(.decode, "an item in the database is damaged (its item key has no known layout)")
        }
        return (protection, sealing)
    }

    @inline(__always)
    private static func withItemKey<R>(
        _ c: StoredItem.SealedColumns, column: UInt8, _ protection: ProtectionClass, _ sealing: ItemSealing,
        _ classKey: Vault.OpeningKey,
        _ body: (ProtectionClass, UnsafeRawBufferPointer, ItemSealing) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        try classKey.key.withUnsafeBytes { (ck) throws(KeychainError) -> R in
            try withAssociatedData(
                ref: c.ref, column: column, part: .itemKey, uniqueIndex: c.uniqueIndex, sealing: sealing
            ) { (kad) throws(KeychainError) -> R in
                try AEAD.withOpenedKey(
                    c.wrappedKey, key: ck, ad: kad, what: "item key", sealing: sealing, prepared: classKey.prepared
                ) { (ik) throws(KeychainError) -> R in try body(protection, ik, sealing) }
            }
        }
    }

    private func openAttributes(
        _ row: StoredItem.SealedColumns, protection: ProtectionClass, column: UInt8,
        itemKey: UnsafeRawBufferPointer, sealing: ItemSealing
    ) throws(KeychainError) -> [String: Value] {
        var plain = try Self.withAssociatedData(
            ref: row.ref, column: column, part: .attributes, sealing: sealing
        ) { (aad) throws(KeychainError) in
            try AEAD.open(row.attributes, key: itemKey, ad: aad, what: "item attributes", sealing: sealing)
        }
        defer { Sodium.zero(&plain) }
        let decoded: Value
        do { decoded = try CBOR.decode(plain) } catch {
            throw KeychainError(.decode, "an item's attributes are damaged")
        }
        guard case .map(let map) = decoded, map["pdmn"] == .text(protection.code),
            case .text = map["agrp"], case .bool = map["sync"], case .date = map["cdat"], case .date = map["mdat"],
            // A row with the presence bit carries its access control (no lookup for the others).
            column & ProtectionClass.presenceBit == 0 || map[AccessControl.key] != nil,
            let itemClass = Self.itemClass(of: map),
            itemClass.defaults.keys.allSatisfy({ map[$0] != nil })
        else {
            throw KeychainError(.decode, "an item's attributes are damaged (required attributes missing)")
        }
        return map
    }

    // MARK: Sealing

    /// A row for `attributes` and `secret` under `protection`, sealed under a fresh random item key —
    /// for every write, updates included, so a row written after a passphrase change shares no key
    /// with any older version of itself. `classKey` is the key of `protection` to wrap it with
    /// (nil: the vault's current one).
    package func seal(
        ref: [UInt8], protection: ProtectionClass, attributes: [String: Value], secret: SecretBytes,
        rowid: Int64 = 0, classKey given: SecureBytes? = nil, indexer givenIndexer: BlindIndexer? = nil
    ) throws(KeychainError) -> StoredItem {
        let classKey: SecureBytes
        if let given { classKey = given } else { classKey = try vault.classKey(protection) }
        let indexer: BlindIndexer
        if let givenIndexer { indexer = givenIndexer } else { indexer = try vault.indexer() }
        var plain = CBOR.encode(.map(attributes))
        defer { Sodium.zero(&plain) }
        let index = indexes(for: attributes, indexer)
        // The class column: the class, with the presence bit for an item whose access control asks
        // for the person (bound into every part's associated data, as the class is).
        let column = protection.rawValue | (attributes[AccessControl.key] != nil ? ProtectionClass.presenceBit : 0)
        let parts = try withUnsafeTemporaryAllocation(byteCount: AEAD.keyBytes, alignment: 16) {
            (buffer) throws(KeychainError) -> (wrapped: [UInt8], attributes: [UInt8], secret: [UInt8]) in
            defer { Sodium.zero(buffer) }
            Sodium.randomFill(buffer)
            let ik = UnsafeRawBufferPointer(buffer)
            let keyAD = Self.associatedData(
                ref: ref, column: column, part: .itemKey, uniqueIndex: index.unique, sealing: sealing)
            let wrapped = try classKey.withUnsafeBytes { (ck) throws(KeychainError) in
                try withBytes(keyAD) { (ad) throws(KeychainError) in
                    try AEAD.sealKey(ik, key: ck, ad: ad, sealing: sealing)
                }
            }
            let attributesAD = Self.associatedData(ref: ref, column: column, part: .attributes, sealing: sealing)
            let sealedAttributes = try withBytes(attributesAD) { (ad) throws(KeychainError) in
                try withBytes(plain) { (p) throws(KeychainError) in
                    try AEAD.seal(p, key: ik, ad: ad, sealing: sealing)
                }
            }
            let secretAD = Self.associatedData(ref: ref, column: column, part: .secret, sealing: sealing)
            let sealedSecret = try withBytes(secretAD) { (ad) throws(KeychainError) in
                try secret.withUnsafeBytes { (p) throws(KeychainError) in
                    try AEAD.seal(p, key: ik, ad: ad, sealing: sealing)
                }
            }
            return (wrapped: wrapped, attributes: sealedAttributes, secret: sealedSecret)
        }
        return StoredItem(
            rowid: rowid, ref: ref, protectionClass: column,
            accessGroupIndex: index.group, serviceIndex: index.service, accountIndex: index.account,
            uniqueIndex: index.unique, wrappedKey: parts.wrapped, attributes: parts.attributes,
            secret: parts.secret, attributeIndexes: SecretServiceFields.indexes(for: attributes, indexer))
    }

    /// The class of stored attributes: generic passwords carry no `class` entry (their rows are
    /// older than the other classes), every other class its code. Nil for a code no class has.
    static func itemClass(of attributes: [String: Value]) -> ItemClass? {
        guard let value = attributes["class"] else { return .genericPassword }
        guard case .text(let code) = value, code != ItemClass.genericPassword.code else { return nil }
        return ItemClass(code: code)
    }

    /// The blind-index columns of an item: the access group's, then the two its class indexes
    /// (ItemClass.indexed: service and account, or server and account), then its uniqueness key
    /// (ItemClass.uniqueness). Generic passwords' digests are the ones rows always had; another
    /// class's primary column and uniqueness key are hashed under domains of their own, so no
    /// digest of one class equals one of another and a query of one class never finds the other's rows.
    func indexes(for attributes: [String: Value], _ b: BlindIndexer) -> (
        group: [UInt8], service: [UInt8], account: [UInt8], unique: [UInt8]
    ) {
        let itemClass = Self.itemClass(of: attributes) ?? .genericPassword
        let group = attributes["agrp"].flatMap(Attribute.bytes(of:)) ?? []
        let account = attributes["acct"].flatMap(Attribute.bytes(of:)) ?? []
        let sync = attributes["sync"]?.bool ?? false
        guard itemClass == .internetPassword else {
            let service = attributes["svce"].flatMap(Attribute.bytes(of:)) ?? []
            return (
                b.column(.accessGroup, group), b.column(.service, service), b.column(.account, account),
                b.uniqueKey(accessGroup: group, service: service, account: account, synchronizable: sync)
            )
        }
        let server = attributes[itemClass.indexed.primary].flatMap(Attribute.bytes(of:)) ?? []
        return (
            b.column(.accessGroup, group), b.column(.server, server), b.column(.account, account),
            b.uniqueKey(domain: .internetUniqueKey, parts: Self.uniqueParts(itemClass, attributes))
        )
    }

    /// The parts of a uniqueness key other than generic passwords': each attribute of
    /// `itemClass.uniqueness` in order, as bytes (text as UTF-8, a number as its decimal digits, a
    /// flag as 0 or 1); an absent attribute is its default, as Apple's: empty, 0 for a number.
    static func uniqueParts(_ itemClass: ItemClass, _ attributes: [String: Value]) -> [[UInt8]] {
        itemClass.uniqueness.map { key in
            switch attributes[key] {
            case .text(let s): return Array(s.utf8)
            case .bytes(let b): return b
            case .int(let n): return Array(String(n).utf8)
            case .bool(let b): return [b ? 1 : 0]
            default:
                if key == "sync" { return [0] }
                return itemClass.attribute(key)?.type == .uint32 ? Array("0".utf8) : []
            }
        }
    }
}
