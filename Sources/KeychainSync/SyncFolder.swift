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
        /// Not newer than what this device holds from that device (the same file again, or a
        /// replayed or old copy): skipped. `older` when a newer file of the device was read before.
        case stale(device: [UInt8], sequence: UInt64, older: Bool)
        /// Written under another sync key (a rotation this device did not take part in, or an old one).
        case otherKey(device: [UInt8], epoch: UInt32)
        /// Names a device that is not paired with this one (none recorded its signing key): changed nothing.
        case unknownDevice(device: [UInt8])
        /// Not signed by the key recorded for the device it names (forged, or tampered with): changed nothing.
        case badSignature(device: [UInt8])
        /// Unreadable (half-written, damaged, tampered with, not ours): changed nothing.
        case damaged(reason: String)
    }

    /// One file's name and what reading it did.
    public struct Report: Sendable {
        /// Each file read, by name, with what reading it did.
        public var results: [(name: String, result: FileResult)] = []
        /// The items whose winning version changed (the store must follow).
        public var adopted: Set<[UInt8]> = []
        /// The items another device's file shows were deleted everywhere (their tombstone collected)
        /// while this device still held an older version (the store must delete them).
        public var gone: Set<[UInt8]> = []
        /// Devices whose signing key a paired device's file gives otherwise than recorded here.
        public var disputedKeys: Set<[UInt8]> = []
        /// An empty report.
        public init() {}
        /// The files that changed nothing for a reason worth telling (damaged, forged, from an
        /// unknown device, an older copy of a device's file), with why.
        public var damaged: [(name: String, reason: String)] {
            results.compactMap { r in
                let reason: String
                switch r.result {
                case .damaged(let why): reason = why
                case .unknownDevice(let d):
                    reason = "names device \(SyncHex.encode(d)), which is not paired with this one: not read"
                case .badSignature(let d):
                    reason =
                        "not signed by the key recorded for device \(SyncHex.encode(d)) (forged or tampered with): not read"
                case .stale(let d, _, true):
                    reason =
                        "older than a file of device \(SyncHex.encode(d)) already read (a replayed or old copy): not read"
                default: return nil
                }
                return (r.name, reason)
            }
        }
    }

    /// The names of the sync files in `folder`, sorted.
    public static func fileNames(in folder: String) -> [String] {
        (FileSystem.contentsOfDirectory(folder) ?? []).filter { $0.hasSuffix(SyncFile.suffix) && !$0.hasPrefix(".") }
            .sorted()
    }

    /// A file that opened: signed by its device's recorded key, under this key.
    struct Opened {
        var header: SyncFile.Header
        var state: SyncState
    }

    /// Checks one file against `state` (the devices' recorded keys, what was read before) and opens it.
    enum Checked {
        case success(Opened)
        case failure(FileResult)
    }

    static func check(_ data: [UInt8], key: SyncKey, state: SyncState) -> Checked {
        let header: SyncFile.Header
        do { header = try SyncFile.header(of: data) } catch { return .failure(.damaged(reason: error.message)) }
        // The signature first: only a file signed by a paired device can say that a newer key exists.
        guard let publicKey = state.keys[header.device] else { return .failure(.unknownDevice(device: header.device)) }
        guard SyncFile.verify(data, publicKey: publicKey) else { return .failure(.badSignature(device: header.device)) }
        guard header.epoch == key.epoch else {
            return .failure(.otherKey(device: header.device, epoch: header.epoch))
        }
        if let known = state.devices[header.device], known.sequence >= header.sequence {
            return .failure(
                .stale(device: header.device, sequence: header.sequence, older: known.sequence > header.sequence))
        }
        do {
            let (_, other) = try SyncFile.open(data, key: key)
            return .success(Opened(header: header, state: other))
        } catch {
            return .failure(.damaged(reason: error.message))
        }
    }

    /// Merges an opened file into `state`.
    static func apply(_ file: Opened, into state: inout SyncState, report: inout Report) -> FileResult {
        let (ids, gone) = state.merge(file.state)
        for id in ids { report.adopted.insert(id) }
        for id in gone {
            report.gone.insert(id)
            report.adopted.remove(id)
        }
        for d in state.learnKeys(from: file.state) { report.disputedKeys.insert(d) }
        let d = file.header.device
        var p = state.devices[d] ?? SyncState.DeviceProgress()
        p.sequence = file.header.sequence
        p.included = max(p.included, file.header.sequence)
        p.holds = file.state.devices.compactMapValues { $0.included > 0 ? $0.included : nil }
        p.holds[d] = max(p.holds[d] ?? 0, file.header.sequence)
        state.devices[d] = p
        return .merged(device: d, sequence: file.header.sequence, adopted: ids.count)
    }

    /// Reads one file's bytes and merges it into `state` when it is sound, signed by the key recorded
    /// for its device, and newer than what was read from its device before. `state` is untouched
    /// unless the whole file opened.
    public static func merge(
        _ data: [UInt8], key: SyncKey, into state: inout SyncState, adopted: inout Set<[UInt8]>
    ) -> FileResult {
        switch check(data, key: key, state: state) {
        case .failure(let result): return result
        case .success(let file):
            if file.header.sequence < (state.devices[file.header.device]?.included ?? 0) {
                return .stale(device: file.header.device, sequence: file.header.sequence, older: true)
            }
            var report = Report()
            let r = apply(file, into: &state, report: &report)
            adopted.formUnion(report.adopted)
            return r
        }
    }

    /// Reads every sync file in `folder` into `state`. The files are all opened first: a file of a
    /// device older than one whose versions another file (or this state) already holds is skipped
    /// whatever order the names come in; files of devices a read file introduces (paired by that
    /// device) are read once its file has been.
    public static func read(folder: String, key: SyncKey, into state: inout SyncState) -> Report {
        var report = Report()
        var pending: [(name: String, data: [UInt8])] = []
        for name in fileNames(in: folder) {
            switch readFile(folder + "/" + name) {
            case .success(let d): pending.append((name, d))
            case .failure(let e): report.results.append((name, .damaged(reason: e.message)))
            }
        }
        while true {
            var opened: [(name: String, file: Opened)] = []
            var waiting: [(name: String, data: [UInt8])] = []
            var unknown: [(name: String, result: FileResult)] = []
            for (name, data) in pending {
                switch check(data, key: key, state: state) {
                case .success(let f): opened.append((name, f))
                case .failure(let r):
                    if case .unknownDevice = r {
                        waiting.append((name, data))
                        unknown.append((name, r))
                    } else {
                        report.results.append((name, r))
                    }
                }
            }
            // What the files opened hold of each device, together.
            let held: [[UInt8]: UInt64] = state.devices.mapValues(\.included)
            var floor = held
            for (_, f) in opened {
                for (d, p) in f.state.devices where p.included > floor[d] ?? 0 { floor[d] = p.included }
            }
            let before = state.keys.count
            for (name, f) in opened {
                let d = f.header.device
                if f.header.sequence < floor[d] ?? 0 || f.header.sequence <= state.devices[d]?.sequence ?? 0 {
                    // Older than versions this state held already: a replayed or old copy. Older only
                    // than what another file holds: the engine has not brought the newest copy yet.
                    let older = f.header.sequence < held[d] ?? 0
                    report.results.append((name, .stale(device: d, sequence: f.header.sequence, older: older)))
                    continue
                }
                report.results.append((name, apply(f, into: &state, report: &report)))
            }
            if waiting.isEmpty || state.keys.count == before {
                report.results += unknown
                return report
            }
            pending = waiting
        }
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
