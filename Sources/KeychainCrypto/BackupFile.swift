import CSodium
public import KeychainCore
public import KeychainSystem

/// The backup file format (docs/backup.md): a fixed header, then records of one
/// `crypto_secretstream_xchacha20poly1305` stream keyed by Argon2id of the backup passphrase.
///
/// ```
/// header (62 bytes)
///   magic    8  "KCBACKUP"
///   version  1  1
///   kdf      1  2 (crypto_pwhash_ALG_ARGON2ID13)
///   ops      4  big-endian opslimit
///   mem      8  big-endian memlimit in bytes
///   salt    16  Argon2id salt
///   stream  24  secretstream header
/// records, each: length 4 (big-endian, of the ciphertext) ‖ secretstream ciphertext (plaintext + 17)
///   record 0      TAG_MESSAGE, associated data = the 62 header bytes; CBOR map of metadata
///   records 1…n   TAG_MESSAGE; CBOR map {"ref": bytes, "attributes": map, "secret": bytes}
///   last record   TAG_FINAL; CBOR map {"count": n}
/// nothing after the final record.
/// ```
/// Every plaintext byte is encrypted and authenticated; reordering, dropping, truncating or
/// appending records fails to open (errSecDecode), a wrong passphrase fails on record 0
/// (errSecAuthFailed).
public enum BackupFile {
    /// The 8 bytes every backup file starts with (`KCBACKUP`).
    public static let magic: [UInt8] = Array("KCBACKUP".utf8)
    /// The format version written and the only one read.
    public static let version: UInt8 = 1
    /// Length of the fixed header in bytes (62): magic, version, KDF id and costs, salt, stream header.
    public static let headerBytes = 8 + 1 + 1 + 4 + 8 + KDFParameters.saltBytes + streamHeaderBytes
    static let streamHeaderBytes = Int(crypto_secretstream_xchacha20poly1305_headerbytes())
    static let streamABytes = Int(crypto_secretstream_xchacha20poly1305_abytes())
    /// Largest record plaintext accepted when reading (a forged length must not allocate gigabytes).
    public static let maxRecordBytes = 64 << 20

    /// Writes a backup: `metadata`, then `append` each item, then `finish`.
    public final class Writer {
        private let state: UnsafeMutablePointer<crypto_secretstream_xchacha20poly1305_state>
        private var output: [UInt8]
        private var count = 0
        private var finished = false

