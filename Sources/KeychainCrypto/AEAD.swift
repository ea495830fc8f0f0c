import CSodium
public import KeychainCore
public import KeychainSystem

/// XChaCha20-Poly1305-IETF with associated data. A sealed box is `nonce (24) ‖ ciphertext ‖ tag (16)`,
/// with a fresh random nonce each time (192-bit nonces are safe to pick at random).
public enum AEAD {
    /// Length of a key in bytes (32).
    public static let keyBytes = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    /// Length of the random nonce at the front of a sealed box (24).
    public static let nonceBytes = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    /// Length of the Poly1305 tag at the end of a sealed box (16).
    public static let tagBytes = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes a sealed box adds to its plaintext.
    public static let overhead = nonceBytes + tagBytes

    /// Seals `plaintext` under `key` (32 bytes), authenticating `ad` too.
    public static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer,
        ad: UnsafeRawBufferPointer
    ) -> [UInt8] {
        precondition(key.count == keyBytes, "AEAD key must be \(keyBytes) bytes")
        Sodium.ensureInitialized()
        let total = nonceBytes + plaintext.count + tagBytes
        return [UInt8](unsafeUninitializedCapacity: total) { out, initialized in
            let base = UnsafeMutableRawPointer(out.baseAddress!)
            randombytes_buf(base, nonceBytes)
            var written: UInt64 = 0
            let rc = crypto_aead_xchacha20poly1305_ietf_encrypt(
                base.advanced(by: nonceBytes).assumingMemoryBound(to: UInt8.self), &written,
                plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                ad.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(ad.count),
                nil,
                base.assumingMemoryBound(to: UInt8.self),
                key.baseAddress!.assumingMemoryBound(to: UInt8.self))
            precondition(rc == 0 && Int(written) == plaintext.count + tagBytes, "AEAD encryption failed")
            initialized = total
        }
    }

    /// Seals `plaintext` under `key` with a fresh random nonce, authenticating `ad` too.
    public static func seal(_ plaintext: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer) -> [UInt8] {
        plaintext.withUnsafeBytes { seal($0, key: key, ad: ad) }
    }

    /// Opens a sealed box into `output` (exactly `sealed.count - overhead` bytes). A wrong key, wrong
    /// associated data or any modified byte is `errSecDecode`; `output` is zeroed then.
    public static func open(
        _ sealed: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer,
        ad: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
        what: StaticString
    ) throws(KeychainError) {
        precondition(key.count == keyBytes, "AEAD key must be \(keyBytes) bytes")
        guard sealed.count >= overhead, output.count == sealed.count - overhead else {
            throw KeychainError(.decode, "\(what) is damaged (wrong length)")
        }
        Sodium.ensureInitialized()
        var written: UInt64 = 0
        let base = sealed.baseAddress!.assumingMemoryBound(to: UInt8.self)
        // An empty plaintext still needs a valid pointer for libsodium.
        var dummy: UInt8 = 0
        let rc = withUnsafeMutablePointer(to: &dummy) { dummyPointer in
            crypto_aead_xchacha20poly1305_ietf_decrypt(
                output.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? dummyPointer, &written, nil,
                base + nonceBytes, UInt64(sealed.count - nonceBytes),
                ad.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(ad.count),
                base, key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        guard rc == 0 else {
            Sodium.zero(output)
            throw KeychainError(
                .decode, "\(what) failed authentication (damaged, tampered with, or moved from another item)")
        }
    }

    /// Opens a sealed box into a new array.
    public static func open(
        _ sealed: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString
    ) throws(KeychainError) -> [UInt8] {
        guard sealed.count >= overhead else { throw KeychainError(.decode, "\(what) is damaged (too short)") }
        var out = [UInt8](repeating: 0, count: sealed.count - overhead)
        try withBytes(sealed) { (s) throws(KeychainError) in
            try withMutableBytes(&out) { (o) throws(KeychainError) in
                try open(s, key: key, ad: ad, into: o, what: what)
            }
        }
        return out
    }

    /// Opens a sealed box into wiping storage (an item's secret).
    public static func openSecret(
        _ sealed: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer,
        what: StaticString
    ) throws(KeychainError) -> SecretBytes {
        guard sealed.count >= overhead else { throw KeychainError(.decode, "\(what) is damaged (too short)") }
        var out = SecretBytes(count: sealed.count - overhead)
        try withBytes(sealed) { (s) throws(KeychainError) in
            try out.withUnsafeMutableBytes { (o) throws(KeychainError) in
                try open(s, key: key, ad: ad, into: o, what: what)
            }
        }
        return out
    }

    /// Opens a sealed 32-byte key into a stack buffer, runs `body` with it and zeroes it afterwards.
    /// No heap allocation: this is the per-item key path of every read.
    @inlinable
    public static func withOpenedKey<R>(
        _ sealed: [UInt8], key: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer, what: StaticString,
        _ body: (UnsafeRawBufferPointer) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        guard sealed.count == keyBytes + overhead else {
            throw KeychainError(.decode, "\(what) is damaged (wrong length)")
        }
        return try withUnsafeTemporaryAllocation(byteCount: keyBytes, alignment: 16) {
            (buffer) throws(KeychainError) -> R in
            defer { Sodium.zero(buffer) }
            try withBytes(sealed) { (s) throws(KeychainError) in
                try open(s, key: key, ad: ad, into: buffer, what: what)
            }
            return try body(UnsafeRawBufferPointer(buffer))
        }
    }
}
