import CGcrypt
import KeychainCore

/// libgcrypt, for what libsodium does not do everywhere: AES-256-GCM on CPUs without AES-NI (libsodium
/// runs it only with AES-NI, so a data directory written on one machine and moved to another would
/// not open there), and the Secret Service's DH and AES-128-CBC (KeychainSecretService).
public enum Gcrypt {
    /// libgcrypt initialised, once per process, before anyone uses it (`kc_gcrypt_init`: version
    /// check, secure memory for cipher contexts, grown on demand); false when the library is older
    /// than its headers. Nothing else in keychaind initialises libgcrypt (if something had, its
    /// settings would stand).
    public static let ready: Bool = kc_gcrypt_init() == 0

    /// AES-256-GCM with a 12-byte nonce and a 16-byte tag, as libsodium's `crypto_aead_aes256gcm`:
    /// encrypts `count` bytes at `input` into `output` (the same count) and writes the tag to `tag`.
    /// errSecInternal when libgcrypt refuses (out of secure memory; FIPS mode refuses a caller's IV).
    static func aes256GCMSeal(
        _ output: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>?, _ count: Int,
        tag: UnsafeMutablePointer<UInt8>, ad: UnsafeRawBufferPointer, nonce: UnsafePointer<UInt8>,
        key: UnsafeRawBufferPointer
    ) throws(KeychainError) {
        try withGCM(key: key, nonce: nonce, ad: ad) { (handle) throws(KeychainError) in
            if count > 0 { try check(gcry_cipher_encrypt(handle, output, count, input, count), output, count) }
            try check(gcry_cipher_gettag(handle, tag, 16), output, count)
        }
    }

    /// Decrypts `count` bytes of `box` into `output` and checks the 16-byte `tag`: false when it does
    /// not match (`output` zeroed), errSecInternal when libgcrypt refuses for any other reason.
    static func aes256GCMOpen(
        _ output: UnsafeMutablePointer<UInt8>, box: UnsafePointer<UInt8>, _ count: Int, tag: UnsafePointer<UInt8>,
        ad: UnsafeRawBufferPointer, nonce: UnsafePointer<UInt8>, key: UnsafeRawBufferPointer
    ) throws(KeychainError) -> Bool {
        try withGCM(key: key, nonce: nonce, ad: ad) { (handle) throws(KeychainError) -> Bool in
            if count > 0 { try check(gcry_cipher_decrypt(handle, output, count, box, count), output, count) }
            // The tag is compared from a copy: libgcrypt's checktag takes it read-only, but it should
            // never be handed a pointer into the caller's (immutable) box as writable memory.
            var expected = (UInt64(0), UInt64(0))
            let rc = withUnsafeMutableBytes(of: &expected) { t in
                t.copyMemory(from: UnsafeRawBufferPointer(start: tag, count: 16))
                return gcry_cipher_checktag(handle, t.baseAddress, 16)
            }
            if rc == 0 { return true }
            if gcry_err_code(rc) == GPG_ERR_CHECKSUM {
                Sodium.zero(UnsafeMutableRawBufferPointer(start: output, count: count))
                return false
            }
            try check(rc, output, count)
            return false
        }
    }

    /// A GCM context keyed with `key`, its IV set to the 12-byte `nonce` and `ad` authenticated, for
    /// `body`; closed (and wiped by libgcrypt) afterwards.
    private static func withGCM<R>(
        key: UnsafeRawBufferPointer, nonce: UnsafePointer<UInt8>, ad: UnsafeRawBufferPointer,
        _ body: (gcry_cipher_hd_t) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        guard ready else { throw KeychainError(.internal, "libgcrypt could not be initialised") }
        var handle: gcry_cipher_hd_t?
        let opened = gcry_cipher_open(
            &handle, Int32(GCRY_CIPHER_AES256.rawValue), Int32(GCRY_CIPHER_MODE_GCM.rawValue),
            UInt32(GCRY_CIPHER_SECURE.rawValue))
        guard opened == 0, let handle else { throw failure(opened) }
        defer { gcry_cipher_close(handle) }
        var rc = gcry_cipher_setkey(handle, key.baseAddress, key.count)
        if rc == 0 { rc = gcry_cipher_setiv(handle, nonce, 12) }
        if rc == 0 { rc = gcry_cipher_authenticate(handle, ad.baseAddress, ad.count) }
        guard rc == 0 else { throw failure(rc) }
        return try body(handle)
    }

    /// Zeroes `count` bytes of `output` and throws when `rc` is an error.
    private static func check(_ rc: gcry_error_t, _ output: UnsafeMutablePointer<UInt8>, _ count: Int)
        throws(KeychainError)
    {
        guard rc != 0 else { return }
        Sodium.zero(UnsafeMutableRawBufferPointer(start: output, count: count))
        throw failure(rc)
    }

    private static func failure(_ rc: gcry_error_t) -> KeychainError {
        KeychainError(.internal, "libgcrypt could not run AES-256-GCM: \(String(cString: gcry_strerror(rc)))")
    }
}
