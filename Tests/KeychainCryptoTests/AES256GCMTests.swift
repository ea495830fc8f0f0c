import KeychainCore
import KeychainSystem
import Testing

@testable import KeychainCrypto

/// AES-256-GCM runs in libsodium where the CPU has AES-NI and in libgcrypt elsewhere; a row sealed on
/// one machine must open on the other, so the two must agree on every byte.
@Suite struct AES256GCMTests {
    let key = SecureBytes(random: AEAD.keyBytes)

    func seal(_ plain: [UInt8], ad: [UInt8], _ engine: AEAD.GCMEngine) -> [UInt8] {
        key.withUnsafeBytes { k in
            plain.withUnsafeBytes { p in
                ad.withUnsafeBytes { AEAD.seal(p, key: k, ad: $0, sealing: .aes256GCM, engine: engine) }
            }
        }
    }

    func open(_ sealed: [UInt8], ad: [UInt8], _ engine: AEAD.GCMEngine) -> [UInt8]? {
        var out = [UInt8](repeating: 0xEE, count: max(0, sealed.count - ItemSealing.aes256GCM.overhead))
        var opened = true
        key.withUnsafeBytes { k in
            sealed.withUnsafeBytes { box in
                ad.withUnsafeBytes { a in
                    out.withUnsafeMutableBytes { o in
                        do throws(KeychainError) {
                            try AEAD.open(box, key: k, ad: a, into: o, what: "t", sealing: .aes256GCM, engine: engine)
                        } catch {
                            opened = false
                        }
                    }
                }
            }
        }
        guard opened else {
            #expect(out.allSatisfy { $0 == 0 }, "a box that does not open leaves no plaintext behind")
            return nil
        }
        return out
    }

    /// What one library seals the other opens, for empty, short and multi-block plaintexts and
    /// associated data; neither opens a box with a changed byte, tag or associated data.
    @Test func libsodiumAndLibgcryptAgree() {
        let engines: [AEAD.GCMEngine] = AEAD.gcmEngine == .libsodium ? [.libsodium, .libgcrypt] : [.libgcrypt]
        for length in [0, 1, 15, 16, 32, 36, 100, 1000] {
            let plain = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
            for ad in [[], Array("kc2-ad".utf8), [UInt8](repeating: 9, count: 70)] {
                for sealer in engines {
                    let sealed = seal(plain, ad: ad, sealer)
                    #expect(sealed.count == 12 + length + 16)
                    for opener in engines {
                        #expect(open(sealed, ad: ad, opener) == plain, "\(sealer) → \(opener), \(length) bytes")
                        for position in [0, 12, sealed.count - 1] where position < sealed.count {
                            var changed = sealed
                            changed[position] ^= 0x20
                            #expect(open(changed, ad: ad, opener) == nil, "byte \(position) changed")
                        }
                        #expect(open(sealed, ad: ad + [0], opener) == nil, "other associated data")
                    }
                }
            }
        }
    }
}
