import CSodium
public import KeychainCore
import KeychainSystem

/// Anonymous public-key boxes (libsodium `crypto_box_seal`: X25519 + XSalsa20-Poly1305 with an
/// ephemeral sender key): what only the holder of one secret key can open. Sync pairing hands the
/// sync key to a new device this way (docs/sync.md).
public enum SealedBox {
    /// Length of a public key (32).
    public static let publicKeyBytes = Int(crypto_box_PUBLICKEYBYTES)
    /// Length of a secret key (32).
    public static let secretKeyBytes = Int(crypto_box_SECRETKEYBYTES)
    /// What a sealed box adds to its plaintext (ephemeral public key and tag, 48 bytes).
    public static let overhead = Int(crypto_box_sealbytes())

    /// A fresh key pair: the public key in a plain array, the secret key in guarded memory.
    public static func keyPair() throws(KeychainError) -> (publicKey: [UInt8], secretKey: SecureBytes) {
        try Sodium.keyPair(publicKeyBytes: publicKeyBytes, secretKeyBytes: secretKeyBytes, what: "a key pair") {
            crypto_box_keypair($0, $1)
        }
    }

    /// Seals `plaintext` so that only the holder of `publicKey`'s secret key can open it.
    public static func seal(_ plaintext: UnsafeRawBufferPointer, to publicKey: [UInt8]) throws(KeychainError) -> [UInt8]
    {
        guard publicKey.count == publicKeyBytes else { throw .param("a public key must be \(publicKeyBytes) bytes") }
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: plaintext.count + overhead)
        var dummy: UInt8 = 0
        let rc = out.withUnsafeMutableBufferPointer { o in
            publicKey.withUnsafeBufferPointer { k in
                withUnsafeMutablePointer(to: &dummy) { d in
                    crypto_box_seal(
                        o.baseAddress!, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(d),
                        UInt64(plaintext.count), k.baseAddress!)
                }
            }
        }
        guard rc == 0 else { throw KeychainError(.param, "the public key is not usable") }
        return out
    }

    /// Opens a sealed box with the key pair it was sealed to, into guarded memory. Anything damaged or
    /// sealed to another key is errSecDecode.
    public static func open(_ sealed: [UInt8], publicKey: [UInt8], secretKey: SecureBytes) throws(KeychainError)
        -> SecureBytes
    {
        guard sealed.count > overhead, publicKey.count == publicKeyBytes, secretKey.count == secretKeyBytes else {
            throw KeychainError(.decode, "the sealed box is damaged (wrong length)")
        }
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: sealed.count - overhead)
        defer { Sodium.zero(&out) }
        let rc = out.withUnsafeMutableBufferPointer { o in
            sealed.withUnsafeBufferPointer { s in
                publicKey.withUnsafeBufferPointer { p in
                    secretKey.withUnsafeBytes { k in
                        crypto_box_seal_open(
                            o.baseAddress!, s.baseAddress!, UInt64(s.count), p.baseAddress!,
                            k.baseAddress!.assumingMemoryBound(to: UInt8.self))
                    }
                }
            }
        }
        guard rc == 0 else { throw KeychainError(.decode, "the sealed box failed authentication (not for this key)") }
        return try withBytes(out) { (b) throws(KeychainError) in try SecureBytes(copying: b) }
    }
}
