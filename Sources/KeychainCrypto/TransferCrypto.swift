import CGcrypt
import CSodium
public import KeychainCore
import KeychainSystem

/// How secrets travel between a client and the Secret Service (the spec's "transfer sessions"):
/// `plain`, or `dh-ietf1024-sha256-aes128-cbc-pkcs7` — a Diffie-Hellman exchange in the 1024-bit
/// MODP group of RFC 2409 (generator 2), HKDF-SHA-256 of the shared secret (no salt, no info) to a
/// 16-byte key, and each secret AES-128-CBC with PKCS#7 padding under a fresh random IV.
///
/// libsodium has neither the group arithmetic nor AES-CBC, so libgcrypt does those (as in
/// gnome-keyring): secret numbers live in its secure memory, which is locked and wiped on release.
/// HMAC-SHA-256 for the HKDF and the random IVs come from libsodium. Errors: errSecParam for what
/// the client sent (the Secret Service's InvalidArgs), errSecDecode when the arithmetic fails.
public enum TransferCrypto {
    /// The algorithm name of sessions that carry secrets as they are.
    public static let plain = "plain"
    /// The algorithm name of the Diffie-Hellman sessions.
    public static let dh = "dh-ietf1024-sha256-aes128-cbc-pkcs7"

    /// RFC 2409 §6.2, the Second Oakley Group: 2^1024 − 2^960 − 1 + 2^64 · (⌊2^894 π⌋ + 129093).
    public static let prime: [UInt8] = hexBytes(
        """
        FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD\
        EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED\
        EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF
        """)
    static let primeBytes = 128
    /// Bits of the server's private exponent: twice the group's ~80-bit strength and then some.
    static let exponentBits: UInt32 = 256
    static let keyBytes = 16
    static let blockBytes = 16

    /// The bytes a hexadecimal string spells (anything else in it is skipped).
    static func hexBytes(_ s: String) -> [UInt8] {
        var out: [UInt8] = []
        var high: UInt8?
        for c in s.utf8 {
            let v: UInt8
            switch c {
            case 0x30...0x39: v = c - 0x30
            case 0x41...0x46: v = c - 0x41 + 10
            case 0x61...0x66: v = c - 0x61 + 10
            default: continue
            }
            if let h = high {
                out.append(h << 4 | v)
                high = nil
            } else {
                high = v
            }
        }
        return out
    }

    /// libgcrypt initialised (once per process, shared with KeychainCrypto's use of it).
    static var ready: Bool { Gcrypt.ready }

    /// The server's half of the exchange: the client's public value in, our public value and the
    /// session key out. A public value outside 2 … p − 2 is refused (InvalidArgs).
    public static func respond(clientPublic: [UInt8]) throws(KeychainError) -> (serverPublic: [UInt8], key: SecureBytes)
    {
        guard ready else { throw KeychainError(.decode, "libgcrypt could not be initialised") }
        guard !clientPublic.isEmpty, clientPublic.count <= primeBytes else {
            throw .param("the client's DH public key must be 1 to \(primeBytes) bytes")
        }
        let p = try mpi(prime)
        defer { gcry_mpi_release(p) }
        let y = try mpi(clientPublic)
        defer { gcry_mpi_release(y) }
        let pMinus1 = gcry_mpi_new(1024)!
        defer { gcry_mpi_release(pMinus1) }
        gcry_mpi_sub_ui(pMinus1, p, 1)
        guard gcry_mpi_cmp_ui(y, 1) > 0, gcry_mpi_cmp(y, pMinus1) < 0 else {
            throw .param("the client's DH public key is not in the group")
        }
        let x = gcry_mpi_snew(exponentBits)!
        defer { gcry_mpi_release(x) }
        gcry_mpi_randomize(x, exponentBits, GCRY_STRONG_RANDOM)
        gcry_mpi_set_bit(x, exponentBits - 1)
        let g = gcry_mpi_set_ui(nil, 2)!
        defer { gcry_mpi_release(g) }
        let ours = gcry_mpi_new(1024)!
        defer { gcry_mpi_release(ours) }
        gcry_mpi_powm(ours, g, x, p)
        let shared = gcry_mpi_snew(1024)!
        defer { gcry_mpi_release(shared) }
        gcry_mpi_powm(shared, y, x, p)
        let serverPublic = try export(ours, padded: false)
        // The shared secret, left-padded to the prime's length (as libsecret and secretstorage do),
        // is the HKDF input; it only ever sits in this zeroed stack buffer.
        let key = withUnsafeTemporaryAllocation(byteCount: primeBytes, alignment: 8) {
            (buffer) -> Result<SecureBytes, KeychainError> in
            defer { Sodium.zero(buffer) }
            do throws(KeychainError) { try export(shared, into: buffer) } catch { return .failure(error) }
            do throws(KeychainError) {
                return .success(try hkdfSHA256(UnsafeRawBufferPointer(buffer), length: keyBytes))
            } catch { return .failure(error) }
        }
        return (serverPublic, try key.get())
    }

    private static func mpi(_ bytes: [UInt8]) throws(KeychainError) -> gcry_mpi_t {
        var out: gcry_mpi_t?
        let err = bytes.withUnsafeBytes { gcry_mpi_scan(&out, GCRYMPI_FMT_USG, $0.baseAddress, $0.count, nil) }
        guard err == 0, let out else { throw .param("a DH value could not be read") }
        return out
    }

