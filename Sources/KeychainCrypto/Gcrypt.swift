import CGcrypt

/// libgcrypt, for what libsodium does not do everywhere: AES-256-GCM on CPUs without AES-NI (libsodium
/// runs it only with AES-NI, so a data directory written on one machine and moved to another would
/// not open there), and the Secret Service's DH and AES-128-CBC (KeychainSecretService).
public enum Gcrypt {
    /// libgcrypt initialised, once per process, before anyone uses it (`kc_gcrypt_init`: version
    /// check, secure memory for cipher contexts); false when the library is older than its headers.
    public static let ready: Bool = kc_gcrypt_init() == 0

    /// AES-256-GCM with a 12-byte nonce and a 16-byte tag, as libsodium's `crypto_aead_aes256gcm`:
    /// encrypts `count` bytes at `input` into `output` (the same count) and writes the tag to `tag`,
    /// or decrypts and checks `tag`. False when libgcrypt refuses or the tag does not match; `output`
    /// is zeroed then.
    static func aes256GCM(
        decrypt: Bool, _ output: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>?, _ count: Int,
        tag: UnsafeMutablePointer<UInt8>, ad: UnsafeRawBufferPointer, nonce: UnsafePointer<UInt8>,
        key: UnsafeRawBufferPointer
    ) -> Bool {
        guard ready else { return false }
        var handle: gcry_cipher_hd_t?
        guard
            gcry_cipher_open(
                &handle, Int32(GCRY_CIPHER_AES256.rawValue), Int32(GCRY_CIPHER_MODE_GCM.rawValue),
                UInt32(GCRY_CIPHER_SECURE.rawValue)) == 0, let handle
        else { return false }
        defer { gcry_cipher_close(handle) }  // the context is in libgcrypt's secure memory, wiped on close
        var ok =
            gcry_cipher_setkey(handle, key.baseAddress, key.count) == 0
            && gcry_cipher_setiv(handle, nonce, 12) == 0
            && gcry_cipher_authenticate(handle, ad.baseAddress, ad.count) == 0
        if ok && count > 0 {
            ok =
                decrypt
                ? gcry_cipher_decrypt(handle, output, count, input, count) == 0
                : gcry_cipher_encrypt(handle, output, count, input, count) == 0
        }
        if ok {
            ok = decrypt ? gcry_cipher_checktag(handle, tag, 16) == 0 : gcry_cipher_gettag(handle, tag, 16) == 0
        }
        if !ok { Sodium.zero(UnsafeMutableRawBufferPointer(start: output, count: count)) }
        return ok
    }
}
