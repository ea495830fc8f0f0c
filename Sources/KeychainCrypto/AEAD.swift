import CSodium
public import KeychainCore
public import KeychainSystem
import Synchronization

/// The authenticated encryption an item's row is sealed with. Every box is `nonce ‖ ciphertext ‖
/// tag (16)` with a fresh random nonce; the construction of a row is told by its sealed item key
/// (`init(sealedItemKey:)`), and the row's attributes and secret are sealed the same way.
///
/// - `xchacha20Poly1305`: XChaCha20-Poly1305-IETF, 24-byte nonces. Every row written before AES-256-GCM
///   was adopted, and every row written on a CPU without AES-NI; its sealed item key is the bare box
///   (72 bytes).
/// - `aes256GCM`: AES-256-GCM (as Apple's keychain seals items), 12-byte random nonces; its sealed
///   item key is one tag byte (`2`) before the box (61 bytes). New rows use it whenever the CPU has
///   AES-NI and PCLMUL, where libsodium runs it: an open costs about 0.2 µs against 0.55 µs for
///   XChaCha20's, which must first derive a subkey (HChaCha20). Elsewhere such rows (a data directory
///   moved from another machine) are opened with libgcrypt (`Gcrypt`). A random 96-bit nonce repeats
///   with probability about n²/2⁹⁷ after n seals under one key; a class key seals one item key per
///   write, so even 2³² writes under one class key leave that below 2⁻³².
public enum ItemSealing: UInt8, Sendable, CaseIterable {
    case xchacha20Poly1305 = 1
    case aes256GCM = 2

    /// What new rows are sealed with on this machine: AES-256-GCM when libsodium runs it (AES-NI),
    /// XChaCha20-Poly1305 otherwise (constant-time in software, unlike table-based AES).
    public static let preferred: ItemSealing = AEAD.machineGCMEngine == .libsodium ? .aes256GCM : .xchacha20Poly1305

    /// The construction of a row, from its sealed item key's layout; nil for a layout none has
    /// (a damaged row).
    public init?(sealedItemKey sealed: [UInt8]) {
        guard let sealing = sealed.withUnsafeBytes({ ItemSealing(sealedItemKey: $0) }) else { return nil }
        self = sealing
    }

    /// The same from the sealed item key's bytes in place (a row's columns, read without copies).
    public init?(sealedItemKey sealed: UnsafeRawBufferPointer) {
        if sealed.count == ItemSealing.xchacha20Poly1305.sealedKeyBytes {
            self = .xchacha20Poly1305
        } else if sealed.count == ItemSealing.aes256GCM.sealedKeyBytes, sealed.first == ItemSealing.aes256GCM.rawValue {
            self = .aes256GCM
        } else {
            return nil
        }
    }

    /// Length of the random nonce at the front of a box (24 or 12).
    public var nonceBytes: Int { self == .xchacha20Poly1305 ? 24 : 12 }
    /// Bytes a box adds to its plaintext.
    public var overhead: Int { nonceBytes + AEAD.tagBytes }
    /// Bytes before the box in a sealed item key: the construction's tag byte, none for XChaCha20.
    @usableFromInline var keyPrefixBytes: Int { self == .xchacha20Poly1305 ? 0 : 1 }
    /// Length of a sealed 32-byte item key.
    public var sealedKeyBytes: Int { keyPrefixBytes + AEAD.keyBytes + overhead }
    /// Its name in messages.
    public var name: String { self == .xchacha20Poly1305 ? "XChaCha20-Poly1305" : "AES-256-GCM" }
}

/// Authenticated encryption with associated data: XChaCha20-Poly1305-IETF unless told otherwise
/// (`ItemSealing`). A sealed box is `nonce ‖ ciphertext ‖ tag (16)`, with a fresh random nonce each
/// time (192-bit nonces are safe to pick at random; see `ItemSealing` for the 96-bit ones).
public enum AEAD {
    /// Length of a key in bytes (32).
    public static let keyBytes = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    /// Length of the random nonce at the front of an XChaCha20-Poly1305 box (24).
    public static let nonceBytes = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    /// Length of the Poly1305 or GCM tag at the end of a sealed box (16).
    public static let tagBytes = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes an XChaCha20-Poly1305 box adds to its plaintext.
    public static let overhead = nonceBytes + tagBytes

