import KeychainCore
import KeychainCrypto
import KeychainSystem

/// The highest row-state generation this keychain has committed, kept in a small file beside the
/// database (`keychain.db-generation`), so a whole `keychain.db` replaced by an older copy — whose
/// row-state record is consistent with its older rows — is noticed at start.
///
/// The file lags the database and never leads it: it is rewritten (atomically, fsynced) at most once
/// per `interval` after commits that advanced the generation, and at close, always with a generation
/// already committed. A crash can leave it behind by up to `interval` of commits, never ahead. A
/// missing or damaged file is recreated from the database (it cannot be told from a first start with
/// this feature); a process of the user's own uid can replace it as easily as the database, so it
/// guards against restores of the database file alone, not against the user's own processes.
final class GenerationMark {
    static let suffix = "-generation"
    static let interval = 1.0

    enum Reading: Equatable {
        case missing
        case damaged
        case generation(UInt64)
    }

    let path: String
    private let key: SecureBytes
    private var written: UInt64 = 0
    private var lastWrite = -Double.infinity

    init(databasePath: String, key: SecureBytes) {
        path = databasePath + Self.suffix
        self.key = key
    }

    /// `version ‖ generation (8, LE) ‖ tag (32)`.
    private func encode(_ generation: UInt64) -> [UInt8] {
        [1] + RowState.littleEndian(generation) + tag(generation)
    }

    private func tag(_ generation: UInt64) -> [UInt8] {
        key.withUnsafeBytes {
            KeyedHash.hash(
                key: $0, domain: 0xE2, parts: [RowState.littleEndian(generation), Array("generation mark".utf8)],
                length: 32)
        }
    }

    func read() -> Reading {
        let file: FileDescriptor
        do { file = try FileDescriptor.open(path, [.readOnly, .noFollow]) } catch {
            return error.code == .noEntry ? .missing : .damaged
        }
        var bytes = [UInt8](repeating: 0, count: 64)
        let n = try? withMutableBytes(&bytes) { (b) throws(Errno) in try file.read(into: b) }
        guard n == 41, bytes[0] == 1 else { return .damaged }
        let generation = RowState.readLittleEndian(bytes[1..<9])
        guard Sodium.equal(Array(bytes[9..<41]), tag(generation)) else { return .damaged }
        return .generation(generation)
    }

    /// Replaces the file with `generation` (write to a temporary name, fsync, rename, fsync the
    /// directory). Best effort: a failure leaves the previous mark, which is only ever lower, and the
    /// next try waits `interval` like a success does.
    @discardableResult
    func write(_ generation: UInt64) -> Bool {
        lastWrite = MonotonicClock.now()
        let temporary = path + ".tmp"
        do throws(Errno) {
            let file = try FileDescriptor.open(
                temporary, [.writeOnly, .create, .truncate, .noFollow], permissions: 0o600)
            try file.writeAll(encode(generation))
            try file.sync()
            file.close()
            try FileSystem.rename(temporary, to: path)
        } catch {
            FileSystem.removeIfPresent(temporary)
            return false
        }
        try? FileSystem.syncDirectory(FileSystem.parentDirectory(of: path))
        written = generation
        return true
    }

    /// The file already holds `generation` (read at open).
    func holds(_ generation: UInt64) { written = generation }

    /// After a commit: records `generation` if the last write is `interval` old.
    func committed(_ generation: UInt64) {
        guard generation > written, MonotonicClock.now() - lastWrite >= Self.interval else { return }
        write(generation)
    }

    /// At close: records `generation` if the file is behind it.
    func flush(_ generation: UInt64) {
        if generation > written { write(generation) }
    }
}
