import KeychainCore
import KeychainCrypto
import KeychainSystem
import Testing

@testable import KeychainSync

@Suite struct PairingTests {
    let deviceA = [UInt8](repeating: 0xA, count: 16)
    let deviceB = [UInt8](repeating: 0xB, count: 16)
    let deviceC = [UInt8](repeating: 0xC, count: 16)
    let signing = [UInt8](repeating: 7, count: 32)

    /// B, typing A's code, gets A's sync key and the paired devices' signing keys, and A gets B's
    /// signing key; everything that passed through the folder is public keys, a sealed box and MACs:
    /// no copy of the sync key.
    @Test func theCodeCarriesTheKeyToTheNewDevice() throws {
        let key = try SyncKey.fresh(epoch: 3)
        let (text, codeA) = try Pairing.newCode()
        #expect(text.filter { $0 != "-" }.count == 26)
        let codeB = try Pairing.code(String(text.lowercased().map { $0 == "-" ? " " : $0 }))
        #expect(codeA.requestName == codeB.requestName)
        let (pk, sk) = try SealedBox.keyPair()
        let (signB, _) = try Signature.keyPair()
        let (signA, _) = try Signature.keyPair()
        let (signC, _) = try Signature.keyPair()
        let request = Pairing.request(codeB, publicKey: pk, device: deviceB, signingKey: signB)
        let (gotPK, gotDevice, gotSign) = try Pairing.openRequest(request, code: codeA)
        #expect(gotPK == pk && gotDevice == deviceB && gotSign == signB)
        let roster = [deviceA: signA, deviceB: signB, deviceC: signC]
        let reply = try Pairing.reply(codeA, to: gotPK, key: key, device: deviceA, devices: roster)
        let (received, from, devices) = try Pairing.openReply(reply, code: codeB, publicKey: pk, secretKey: sk)
        #expect(from == deviceA && received.epoch == 3)
        #expect(devices == roster)
        #expect(received.raw.withUnsafeBytes { Array($0) } == key.raw.withUnsafeBytes { Array($0) })
        let rawKey = key.raw.withUnsafeBytes { Array($0) }
        for blob in [request, reply] {
            #expect(!blob.indices.contains { i in i + 32 <= blob.count && Array(blob[i..<(i + 32)]) == rawKey })
        }
    }

    /// The folder's host, without the code, cannot have A seal the key to a public key of its own: its
    /// request fails A's check. Nor can it swap the key in a reply: B sees the reply was not for it.
    @Test func theFolderHostCannotSubstituteItsKey() throws {
        let key = try SyncKey.fresh(epoch: 1)
        let (_, codeA) = try Pairing.newCode()
        let (_, guess) = try Pairing.newCode()
        let (hostPK, _) = try SealedBox.keyPair()
        let forged = Pairing.request(guess, publicKey: hostPK, device: deviceB, signingKey: signing)
        #expect(throws: KeychainError.self) { try Pairing.openRequest(forged, code: codeA) }

        let (pk, sk) = try SealedBox.keyPair()
        var request = Pairing.request(codeA, publicKey: pk, device: deviceB, signingKey: signing)
        request[10] ^= 1  // the host swaps a byte of B's public key
        #expect(throws: KeychainError.self) { try Pairing.openRequest(request, code: codeA) }
        request[10] ^= 1
        request[request.count - 40] ^= 1  // or of B's signing key
        #expect(throws: KeychainError.self) { try Pairing.openRequest(request, code: codeA) }

        // One who knows the code (shoulder-surfing) answers for a key of its own: B refuses that reply.
        let stolen = try Pairing.reply(codeA, to: hostPK, key: key, device: deviceA, devices: [:])
        #expect(throws: KeychainError.self) {
            try Pairing.openReply(stolen, code: codeA, publicKey: pk, secretKey: sk)
        }
    }

    /// A mistyped code is errSecParam with a message; a code of the right shape but wrong value fails
    /// the MAC (errSecAuthFailed).
    @Test func badCodesAreRefused() throws {
        #expect(throws: KeychainError.self) { try Pairing.code("ABC") }
        #expect(throws: KeychainError.self) { try Pairing.code("AAAAA-AAAAA-AAAAA-AAAAA-AAAA1") }
        let (text, codeA) = try Pairing.newCode()
        var chars = Array(text)
        chars[0] = chars[0] == "A" ? "B" : "A"
        let wrong = try Pairing.code(String(chars))
        let (pk, _) = try SealedBox.keyPair()
        do {
            _ = try Pairing.openRequest(
                Pairing.request(wrong, publicKey: pk, device: deviceB, signingKey: signing), code: codeA)
            Issue.record("a request made with another code was accepted")
        } catch {
            #expect(error.status == .authFailed)
        }
    }
}