    /// Which library runs AES-256-GCM here: libsodium where the CPU has AES-NI and PCLMUL, libgcrypt
    /// everywhere else (only to open rows sealed on another machine, and in tests).
    enum GCMEngine { case libsodium, libgcrypt }
    static let machineGCMEngine: GCMEngine = {
        Sodium.ensureInitialized()
        return crypto_aead_aes256gcm_is_available() == 1 ? .libsodium : .libgcrypt
    }()

    /// The engine in use: the machine's, unless a test has asked for libgcrypt everywhere
    /// (`withLibgcryptForGCM`). The two produce and accept the same bytes, so code running meanwhile
    /// on other threads is unaffected.
    static var gcmEngine: GCMEngine {
        libgcryptOverrides.load(ordering: .relaxed) > 0 ? .libgcrypt : machineGCMEngine
    }
    private static let libgcryptOverrides = Atomic<Int>(0)

    /// Runs `body` with AES-256-GCM going through libgcrypt, as on a machine without AES-NI (tests
    /// of the whole item path on machines that have it).
    static func withLibgcryptForGCM<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        libgcryptOverrides.add(1, ordering: .relaxed)
        defer { libgcryptOverrides.subtract(1, ordering: .relaxed) }
        return try body()
    }

    /// Seals one box (`decrypting` false: `input` is `count` bytes of plaintext, `output` receives
    /// ciphertext ‖ tag) or opens one (`input` is ciphertext ‖ tag, `output` receives the `count` bytes
    /// of plaintext) under `nonce`; false when the box does not authenticate. A library that cannot
    /// run at all (libgcrypt out of secure memory, or refusing in FIPS mode) is errSecInternal, never
    /// taken for a damaged box.
    private static func crypt(
        _ decrypting: Bool, _ sealing: ItemSealing, _ output: UnsafeMutablePointer<UInt8>,
        _ input: UnsafePointer<UInt8>?, _ count: Int, _ ad: UnsafeRawBufferPointer, _ nonce: UnsafePointer<UInt8>,
        _ key: UnsafeRawBufferPointer, _ engine: GCMEngine, prepared: PreparedGCMKey? = nil
    ) throws(KeychainError) -> Bool {
        let a = ad.baseAddress?.assumingMemoryBound(to: UInt8.self)
        let adCount = UInt64(ad.count)
        let k = key.baseAddress!.assumingMemoryBound(to: UInt8.self)
        var written: UInt64 = 0
        let rc: Int32
        switch (sealing, engine, decrypting) {
        case (.aes256GCM, .libgcrypt, true):
            return try Gcrypt.aes256GCMOpen(
                output, box: input!, count, tag: input! + count, ad: ad, nonce: nonce, key: key)
        case (.aes256GCM, .libgcrypt, false):
            try Gcrypt.aes256GCMSeal(output, input, count, tag: output + count, ad: ad, nonce: nonce, key: key)
            return true
        case (.aes256GCM, .libsodium, false):
            rc = crypto_aead_aes256gcm_encrypt(output, &written, input, UInt64(count), a, adCount, nil, nonce, k)
        case (.aes256GCM, .libsodium, true):
            if let prepared { return prepared.open(output, input!, count, ad, nonce) }
            rc = crypto_aead_aes256gcm_decrypt(
                output, &written, nil, input!, UInt64(count + tagBytes), a, adCount, nonce, k)
        case (.xchacha20Poly1305, _, false):
            rc = crypto_aead_xchacha20poly1305_ietf_encrypt(
                output, &written, input, UInt64(count), a, adCount, nil, nonce, k)
        case (.xchacha20Poly1305, _, true):
            rc = crypto_aead_xchacha20poly1305_ietf_decrypt(
                output, &written, nil, input!, UInt64(count + tagBytes), a, adCount, nonce, k)
        }
        return rc == 0 && Int(written) == (decrypting ? count : count + tagBytes)
    }

    /// Seals `plaintext` under `key` (32 bytes) with XChaCha20-Poly1305, authenticating `ad` too (the
    /// keyring's and the registrations' boxes; libsodium cannot fail here).
    public static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer
    ) -> [UInt8] {
        do throws(KeychainError) {
            return try seal(plaintext, key: key, ad: ad, sealing: .xchacha20Poly1305, engine: gcmEngine)
        } catch {
            preconditionFailure("XChaCha20-Poly1305 encryption failed")
        }
    }

    /// Seals `plaintext` under `key` with XChaCha20-Poly1305 and a fresh random nonce.
    public static func seal(_ plaintext: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer)
        -> [UInt8]
    {
        plaintext.withUnsafeBytes { seal($0, key: key, ad: ad) }
    }

    /// Seals `plaintext` with the construction `sealing` (an item's parts). errSecInternal when the
    /// library running it refuses (libgcrypt's AES-256-GCM, which only runs where libsodium cannot).
    public static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        sealing: ItemSealing
    ) throws(KeychainError) -> [UInt8] {
        try seal(plaintext, key: key, ad: ad, sealing: sealing, engine: gcmEngine)
    }

    /// `seal` with AES-256-GCM run by `engine` (tests compare the two libraries).
    static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer,
        ad: UnsafeRawBufferPointer, sealing: ItemSealing, engine: GCMEngine
    ) throws(KeychainError) -> [UInt8] {
        precondition(key.count == keyBytes, "AEAD key must be \(keyBytes) bytes")
        Sodium.ensureInitialized()
        let nonceBytes = sealing.nonceBytes
        var out = [UInt8](repeating: 0, count: nonceBytes + plaintext.count + tagBytes)
        let ok = try withMutableBytes(&out) { (o) throws(KeychainError) -> Bool in
            let base = o.baseAddress!.assumingMemoryBound(to: UInt8.self)
            randombytes_buf(base, nonceBytes)
            return try crypt(
                false, sealing, base + nonceBytes, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self),
                plaintext.count, ad, base, key, engine)
        }
        precondition(ok, "AEAD encryption failed")
        return out
    }

    /// Seals a 32-byte item key as a row keeps it: `sealing`'s tag byte (none for XChaCha20), then
    /// the box (`ItemSealing.init(sealedItemKey:)` reads the construction back from it).
    public static func sealKey(
        _ itemKey: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        sealing: ItemSealing
    ) throws(KeychainError) -> [UInt8] {
        precondition(itemKey.count == keyBytes, "an item key must be \(keyBytes) bytes")
        let box = try seal(itemKey, key: key, ad: ad, sealing: sealing)
        return sealing.keyPrefixBytes == 0 ? box : [sealing.rawValue] + box
    }

    /// Opens a sealed box into `output` (exactly `sealed.count - overhead` bytes). A wrong key, wrong
    /// associated data or any modified byte is `errSecDecode`; a library that cannot run (libgcrypt
    /// out of memory) is errSecInternal; `output` is zeroed either way. `prepared`, when given, must be
    /// `key`'s schedule: AES-256-GCM boxes are then opened with it where libsodium runs them.
    public static func open(
        _ sealed: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer,
        ad: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
        what: StaticString, sealing: ItemSealing = .xchacha20Poly1305, prepared: PreparedGCMKey? = nil
    ) throws(KeychainError) {
        try open(
            sealed, key: key, ad: ad, into: output, what: what, sealing: sealing, engine: gcmEngine, prepared: prepared)
    }

    /// `open` with AES-256-GCM run by `engine` (tests compare the two libraries), and by `prepared`
    /// (`key`'s schedule) when libsodium runs it.
    static func open(
        _ sealed: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer,
        ad: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
        what: StaticString, sealing: ItemSealing, engine: GCMEngine, prepared: PreparedGCMKey? = nil
    ) throws(KeychainError) {
        precondition(key.count == keyBytes, "AEAD key must be \(keyBytes) bytes")
        let nonceBytes = sealing.nonceBytes
        guard sealed.count >= sealing.overhead, output.count == sealed.count - sealing.overhead else {
            throw KeychainError(.decode, "\(what) is damaged (wrong length)")
        }
        Sodium.ensureInitialized()
        let base = sealed.baseAddress!.assumingMemoryBound(to: UInt8.self)
        // An empty plaintext still needs a valid pointer for libsodium.
        var dummy: UInt8 = 0
        let ok: Bool
        do throws(KeychainError) {
            ok = try withUnsafeMutablePointer(to: &dummy) { (dummyPointer) throws(KeychainError) -> Bool in
                try crypt(
                    true, sealing, output.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? dummyPointer,
                    base + nonceBytes, output.count, ad, base, key, engine, prepared: prepared)
            }
        } catch {
            Sodium.zero(output)
            throw error
        }
        guard ok else {
            Sodium.zero(output)
            throw KeychainError(
                .decode, "\(what) failed authentication (damaged, tampered with, or moved from another item)")
        }
    }

    /// Opens a sealed box into a new array.
    public static func open(
        _ sealed: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString, sealing: ItemSealing = .xchacha20Poly1305
    ) throws(KeychainError) -> [UInt8] {
        try withBytes(sealed) { (s) throws(KeychainError) in try open(s, key: key, ad: ad, what: what, sealing: sealing)
        }
    }

    /// Opens a sealed box, given in place, into a new array.
    public static func open(
        _ sealed: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString, sealing: ItemSealing = .xchacha20Poly1305
    ) throws(KeychainError) -> [UInt8] {
        guard sealed.count >= sealing.overhead else { throw KeychainError(.decode, "\(what) is damaged (too short)") }
        var out = [UInt8](repeating: 0, count: sealed.count - sealing.overhead)
        try withMutableBytes(&out) { (o) throws(KeychainError) in
            try open(sealed, key: key, ad: ad, into: o, what: what, sealing: sealing)
        }
        return out
    }

    /// Opens a sealed box into wiping storage (an item's secret).
    public static func openSecret(
        _ sealed: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString, sealing: ItemSealing = .xchacha20Poly1305
    ) throws(KeychainError) -> SecretBytes {
        try withBytes(sealed) { (s) throws(KeychainError) in
            try openSecret(s, key: key, ad: ad, what: what, sealing: sealing)
        }
    }

    /// Opens a sealed box, given in place, into wiping storage.
    public static func openSecret(
        _ sealed: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString, sealing: ItemSealing = .xchacha20Poly1305
    ) throws(KeychainError) -> SecretBytes {
        guard sealed.count >= sealing.overhead else { throw KeychainError(.decode, "\(what) is damaged (too short)") }
        var out = SecretBytes(count: sealed.count - sealing.overhead)
        try out.withUnsafeMutableBytes { (o) throws(KeychainError) in
            try open(sealed, key: key, ad: ad, into: o, what: what, sealing: sealing)
        }
        return out
    }

    /// Opens a sealed item key (as `sealKey` writes it, of the construction `sealing`) into a stack
    /// buffer, runs `body` with it and zeroes it afterwards. No heap allocation: this is the per-item
    /// key path of every read.
    @inlinable
    public static func withOpenedKey<R>(
        _ sealed: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer, what: StaticString,
        sealing: ItemSealing = .xchacha20Poly1305,
        _ body: (UnsafeRawBufferPointer) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        try withBytes(sealed) { (s) throws(KeychainError) in
            try withOpenedKey(s, key: key, ad: ad, what: what, sealing: sealing, body)
        }
    }

    /// The same with the sealed item key given in place (a row's column, read without a copy), and
    /// `key`'s schedule when the vault has one (`prepared`).
    @inlinable
    public static func withOpenedKey<R>(
        _ sealed: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString, sealing: ItemSealing = .xchacha20Poly1305, prepared: PreparedGCMKey? = nil,
        _ body: (UnsafeRawBufferPointer) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        guard sealed.count == sealing.sealedKeyBytes, sealing.keyPrefixBytes == 0 || sealed[0] == sealing.rawValue
        else {
            throw KeychainError(.decode, "\(what) is damaged (wrong length)")
        }
        return try withUnsafeTemporaryAllocation(byteCount: keyBytes, alignment: 16) {
            (buffer) throws(KeychainError) -> R in
            defer { Sodium.zero(buffer) }
            let box = UnsafeRawBufferPointer(rebasing: sealed[sealing.keyPrefixBytes...])
            try open(box, key: key, ad: ad, into: buffer, what: what, sealing: sealing, prepared: prepared)
            return try body(UnsafeRawBufferPointer(buffer))
        }
    }
}
