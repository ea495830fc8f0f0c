import CSodium

/// A long-lived AES-256-GCM key with its schedule already computed (libsodium's `beforenm`: the AES
/// round keys and the GHASH key powers), in guarded memory like `SecureBytes`: `sodium_malloc`,
/// read-only once made, zeroed and unmapped by `sodium_free` on deinit.
///
/// The vault keeps one beside each class key in memory, made with it and dropped with it, so that
/// opening an item key does not expand the class key again on every read (about 170 instructions of
/// a cached copy's 7 350). It holds nothing the class key beside it does not: whoever can read one can
/// read the other. Only opening uses it: sealing goes through `AEAD.sealKey`, as before.
///
/// Exists only where libsodium runs AES-256-GCM (`init?` is nil without AES-NI; libgcrypt opens those
/// rows from the key itself).
public final class PreparedGCMKey: @unchecked Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    // Safety: the state is written only inside the initialiser and read-only afterwards.
    private let state: UnsafeMutablePointer<crypto_aead_aes256gcm_state>

    /// The schedule of `key` (32 bytes); nil where libsodium does not run AES-256-GCM, or when no
    /// guarded memory is left for it (the class key then opens items by itself).
    public init?(key: UnsafeRawBufferPointer) {
        precondition(key.count == AEAD.keyBytes, "an AES-256-GCM key must be \(AEAD.keyBytes) bytes")
        guard AEAD.machineGCMEngine == .libsodium else { return nil }
        let size = MemoryLayout<crypto_aead_aes256gcm_state>.size
        precondition(crypto_aead_aes256gcm_statebytes() == size, "libsodium's AES-256-GCM state changed size")
        // sodium_malloc places the region at the end of its pages: a size that is a multiple of the
        // state's alignment (16) keeps the address aligned.
        // Without guarded memory for it, the class key alone opens items (a little slower): nil.
        guard let raw = sodium_malloc(size) else { return nil }
        precondition(Int(bitPattern: raw) % 16 == 0, "sodium_malloc returned a misaligned AES-256-GCM state")
        state = raw.bindMemory(to: crypto_aead_aes256gcm_state.self, capacity: 1)
        _ = crypto_aead_aes256gcm_beforenm(state, key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        guard sodium_mprotect_readonly(raw) == 0 else {
            sodium_free(raw)
            return nil
        }
    }

    /// Opens `count` bytes of ciphertext (followed by its 16-byte tag at `input + count`) into
    /// `output` under `nonce` and `ad`; false when the box does not authenticate.
    func open(
        _ output: UnsafeMutablePointer<UInt8>, _ input: UnsafePointer<UInt8>, _ count: Int,
        _ ad: UnsafeRawBufferPointer, _ nonce: UnsafePointer<UInt8>
    ) -> Bool {
        var written: UInt64 = 0
        let rc = crypto_aead_aes256gcm_decrypt_afternm(
            output, &written, nil, input, UInt64(count + AEAD.tagBytes),
            ad.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(ad.count), nonce, state)
        return rc == 0 && Int(written) == count
    }

    deinit {
        sodium_free(state)  // makes the region writable, zeroes it, unmaps it
    }

    /// `PreparedGCMKey`: never the schedule.
    public var description: String { "PreparedGCMKey" }
    /// The same as `description`.
    public var debugDescription: String { description }
}
