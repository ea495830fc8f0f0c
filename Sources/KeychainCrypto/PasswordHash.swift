import CSodium
public import KeychainCore
import KeychainSystem

/// How expensive Argon2id is for new passphrases and backups (the `kdfProfile` setting).
///
/// Measured on the 2-core build VM (libsodium 1.0.18, one thread): interactive 60–70 ms, moderate
/// 0.34–0.39 s per derivation (0.87 s on a busier run). Existing keyrings and backup files keep the parameters they were made
/// with; the profile only decides what the next `passwd` or `backup` writes.
public enum KDFProfile: String, Sendable, CaseIterable {
    /// libsodium's INTERACTIVE: 2 passes over 64 MiB. For tests and small machines.
    case interactive
    /// libsodium's MODERATE: 3 passes over 256 MiB. The default.
    case moderate

    /// Argon2id passes (time cost) this profile asks of a new derivation.
    public var opsLimit: UInt64 {
        switch self {
        case .interactive: return UInt64(crypto_pwhash_argon2id_OPSLIMIT_INTERACTIVE)
        case .moderate: return UInt64(crypto_pwhash_argon2id_OPSLIMIT_MODERATE)
        }
    }

    /// Memory in bytes each new derivation under this profile uses (64 MiB interactive, 256 MiB moderate).
    public var memLimit: UInt64 {
        switch self {
        case .interactive: return UInt64(crypto_pwhash_argon2id_MEMLIMIT_INTERACTIVE)
        case .moderate: return UInt64(crypto_pwhash_argon2id_MEMLIMIT_MODERATE)
        }
    }
}

/// Argon2id parameters as stored beside what they protect (keyring, backup header).
public struct KDFParameters: Sendable, Equatable {
    /// `crypto_pwhash_ALG_ARGON2ID13`, the only algorithm written or read.
    public static let algorithm = Int32(crypto_pwhash_ALG_ARGON2ID13)
    /// The algorithm's name as written in the keyring (`"alg"`); any other name fails to load.
    public static let algorithmName = "argon2id13"
    /// Length of an Argon2id salt in bytes (16).
    public static let saltBytes = Int(crypto_pwhash_SALTBYTES)
    /// Bounds accepted when reading stored parameters: a forged keyring or backup header must not make
    /// the daemon allocate gigabytes or spin for hours.
    public static let maxOpsLimit: UInt64 = 16
    /// Most memory a stored parameter set may ask for (1 GiB); more is refused as damaged.
    public static let maxMemLimit: UInt64 = 1 << 30
    /// Least memory libsodium's Argon2id accepts; less is refused as damaged.
    public static let minMemLimit = UInt64(crypto_pwhash_argon2id_MEMLIMIT_MIN)

    /// Argon2id passes (time cost), between 1 and `maxOpsLimit`.
    public var opsLimit: UInt64
    /// Memory per derivation in bytes, between `minMemLimit` and `maxMemLimit`.
    public var memLimit: UInt64
    /// The random salt, `saltBytes` long; not a secret.
    public var salt: [UInt8]

    /// Checked parameters; throws errSecDecode for a wrong-length salt or costs outside the accepted bounds.
    public init(opsLimit: UInt64, memLimit: UInt64, salt: [UInt8]) throws(KeychainError) {
        guard salt.count == Self.saltBytes else { throw KeychainError(.decode, "Argon2id salt has the wrong length") }
        guard opsLimit >= 1, opsLimit <= Self.maxOpsLimit, memLimit >= Self.minMemLimit, memLimit <= Self.maxMemLimit
        else {
            throw KeychainError(.decode, "Argon2id parameters out of range (ops \(opsLimit), memory \(memLimit) bytes)")
        }
        self.opsLimit = opsLimit
        self.memLimit = memLimit
        self.salt = salt
    }

    /// Fresh random salt with the profile's costs.
    public static func fresh(_ profile: KDFProfile) -> KDFParameters {
        // The profile's values are within the bounds by construction.
        try! KDFParameters(opsLimit: profile.opsLimit, memLimit: profile.memLimit, salt: Sodium.randomBytes(saltBytes))
    }

