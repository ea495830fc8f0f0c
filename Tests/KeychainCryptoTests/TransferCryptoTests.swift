import CGcrypt
import KeychainCore
import KeychainSystem
import Testing

@testable import KeychainCrypto

/// The transfer sessions' cryptography (TransferCrypto.swift): the DH exchange agrees with a client
/// that computes its side independently, HKDF matches RFC 5869, AES-128-CBC round-trips, and bad
/// input is refused rather than trusted.
@Suite struct TransferCryptoRules {
    /// A client's side of the exchange, computed here with libgcrypt directly: g^x mod p, and the
    /// shared secret server^x mod p.
    struct Client {
        let x: [UInt8]
        init() { x = Sodium.randomBytes(64) }

        func power(_ base: [UInt8]) -> [UInt8] {
            var b: gcry_mpi_t?
            var e: gcry_mpi_t?
            var m: gcry_mpi_t?
            _ = base.withUnsafeBytes { gcry_mpi_scan(&b, GCRYMPI_FMT_USG, $0.baseAddress, $0.count, nil) }
            _ = x.withUnsafeBytes { gcry_mpi_scan(&e, GCRYMPI_FMT_USG, $0.baseAddress, $0.count, nil) }
            _ = TransferCrypto.prime.withUnsafeBytes {
                gcry_mpi_scan(&m, GCRYMPI_FMT_USG, $0.baseAddress, $0.count, nil)
            }
            let r = gcry_mpi_new(1024)!
            gcry_mpi_powm(r, b, e, m)
            var out = [UInt8](repeating: 0, count: 128)
            var n = 0
            _ = gcry_mpi_print(GCRYMPI_FMT_USG, nil, 0, &n, r)
            _ = out.withUnsafeMutableBytes {
                gcry_mpi_print(
                    GCRYMPI_FMT_USG, $0.baseAddress!.advanced(by: 128 - n).assumingMemoryBound(to: UInt8.self), n, nil,
                    r)
            }
            for v in [b, e, m, r] { gcry_mpi_release(v) }
            return out
        }

        var publicKey: [UInt8] { power([2]) }
    }

    func bytes(_ key: SecureBytes) -> [UInt8] { key.withUnsafeBytes { Array($0) } }

    @Test func theGroupIsRFC2409sSecondOakleyGroup() {
        #expect(TransferCrypto.prime.count == 128)
        #expect(TransferCrypto.prime.prefix(8) == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])
        #expect(TransferCrypto.prime.suffix(8) == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])
        #expect(TransferCrypto.prime[8..<12] == [0xC9, 0x0F, 0xDA, 0xA2])  // π's first bits
    }

    @Test func bothSidesDeriveTheSameKey() throws {
        #expect(TransferCrypto.ready)
        for _ in 0..<4 {
            let client = Client()
            let (serverPublic, key) = try TransferCrypto.respond(clientPublic: client.publicKey)
            #expect(serverPublic.count <= 128 && serverPublic.first != 0)
            let shared = client.power(serverPublic)
            let clientKey = try shared.withUnsafeBytes { try TransferCrypto.hkdfSHA256($0, length: 16) }
            #expect(bytes(clientKey) == bytes(key))
            // And a secret sealed with one opens with the other.
            let sealed = try TransferCrypto.encrypt(Array("over the bus".utf8), key: key)
            #expect(
                try TransferCrypto.decrypt(iv: sealed.iv, ciphertext: sealed.ciphertext, key: clientKey)
                    == Array("over the bus".utf8))
        }
    }

    @Test func everyExchangeDrawsAFreshKey() throws {
        let client = Client()
        let a = try TransferCrypto.respond(clientPublic: client.publicKey)
        let b = try TransferCrypto.respond(clientPublic: client.publicKey)
        #expect(a.serverPublic != b.serverPublic && bytes(a.key) != bytes(b.key))
    }

    @Test func hkdfMatchesRFC5869TestCase3() throws {
        // RFC 5869 A.3: SHA-256, IKM = 22 × 0x0b, no salt, no info.
        let ikm = [UInt8](repeating: 0x0B, count: 22)
        let okm = try ikm.withUnsafeBytes { try TransferCrypto.hkdfSHA256($0, length: 16) }
        #expect(bytes(okm) == TransferCrypto.hexBytes("8da4e775a563c18f715f802a063c5a31"))
    }

    @Test func publicKeysOutsideTheGroupAreRefused() {
        var pMinus1 = TransferCrypto.prime
        pMinus1[127] -= 1
        for bad in [[], [0], [1], pMinus1, TransferCrypto.prime, [UInt8](repeating: 0xFF, count: 129)] {
            #expect(throws: KeychainError.self) { try TransferCrypto.respond(clientPublic: bad) }
        }
    }

    @Test func cbcPaddingAndLengthsAreChecked() throws {
        let key = try SecureBytes(random: 16)
        for length in [0, 1, 15, 16, 17, 1000] {
            let plain = Sodium.randomBytes(length)
            let sealed = try TransferCrypto.encrypt(plain, key: key)
            #expect(sealed.iv.count == 16 && sealed.ciphertext.count == (length / 16 + 1) * 16)
            #expect(try TransferCrypto.decrypt(iv: sealed.iv, ciphertext: sealed.ciphertext, key: key) == plain)
        }
        let sealed = try TransferCrypto.encrypt(Array("x".utf8), key: key)
        #expect(throws: KeychainError.self) {
            try TransferCrypto.decrypt(iv: [], ciphertext: sealed.ciphertext, key: key)
        }
        #expect(throws: KeychainError.self) { try TransferCrypto.decrypt(iv: sealed.iv, ciphertext: [], key: key) }
        #expect(throws: KeychainError.self) {
            try TransferCrypto.decrypt(iv: sealed.iv, ciphertext: Array(sealed.ciphertext.dropLast()), key: key)
        }
        // Another key mostly fails the padding check, but one time in about 256 its last byte comes
        // out as valid padding (0x01): what must never happen is the plaintext coming back.
        let other = try? TransferCrypto.decrypt(
            iv: sealed.iv, ciphertext: sealed.ciphertext, key: try SecureBytes(random: 16))
        #expect(other != Array("x".utf8))
    }
}