    private static func export(_ a: gcry_mpi_t, padded: Bool) throws(KeychainError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: primeBytes)
        let written = out.withUnsafeMutableBytes { (b) -> Result<Void, KeychainError> in
            do throws(KeychainError) { try export(a, into: b) } catch { return .failure(error) }
            return .success(())
        }
        try written.get()
        if !padded, let first = out.firstIndex(where: { $0 != 0 }) { out.removeFirst(first) }
        return out
    }

    /// Writes `a` big-endian, left-padded with zeros, into all of `buffer` (the prime's length).
    private static func export(_ a: gcry_mpi_t, into buffer: UnsafeMutableRawBufferPointer) throws(KeychainError) {
        var length = 0
        guard gcry_mpi_print(GCRYMPI_FMT_USG, nil, 0, &length, a) == 0, length <= buffer.count else {
            throw KeychainError(.decode, "a DH value is out of range")
        }
        Sodium.zero(buffer)
        let offset = buffer.count - length
        var written = 0
        guard
            gcry_mpi_print(
                GCRYMPI_FMT_USG, buffer.baseAddress!.advanced(by: offset).assumingMemoryBound(to: UInt8.self),
                length, &written, a) == 0, written == length
        else {
            throw KeychainError(.decode, "a DH value could not be written")
        }
    }

    /// RFC 5869 HKDF with SHA-256, an all-zero salt and empty info; `length` ≤ 32.
    public static func hkdfSHA256(_ ikm: UnsafeRawBufferPointer, length: Int) throws(KeychainError) -> SecureBytes {
        precondition(length <= 32)
        Sodium.ensureInitialized()
        return try withUnsafeTemporaryAllocation(byteCount: 64, alignment: 8) { (scratch) throws(KeychainError) in
            defer { Sodium.zero(scratch) }
            let prk = scratch.baseAddress!.assumingMemoryBound(to: UInt8.self)
            let okm = prk + 32
            var state = crypto_auth_hmacsha256_state()
            defer { withUnsafeMutableBytes(of: &state) { Sodium.zero($0) } }
            let salt = [UInt8](repeating: 0, count: 32)
            _ = crypto_auth_hmacsha256_init(&state, salt, salt.count)
            _ = crypto_auth_hmacsha256_update(
                &state, ikm.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(ikm.count))
            _ = crypto_auth_hmacsha256_final(&state, prk)
            var counter: UInt8 = 1
            _ = crypto_auth_hmacsha256_init(&state, prk, 32)
            _ = crypto_auth_hmacsha256_update(&state, &counter, 1)
            _ = crypto_auth_hmacsha256_final(&state, okm)
            return try SecureBytes(copying: UnsafeRawBufferPointer(start: okm, count: length))
        }
    }

    /// AES-128-CBC with PKCS#7 padding under a fresh random IV: (IV, ciphertext).
    public static func encrypt(_ plaintext: [UInt8], key: SecureBytes) throws(KeychainError) -> (
        iv: [UInt8], ciphertext: [UInt8]
    ) {
        let iv = Sodium.randomBytes(blockBytes)
        let pad = blockBytes - plaintext.count % blockBytes
        var buffer = plaintext + [UInt8](repeating: UInt8(pad), count: pad)
        do {
            try cipher(key: key, iv: iv) { (h) throws(KeychainError) in
                let err = buffer.withUnsafeMutableBytes { gcry_cipher_encrypt(h, $0.baseAddress, $0.count, nil, 0) }
                if err != 0 { throw KeychainError(.decode, "the secret could not be encrypted") }
            }
        } catch {
            Sodium.zero(&buffer)
            throw error
        }
        return (iv, buffer)
    }

    /// The reverse of `encrypt`; a wrong length or padding is InvalidArgs.
    public static func decrypt(iv: [UInt8], ciphertext: [UInt8], key: SecureBytes) throws(KeychainError) -> [UInt8] {
        guard iv.count == blockBytes else { throw .param("the secret's parameters must be a 16-byte IV") }
        guard !ciphertext.isEmpty, ciphertext.count % blockBytes == 0 else {
            throw .param("the encrypted secret's length is not a positive multiple of 16")
        }
        var buffer = ciphertext
        try cipher(key: key, iv: iv) { (h) throws(KeychainError) in
            let err = buffer.withUnsafeMutableBytes { gcry_cipher_decrypt(h, $0.baseAddress, $0.count, nil, 0) }
            if err != 0 { throw KeychainError(.decode, "the secret could not be decrypted") }
        }
        let pad = Int(buffer.last!)
        guard pad >= 1, pad <= blockBytes, buffer.suffix(pad).allSatisfy({ $0 == UInt8(pad) }) else {
            Sodium.zero(&buffer)
            throw .param("the encrypted secret does not decrypt under this session's key")
        }
        let plain = Array(buffer.prefix(buffer.count - pad))
        Sodium.zero(&buffer)
        return plain
    }

    private static func cipher(key: SecureBytes, iv: [UInt8], _ body: (gcry_cipher_hd_t) throws(KeychainError) -> Void)
        throws(KeychainError)
    {
        guard ready else { throw KeychainError(.decode, "libgcrypt could not be initialised") }
        var handle: gcry_cipher_hd_t?
        guard
            gcry_cipher_open(
                &handle, Int32(GCRY_CIPHER_AES.rawValue), Int32(GCRY_CIPHER_MODE_CBC.rawValue),
                UInt32(GCRY_CIPHER_SECURE.rawValue)) == 0, let handle
        else {
            throw KeychainError(.decode, "AES-128-CBC is not available")
        }
        defer { gcry_cipher_close(handle) }
        let keyed = key.withUnsafeBytes { gcry_cipher_setkey(handle, $0.baseAddress, $0.count) }
        let ivSet = iv.withUnsafeBytes { gcry_cipher_setiv(handle, $0.baseAddress, $0.count) }
        guard keyed == 0, ivSet == 0 else { throw KeychainError(.decode, "the session key could not be used") }
        try body(handle)
    }
}
