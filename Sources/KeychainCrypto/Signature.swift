import CSodium
public import KeychainCore
import KeychainSystem

/// Ed25519 detached signatures (libsodium `crypto_sign_ed25519`): each sync device signs its own
/// file in the sync folder, and the others check it against the public key recorded for it when it
/// was paired (docs/sync.md).
public enum Signature {
    /// Length of a public key (32).
    public static let publicKeyBytes = Int(crypto_sign_ed25519_PUBLICKEYBYTES)
    /// Length of a secret key (64: the seed and the public key).
    public static let secretKeyBytes = Int(crypto_sign_ed25519_SECRETKEYBYTES)
    /// Length of a signature (64).
    public static let bytes = Int(crypto_sign_ed25519_BYTES)

    /// A fresh key pair: the public key in a plain array, the secret key in guarded memory.
    public static func keyPair() throws(KeychainError) -> (publicKey: [UInt8], secretKey: SecureBytes) {
        try Sodium.keyPair(publicKeyBytes: publicKeyBytes, secretKeyBytes: secretKeyBytes, what: "a signing key pair") {
            crypto_sign_ed25519_keypair($0, $1)
        }
    }

    /// The public key of a secret key (its last 32 bytes, as libsodium lays it out).
    public static func publicKey(of secretKey: SecureBytes) throws(KeychainError) -> [UInt8] {
        guard secretKey.count == secretKeyBytes else {
            throw KeychainError(.decode, "a signing secret key must be \(secretKeyBytes) bytes")
        }
        Sodium.ensureInitialized()
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        let rc = pk.withUnsafeMutableBufferPointer { p in
            secretKey.withUnsafeBytes { s in
                crypto_sign_ed25519_sk_to_pk(p.baseAddress!, s.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        guard rc == 0 else { throw KeychainError(.internal, "cannot read the signing public key") }
        return pk
    }

    /// The detached signature of `message` under `secretKey` (of `secretKeyBytes`).
    public static func sign(_ message: UnsafeRawBufferPointer, secretKey: SecureBytes) -> [UInt8] {
        precondition(secretKey.count == secretKeyBytes)
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: bytes)
        var dummy: UInt8 = 0
        _ = out.withUnsafeMutableBufferPointer { o in
            secretKey.withUnsafeBytes { s in
                withUnsafeMutablePointer(to: &dummy) { d in
                    crypto_sign_ed25519_detached(
                        o.baseAddress!, nil,
                        message.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(d),
                        UInt64(message.count), s.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        return out
    }

    /// Whether `signature` is `publicKey`'s signature of `message`. False for keys or signatures of
    /// the wrong length.
    public static func verify(_ signature: [UInt8], of message: UnsafeRawBufferPointer, publicKey: [UInt8]) -> Bool {
        guard signature.count == bytes, publicKey.count == publicKeyBytes else { return false }
        Sodium.ensureInitialized()
        var dummy: UInt8 = 0
        let rc = signature.withUnsafeBufferPointer { s in
            publicKey.withUnsafeBufferPointer { k in
                withUnsafeMutablePointer(to: &dummy) { d in
                    crypto_sign_ed25519_verify_detached(
                        s.baseAddress!, message.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(d),
                        UInt64(message.count), k.baseAddress!)
                }
            }
        }
        return rc == 0
    }
}
