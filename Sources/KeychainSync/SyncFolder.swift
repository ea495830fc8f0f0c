public import KeychainCore
import KeychainCrypto
import KeychainSystem

/// Reading and writing the sync folder. keychaind writes only its own file there (`<device>.kcsync`,
/// replaced atomically: written under a temporary name, synced, renamed) and reads every file named
/// `*.kcsync`, including the copies Syncthing keeps of concurrent versions (`*.sync-conflict-*`).
public enum SyncFolder {
    /// What reading one file did.
    public enum FileResult: Equatable, Sendable {
        /// Merged: this many items took the file's version.
        case merged(device: [UInt8], sequence: UInt64, adopted: Int)
        /// Not newer than a file already read from that device (a replayed or repeated file): skipped.
        case stale(device: [UInt8], sequence: UInt64)
        /// Written under another sync key (a rotation this device did not take part in, or an old one).
        case otherKey(device: [UInt8], epoch: UInt32)
        /// Unreadable (half-written, damaged, tampered with, not ours): changed nothing.
        case damaged(reason: String)
    }

    /// One file's name and what reading it did.
    public struct Report: Sendable {
        /// Each file read, by name, with what reading it did.
        public var results: [(name: String, result: FileResult)] = []
        /// The items whose winning version changed (the store must follow).
        public var adopted: Set<[UInt8]> = []
        /// An empty report.
        public init() {}
        /// The files that could not be read, with why.
        public var damaged: [(name: String, reason: String)] {
            results.compactMap { if case .damaged(let r) = $0.result { return ($0.name, r) } else { return nil } }
        }
    }

    /// The names of the sync files in `folder`, sorted.
    public static func fileNames(in folder: String) -> [String] {
        (FileSystem.contentsOfDirectory(folder) ?? []).filter { $0.hasSuffix(SyncFile.suffix) && !$0.hasPrefix(".") }
            .sorted()
    }

    /// Reads one file's bytes and merges it into `state` when it is sound and newer than what was
    /// read from its device before. `state` is untouched unless the whole file opened.
    public static func merge(
        _ data: [UInt8], key: SyncKey, into state: inout SyncState, adopted: inout Set<[UInt8]>
    ) -> FileResult {
        let header: SyncFile.Header
        do { header = try SyncFile.header(of: data) } catch { return .damaged(reason: error.message) }
        guard header.epoch == key.epoch else { return .otherKey(device: header.device, epoch: header.epoch) }
        if let known = state.devices[header.device], known.sequence >= header.sequence {
            return .stale(device: header.device, sequence: header.sequence)
        }
        let other: SyncState
        do { (_, other) = try SyncFile.open(data, key: key) } catch { return .damaged(reason: error.message) }
        let ids = state.merge(other)
        for id in ids { adopted.insert(id) }
        var p = state.devices[header.device] ?? SyncState.DeviceProgress()
        p.sequence = header.sequence
        state.devices[header.device] = p
        return .merged(device: header.device, sequence: header.sequence, adopted: ids.count)
    }

    /// Reads every sync file in `folder` into `state`.
    public static func read(folder: String, key: SyncKey, into state: inout SyncState) -> Report {
        var report = Report()
        for name in fileNames(in: folder) {
            let path = folder + "/" + name
            let data: [UInt8]
            switch readFile(path) {
            case .success(let d): data = d
            case .failure(let e):
                report.results.append((name, .damaged(reason: e.message)))
                continue
            }
            report.results.append((name, merge(data, key: key, into: &state, adopted: &report.adopted)))
        }
        return report
    }

    /// A file of the folder, read only when it is a regular file (not a FIFO, device or symbolic
    /// link: whoever can write the folder could otherwise make the reader wait for ever or read
    /// without end) of at most `SyncFile.maximumBytes`.
    public static func readFile(_ path: String) -> Result<[UInt8], KeychainError> {
        do throws(Errno) {
            let fd = try FileDescriptor.open(path, [.readOnly, .noFollow, .nonBlocking])
            defer { fd.close() }
            let st = try fd.status()
            guard st.kind == .regular else { return .failure(KeychainError(.decode, "not a regular file")) }
            guard st.size <= Int64(SyncFile.maximumBytes) else {
                return .failure(KeychainError(.decode, "larger than \(SyncFile.maximumBytes) bytes"))
            }
            return .success(try fd.readToEnd())
        } catch {
            return .failure(KeychainError(.io, "cannot be read (\(error.message))"))
        }
    }

    /// Replaces `path` with `bytes` atomically: a temporary file beside it (a name no reader takes),
    /// fsync, rename, fsync of the directory.
    public static func writeAtomically(_ bytes: [UInt8], to path: String) throws(KeychainError) {
        let directory = FileSystem.parentDirectory(of: path)
        let name = String(path.dropFirst(directory.count + 1))
        let temporary = directory + "/.\(name).tmp"
        do {
            FileSystem.removeIfPresent(temporary)
            let fd = try FileDescriptor.open(
                temporary, [.writeOnly, .create, .exclusive, .noFollow], permissions: 0o600)
            try fd.writeAll(bytes)
            try fd.sync()
            fd.close()
            try FileSystem.rename(temporary, to: path)
            try FileSystem.syncDirectory(directory)
        } catch {
            FileSystem.removeIfPresent(temporary)
            throw KeychainError(.io, "cannot write \(path)", error)
        }
    }
}