    /// CBOR form kept in the keyring: `{"alg": "argon2id13", "ops": n, "mem": bytes, "salt": 16 bytes}`.
    public var value: Value {
        .map([
            "alg": .text(Self.algorithmName), "ops": .int(Int64(opsLimit)), "mem": .int(Int64(memLimit)),
            "salt": .bytes(salt),
        ])
    }

    /// Reads the keyring's CBOR form; throws errSecDecode for a damaged map, another algorithm or costs out of bounds.
    public init(_ value: Value) throws(KeychainError) {
        guard let m = value.map, m["alg"]?.text == Self.algorithmName,
            let ops = m["ops"]?.int, let mem = m["mem"]?.int, ops > 0, mem > 0, let salt = m["salt"]?.bytes
        else {
            throw KeychainError(.decode, "the key-derivation parameters are damaged or name an unknown algorithm")
        }
        try self.init(opsLimit: UInt64(ops), memLimit: UInt64(mem), salt: salt)
    }
}

/// Argon2id (`crypto_pwhash`, ALG_ARGON2ID13) from a passphrase to a 32-byte key in guarded memory.
///
/// Derivations run one at a time in the whole process: each needs `memLimit` bytes (256 MiB for
/// moderate) and libsodium's Argon2id uses one thread, so running them side by side only multiplies
/// memory without finishing any sooner.
public enum PasswordHash {
    /// Length of a derived key in bytes (32).
    public static let keyBytes = 32
    /// Longest passphrase accepted (bytes).
    public static let maxPassphraseBytes = 4096

    private static let oneAtATime = Locked<Int>(0)

    /// Derives a 32-byte key in guarded memory, one derivation at a time; throws errSecAllocate when memory runs out.
    public static func derive(_ passphrase: SecureBytes, _ parameters: KDFParameters) throws(KeychainError)
        -> SecureBytes
    {
        Sodium.ensureInitialized()
        var failed = false
        let key = try oneAtATime.withLock { (runs) throws(KeychainError) -> SecureBytes in
            runs += 1
            return try SecureBytes(count: keyBytes) { out in
                passphrase.withUnsafeBytes { p in
                    parameters.salt.withUnsafeBytes { s in
                        let rc = crypto_pwhash(
                            out.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(keyBytes),
                            p.baseAddress!.assumingMemoryBound(to: CChar.self), UInt64(p.count),
                            s.baseAddress!.assumingMemoryBound(to: UInt8.self),
                            parameters.opsLimit, Int(parameters.memLimit), KDFParameters.algorithm)
                        if rc != 0 { failed = true }
                    }
                }
            }
        }
        if failed {
            throw KeychainError(.allocate, "Argon2id could not allocate \(parameters.memLimit >> 20) MiB")
        }
        return key
    }

    /// A guarded copy of passphrase bytes; nil for an empty passphrase. Longer than
    /// `maxPassphraseBytes` is errSecParam.
    public static func passphrase(_ bytes: UnsafeRawBufferPointer) throws(KeychainError) -> SecureBytes? {
        guard bytes.count <= maxPassphraseBytes else {
            throw KeychainError(.param, "a passphrase may be at most \(maxPassphraseBytes) bytes")
        }
        guard bytes.count > 0 else { return nil }
        return try SecureBytes(copying: bytes)
    }

    /// A guarded copy of passphrase bytes; nil for an empty passphrase, errSecParam past `maxPassphraseBytes`.
    public static func passphrase(_ bytes: [UInt8]) throws(KeychainError) -> SecureBytes? {
        try withBytes(bytes) { (b) throws(KeychainError) in try passphrase(b) }
    }
}

extension Sodium {
    /// Zeroes the storage of an array in place even when the storage is shared with other copies
    /// (a decoded request's `Value`s): every holder sees zeros afterwards. Only for secrets that are
    /// about to be dropped.
    public static func wipeShared(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { b in
            guard let base = b.baseAddress, b.count > 0 else { return }
            sodium_memzero(UnsafeMutableRawPointer(mutating: base), b.count)
        }
    }
}
