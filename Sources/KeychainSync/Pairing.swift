public import KeychainCore
public import KeychainCrypto
import KeychainSystem

/// Pairing a new device through the sync folder (docs/sync.md). Device A shows a one-time code: 128
/// random bits as 26 base32 characters. Device B, given the code, posts its fresh X25519 public key
/// and its signing public key in the folder with a MAC under a key derived from the code; A checks the
/// MAC, records B's signing key, and answers with the sync key and the paired devices' signing keys
/// sealed to that public key (`crypto_box_seal`), MAC'd the same way. What passes through the folder
/// is a public key, a sealed box and two MACs: the folder's host, without the code, can neither open the
/// box nor substitute its own public key (it cannot make the MAC).
public enum Pairing {
    /// Bytes of secret in a code (128 bits).
    public static let codeBytes = 16
    static let requestMagic: [UInt8] = Array("KCPAIRQ2".utf8)
    static let replyMagic: [UInt8] = Array("KCPAIRR2".utf8)
    static let macBytes = 32
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)

    /// The code's secret, in guarded memory, and what is derived from it.
    public final class Code: Sendable {
        let macKey: SecureBytes
        /// Names the pairing's two files in the folder: derived from the code, says nothing of it.
        public let stem: String

        init(secret: SecureBytes) throws(KeychainError) {
            macKey = try KeyedHash.deriveKey(from: secret, label: "keychaind sync pairing mac v1")
            let idKey = try KeyedHash.deriveKey(from: secret, label: "keychaind sync pairing name v1")
            stem = "pair-" + idKey.withUnsafeBytes { SyncHex.encode($0.prefix(8)) }
        }

        /// The file B writes in the folder.
        public var requestName: String { stem + ".request" }
        /// The file A answers with.
        public var replyName: String { stem + ".reply" }

        func mac(_ domain: UInt8, _ payload: [UInt8]) -> [UInt8] {
            macKey.withUnsafeBytes { KeyedHash.hash(key: $0, domain: domain, parts: [payload], length: macBytes) }
        }

        func checked(_ data: [UInt8], _ domain: UInt8, _ magic: [UInt8], what: String) throws(KeychainError)
            -> [UInt8]
        {
            guard data.count > magic.count + macBytes, Array(data.prefix(magic.count)) == magic else {
                throw KeychainError(.decode, "the pairing \(what) is not one")
            }
            let payload = Array(data.dropLast(macBytes))
            guard Sodium.equal(mac(domain, payload), Array(data.suffix(macBytes))) else {
                throw KeychainError(.authFailed, "the pairing \(what) was not made with this code")
            }
            return payload
        }
    }

    /// A new code: the text to show (26 characters in groups of five or six) and its secret.
    public static func newCode() throws(KeychainError) -> (text: String, code: Code) {
        var raw = Sodium.randomBytes(codeBytes)
        defer { Sodium.zero(&raw) }
        let text = grouped(base32(raw))
        let secret = try withBytes(raw) { (b) throws(KeychainError) in try SecureBytes(copying: b) }
        return (text, try Code(secret: secret))
    }

    /// The code typed on the other device: case, spaces and dashes do not matter. errSecParam when
    /// it is not a code (a wrong character or length).
    public static func code(_ typed: String) throws(KeychainError) -> Code {
        let chars = typed.uppercased().utf8.filter { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "-") }
        guard chars.count == 26 else { throw .param("a pairing code has 26 letters and digits") }
        var bits: UInt64 = 0
        var n = 0
        var raw: [UInt8] = []
        defer { Sodium.zero(&raw) }
        for c in chars {
            guard let v = alphabet.firstIndex(of: c) else {
                throw .param("a pairing code has only the letters A–Z and the digits 2–7")
            }
            bits = bits << 5 | UInt64(v)
            n += 5
            if n >= 8 {
                raw.append(UInt8(truncatingIfNeeded: bits >> UInt64(n - 8)))
                n -= 8
            }
        }
        raw = Array(raw.prefix(codeBytes))
        let secret = try withBytes(raw) { (b) throws(KeychainError) in try SecureBytes(copying: b) }
        return try Code(secret: secret)
    }

    /// B's request: its public key, device identifier and signing public key, MAC'd under the code.
    public static func request(_ code: Code, publicKey: [UInt8], device: [UInt8], signingKey: [UInt8]) -> [UInt8] {
        let payload = requestMagic + publicKey + device + signingKey
        return payload + code.mac(0x50, payload)
    }

    /// A reads B's request: errSecAuthFailed when it was not made with the code.
    public static func openRequest(_ data: [UInt8], code: Code) throws(KeychainError) -> (
        publicKey: [UInt8], device: [UInt8], signingKey: [UInt8]
    ) {
        let payload = try code.checked(data, 0x50, requestMagic, what: "request")
        let start = requestMagic.count
        guard payload.count == start + SealedBox.publicKeyBytes + SyncFile.deviceBytes + Signature.publicKeyBytes
        else {
            throw KeychainError(.decode, "the pairing request is malformed")
        }
        let pk = Array(payload[start..<(start + SealedBox.publicKeyBytes)])
        let d = start + SealedBox.publicKeyBytes
        return (pk, Array(payload[d..<(d + SyncFile.deviceBytes)]), Array(payload.suffix(Signature.publicKeyBytes)))
    }

    /// A's reply: the sync key, its epoch, A's device identifier and the signing key of every device
    /// A records as paired (A's own and B's among them), sealed to B's public key, MAC'd under the code
    /// together with that public key.
    public static func reply(
        _ code: Code, to publicKey: [UInt8], key: SyncKey, device: [UInt8], devices: [[UInt8]: [UInt8]]
    ) throws(KeychainError) -> [UInt8] {
        var plain = SyncFile.bigEndian(UInt64(key.epoch), 4) + key.raw.withUnsafeBytes { Array($0) } + device
        for d in devices.keys.sorted(by: { $0.lexicographicallyPrecedes($1) }) { plain += d + devices[d]! }
        defer { Sodium.zero(&plain) }
        let sealed = try withBytes(plain) { (p) throws(KeychainError) in try SealedBox.seal(p, to: publicKey) }
        let payload = replyMagic + publicKey + sealed
        return payload + code.mac(0x51, payload)
    }

    /// B reads A's reply with its key pair: the sync key, A's device identifier and the paired
    /// devices' signing keys.
    public static func openReply(_ data: [UInt8], code: Code, publicKey: [UInt8], secretKey: SecureBytes)
        throws(KeychainError) -> (key: SyncKey, device: [UInt8], devices: [[UInt8]: [UInt8]])
    {
        let payload = try code.checked(data, 0x51, replyMagic, what: "reply")
        let start = replyMagic.count
        guard payload.count > start + SealedBox.publicKeyBytes else {
            throw KeychainError(.decode, "the pairing reply is malformed")
        }
        guard Array(payload[start..<(start + SealedBox.publicKeyBytes)]) == publicKey else {
            throw KeychainError(
                .authFailed,
                "the pairing reply was made for another device's key: someone else who knows the code answered first; pair again with a new code"
            )
        }
        let opened = try SealedBox.open(
            Array(payload[(start + SealedBox.publicKeyBytes)...]), publicKey: publicKey, secretKey: secretKey)
        let fixed = 4 + SyncKey.length + SyncFile.deviceBytes
        let entry = SyncFile.deviceBytes + Signature.publicKeyBytes
        guard opened.count >= fixed, (opened.count - fixed) % entry == 0 else {
            throw KeychainError(.decode, "the pairing reply is malformed")
        }
        return try opened.withUnsafeBytes { (b) throws(KeychainError) in
            var epoch: UInt32 = 0
            for i in 0..<4 { epoch = epoch << 8 | UInt32(b[i]) }
            let raw = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[4..<(4 + SyncKey.length)]))
            var devices: [[UInt8]: [UInt8]] = [:]
            var at = fixed
            while at < b.count {
                devices[Array(b[at..<(at + SyncFile.deviceBytes)])] = Array(
                    b[(at + SyncFile.deviceBytes)..<(at + entry)])
                at += entry
            }
            return (
                try SyncKey(raw: raw, epoch: epoch), Array(b[(4 + SyncKey.length)..<fixed]), devices
            )
        }
    }

    static func base32(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var bits: UInt64 = 0
        var n = 0
        for b in bytes {
            bits = bits << 8 | UInt64(b)
            n += 8
            while n >= 5 {
                out.append(alphabet[Int((bits >> UInt64(n - 5)) & 31)])
                n -= 5
            }
        }
        if n > 0 { out.append(alphabet[Int((bits << UInt64(5 - n)) & 31)]) }
        return String(decoding: out, as: UTF8.self)
    }

    static func grouped(_ s: String) -> String {
        var parts: [String] = []
        var rest = Substring(s)
        while !rest.isEmpty {
            parts.append(String(rest.prefix(rest.count == 6 ? 6 : 5)))
            rest = rest.dropFirst(rest.count == 6 ? 6 : 5)
        }
        return parts.joined(separator: "-")
    }
}