        /// Derives the key from `passphrase` (Argon2id, slow) and starts the file with its header and `metadata`.
        public init(passphrase: SecureBytes, parameters: KDFParameters, metadata: [String: Value]) throws(KeychainError)
        {
            Sodium.ensureInitialized()
            let key = try PasswordHash.derive(passphrase, parameters)
            let state = UnsafeMutablePointer<crypto_secretstream_xchacha20poly1305_state>.allocate(capacity: 1)
            state.initialize(to: crypto_secretstream_xchacha20poly1305_state())
            self.state = state
            var header: [UInt8] = magic
            header.append(version)
            header.append(UInt8(KDFParameters.algorithm))
            header += bigEndian(parameters.opsLimit, bytes: 4)
            header += bigEndian(parameters.memLimit, bytes: 8)
            header += parameters.salt
            var streamHeader = [UInt8](repeating: 0, count: streamHeaderBytes)
            let rc = key.withUnsafeBytes { k in
                crypto_secretstream_xchacha20poly1305_init_push(
                    state, &streamHeader, k.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
            guard rc == 0 else {
                state.deallocate()
                throw KeychainError(.internal, "cannot start the backup's encrypted stream")
            }
            header += streamHeader
            output = header
            push(CBOR.encode(.map(metadata)), ad: header, tag: crypto_secretstream_xchacha20poly1305_tag_message())
        }

        deinit {
            Sodium.zero(
                UnsafeMutableRawBufferPointer(
                    start: state, count: MemoryLayout<crypto_secretstream_xchacha20poly1305_state>.size))
            state.deallocate()
        }

        /// Adds one item record. The plaintext is wiped after encryption.
        public func append(ref: [UInt8], attributes: [String: Value], secret: SecretBytes) {
            precondition(!finished)
            var plain = SecretBytes(capacity: 128 + secret.count)
            CBOR.encode(
                .map(["ref": .bytes(ref), "attributes": .map(attributes), "secret": .secret(secret)]), into: &plain)
            plain.withUnsafeBytes { push($0, ad: [], tag: crypto_secretstream_xchacha20poly1305_tag_message()) }
            count += 1
        }

        /// The file's bytes, ending with the final record.
        public func finish() -> [UInt8] {
            precondition(!finished)
            finished = true
            push(
                CBOR.encode(.map(["count": .int(Int64(count))])), ad: [],
                tag: crypto_secretstream_xchacha20poly1305_tag_final())
            return output
        }

        private func push(_ plain: [UInt8], ad: [UInt8], tag: UInt8) {
            plain.withUnsafeBytes { push($0, ad: ad, tag: tag) }
        }

        private func push(_ plain: UnsafeRawBufferPointer, ad: [UInt8], tag: UInt8) {
            let total = plain.count + streamABytes
            output += bigEndian(UInt64(total), bytes: 4)
            let start = output.count
            output += [UInt8](repeating: 0, count: total)
            output.withUnsafeMutableBufferPointer { out in
                ad.withUnsafeBufferPointer { a in
                    var written: UInt64 = 0
                    let p = plain.baseAddress.map { UnsafePointer($0.assumingMemoryBound(to: UInt8.self)) }
                    let rc = crypto_secretstream_xchacha20poly1305_push(
                        state, out.baseAddress! + start, &written,
                        p ?? UnsafePointer(bitPattern: 1), UInt64(plain.count),
                        a.baseAddress, UInt64(a.count), tag)
                    precondition(rc == 0 && Int(written) == total, "secretstream push failed")
                }
            }
        }
    }

    /// An opened backup: its metadata and items, all authenticated.
    public struct Contents {
        /// The metadata record the backup was written with (record 0).
        public var metadata: [String: Value]
        /// The items, in the order they were written.
        public var items: [Item]
        /// The Argon2id parameters from the header, which derived the backup's key.
        public var parameters: KDFParameters
    }

    /// One item record of a backup; `secret` is the item's plaintext secret, in wiping storage from
    /// the moment it is decrypted (also when a later record turns out damaged and `open` throws).
    public struct Item: CustomStringConvertible, CustomReflectable {
        /// The item's persistent reference, as it was in the backed-up keychain.
        public var ref: [UInt8]
        /// The item's attributes (CBOR map), without its secret.
        public var attributes: [String: Value]
        /// The item's secret bytes in plaintext; never logged or shown.
        public var secret: SecretBytes

        /// The record's shape only: never an attribute's value or the secret.
        public var description: String {
            "backup item (\(attributes.count) attributes, secret \(secret.count) bytes)"
        }
        /// No children for `dump` and debuggers: the shape only, as `description`.
        public var customMirror: Mirror { Mirror(self, children: [:]) }
    }

    /// Parses the header (no key needed): what the file says about itself.
    public static func parameters(of data: [UInt8]) throws(KeychainError) -> KDFParameters {
        guard data.count >= headerBytes, Array(data[0..<8]) == magic else {
            throw KeychainError(.decode, "not a keychaind backup file")
        }
        guard data[8] == version else {
            throw KeychainError(
                .decode, "backup format version \(data[8]) is not supported (this keychaind reads version \(version))")
        }
        guard Int32(data[9]) == KDFParameters.algorithm else {
            throw KeychainError(.decode, "the backup names an unknown key-derivation algorithm (\(data[9]))")
        }
        let ops = readBigEndian(data, at: 10, bytes: 4)
        let mem = readBigEndian(data, at: 14, bytes: 8)
        return try KDFParameters(opsLimit: ops, memLimit: mem, salt: Array(data[22..<(22 + KDFParameters.saltBytes)]))
    }

    /// Decrypts and checks the whole file. A wrong passphrase is errSecAuthFailed; anything damaged,
    /// truncated or extended is errSecDecode. The caller wipes the secrets when done.
    public static func open(_ data: [UInt8], passphrase: SecureBytes) throws(KeychainError) -> Contents {
        let parameters = try parameters(of: data)
        let header = Array(data[0..<headerBytes])
        let key = try PasswordHash.derive(passphrase, parameters)
        return try withUnsafeTemporaryAllocation(of: crypto_secretstream_xchacha20poly1305_state.self, capacity: 1) {
            (buffer) throws(KeychainError) -> Contents in
            let state = buffer.baseAddress!
            defer { Sodium.zero(UnsafeMutableRawBufferPointer(buffer)) }
            let rc = key.withUnsafeBytes { k in
                header.withUnsafeBufferPointer { h in
                    crypto_secretstream_xchacha20poly1305_init_pull(
                        state, h.baseAddress! + (headerBytes - streamHeaderBytes),
                        k.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
            guard rc == 0 else { throw KeychainError(.decode, "the backup's stream header is damaged") }
            var offset = headerBytes
            var tag: UInt8 = 0

            func next(ad: [UInt8], first: Bool = false) throws(KeychainError) -> [UInt8] {
                guard offset + 4 <= data.count else { throw KeychainError(.decode, "the backup file is truncated") }
                let length = Int(readBigEndian(data, at: offset, bytes: 4))
                offset += 4
                guard length >= streamABytes, length - streamABytes <= maxRecordBytes, offset + length <= data.count
                else {
                    throw KeychainError(.decode, "the backup file is truncated or damaged")
                }
                var plain = [UInt8](repeating: 0, count: length - streamABytes)
                let rc = plain.withUnsafeMutableBufferPointer { p in
                    data.withUnsafeBufferPointer { d in
                        ad.withUnsafeBufferPointer { a in
                            var dummy: UInt8 = 0
                            return withUnsafeMutablePointer(to: &dummy) { dp in
                                crypto_secretstream_xchacha20poly1305_pull(
                                    state, p.baseAddress ?? dp, nil, &tag, d.baseAddress! + offset, UInt64(length),
                                    a.baseAddress, UInt64(a.count))
                            }
                        }
                    }
                }
                offset += length
                guard rc == 0 else {
                    Sodium.zero(&plain)
                    if first {
                        throw KeychainError(.authFailed, "wrong backup passphrase (or the backup file is damaged)")
                    }
                    throw KeychainError(.decode, "the backup file is damaged (a record failed authentication)")
                }
                return plain
            }

            // A record's `secret` goes straight from the zeroed record into wiping storage.
            func map(_ plain: inout [UInt8]) throws(KeychainError) -> [String: Value] {
                defer { Sodium.zero(&plain) }
                guard let m = (try? CBOR.decode(plain, limits: .default, secretKeys: ["secret"]))?.map else {
                    throw KeychainError(.decode, "the backup file holds a malformed record")
                }
                return m
            }

            var first = try next(ad: header, first: true)
            guard tag == crypto_secretstream_xchacha20poly1305_tag_message() else {
                throw KeychainError(.decode, "the backup file is damaged (unexpected first record)")
            }
            let metadata = try map(&first)
            var items: [Item] = []
            while true {
                var plain = try next(ad: [])
                let record = try map(&plain)
                if tag == crypto_secretstream_xchacha20poly1305_tag_final() {
                    guard record["count"]?.int == Int64(items.count) else {
                        throw KeychainError(.decode, "the backup file is damaged (item count does not match)")
                    }
                    break
                }
                guard tag == crypto_secretstream_xchacha20poly1305_tag_message(),
                    let ref = record["ref"]?.bytes, let attributes = record["attributes"]?.map,
                    let secret = record["secret"]?.secretBytes
                else {
                    throw KeychainError(.decode, "the backup file holds a malformed item record")
                }
                items.append(Item(ref: ref, attributes: attributes, secret: secret))
            }
            guard offset == data.count else {
                throw KeychainError(.decode, "the backup file has bytes after its final record")
            }
            return Contents(metadata: metadata, items: items, parameters: parameters)
        }
    }

    static func bigEndian(_ v: UInt64, bytes: Int) -> [UInt8] {
        (0..<bytes).map { UInt8(truncatingIfNeeded: v >> (8 * UInt64(bytes - 1 - $0))) }
    }

    static func readBigEndian(_ data: [UInt8], at offset: Int, bytes: Int) -> UInt64 {
        var v: UInt64 = 0
        for i in 0..<bytes { v = v << 8 | UInt64(data[offset + i]) }
        return v
    }
}
