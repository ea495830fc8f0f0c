import KeychainCore
import KeychainSystem
import Testing

@testable import KeychainCrypto

/// AES-256-GCM runs in libsodium where the CPU has AES-NI and in libgcrypt elsewhere; a row sealed on
/// one machine must open on the other, so the two must agree on every byte.
@Suite struct AES256GCMTests {
    let key: SecureBytes

    init() throws { key = try SecureBytes(random: AEAD.keyBytes) }

    func seal(_ plain: [UInt8], ad: [UInt8], _ engine: AEAD.GCMEngine) -> [UInt8] {
        key.withUnsafeBytes { k in
            plain.withUnsafeBytes { p in
                ad.withUnsafeBytes { try! AEAD.seal(p, key: k, ad: $0, sealing: .aes256GCM, engine: engine) }
            }
        }
    }

    func open(
        _ sealed: [UInt8], ad: [UInt8], _ engine: AEAD.GCMEngine, key given: SecureBytes? = nil,
        prepared: PreparedGCMKey? = nil
    ) -> [UInt8]? {
        var out = [UInt8](repeating: 0xEE, count: max(0, sealed.count - ItemSealing.aes256GCM.overhead))
        var opened = true
        let key = given ?? self.key
        key.withUnsafeBytes { k in
            sealed.withUnsafeBytes { box in
                ad.withUnsafeBytes { a in
                    out.withUnsafeMutableBytes { o in
                        do throws(KeychainError) {
                            try AEAD.open(
                                box, key: k, ad: a, into: o, what: "t", sealing: .aes256GCM, engine: engine,
                                prepared: prepared)
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

    /// The published AES-256-GCM test vector (test case 16 of McGrew and Viega's GCM specification:
    /// 256-bit key, 96-bit IV, 20 bytes of associated data, 60 of plaintext) opens through each library
    /// to its plaintext — so the box layout (nonce ‖ ciphertext ‖ tag) is GCM's, not just a format the
    /// two libraries happen to share — and does not open with a changed tag.
    @Test func theGCMSpecificationsTestCase16Opens() throws {
        func hex(_ s: String) -> [UInt8] {
            stride(from: 0, to: s.count, by: 2).map {
                let i = s.index(s.startIndex, offsetBy: $0)
                return UInt8(s[i..<s.index(i, offsetBy: 2)], radix: 16)!
            }
        }
        let key = try hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308").withUnsafeBytes {
            try SecureBytes(copying: $0)
        }
        let plain = hex(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
        )
        let ad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
        let box =
            hex("cafebabefacedbaddecaf888")
            + hex(
                "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
            ) + hex("76fc6ece0f4e1768cddf8853bb2d551b")
        let engines: [AEAD.GCMEngine] = AEAD.machineGCMEngine == .libsodium ? [.libsodium, .libgcrypt] : [.libgcrypt]
        for engine in engines {
            #expect(open(box, ad: ad, engine, key: key) == plain, "\(engine)")
            var changed = box
            changed[changed.count - 1] ^= 1
            #expect(open(changed, ad: ad, engine, key: key) == nil, "\(engine): a changed tag")
        }
    }

    /// What one library seals the other opens, for empty, short and multi-block plaintexts and
    /// associated data; neither opens a box with a changed byte, tag or associated data.
    @Test func libsodiumAndLibgcryptAgree() {
        let engines: [AEAD.GCMEngine] = AEAD.machineGCMEngine == .libsodium ? [.libsodium, .libgcrypt] : [.libgcrypt]
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

    /// A class key's schedule (what the vault keeps beside it) opens exactly what the key opens: the
    /// specification's vector, and both libraries' boxes; a changed byte, other associated data or
    /// another key's schedule opens nothing and leaves no plaintext. Without AES-NI there is none.
    @Test func aPreparedKeyOpensWhatItsKeyOpens() throws {
        guard AEAD.machineGCMEngine == .libsodium else {
            #expect(key.withUnsafeBytes { PreparedGCMKey(key: $0) } == nil, "no schedule where libsodium has no GCM")
            return
        }
        let prepared = try #require(key.withUnsafeBytes { PreparedGCMKey(key: $0) })
        let other = try #require(try SecureBytes(random: AEAD.keyBytes).withUnsafeBytes { PreparedGCMKey(key: $0) })
        #expect("\(prepared)" == "PreparedGCMKey" && String(reflecting: prepared) == "PreparedGCMKey")
        for length in [0, 1, 32, 100] {
            let plain = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 5 &+ 1) }
            for ad in [[], [UInt8](repeating: 4, count: 45)] {
                for sealer in [AEAD.GCMEngine.libsodium, .libgcrypt] {
                    let sealed = seal(plain, ad: ad, sealer)
                    #expect(open(sealed, ad: ad, .libsodium, prepared: prepared) == plain, "\(sealer), \(length) bytes")
                    var changed = sealed
                    changed[sealed.count - 1] ^= 1
                    #expect(open(changed, ad: ad, .libsodium, prepared: prepared) == nil, "a changed tag")
                    #expect(open(sealed, ad: ad + [1], .libsodium, prepared: prepared) == nil, "other data")
                    #expect(open(sealed, ad: ad, .libsodium, prepared: other) == nil, "another key's schedule")
                }
            }
        }
    }
}
