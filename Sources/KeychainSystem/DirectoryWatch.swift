import Glibc
import Synchronization

/// Tells a waiting thread when files in some directories appear, change or go (inotify), including
/// directories that do not exist yet: until one exists, its nearest existing ancestor is watched for
/// the next component of its path, and the watch moves down as the path is created (and back up when
/// it is removed).
///
/// Only files whose name `matters` are reported: a file counts as changed when it is written and
/// closed, renamed in or out, removed, or its owner or mode changes; a file created empty is not
/// reported until its writer closes it, so a reader never sees it half-written by the usual
/// open-write-close (a hard or symbolic link created in place is reported at once).
public final class DirectoryWatch: Sendable {
    private let inotify: FileDescriptor
    private let wake: WakePipe
    private let stopped = Atomic<Bool>(false)
    private let targets: [String]
    private let matters: @Sendable (String) -> Bool
    /// What each watch descriptor stands for, rebuilt by `rearm`. Only the waiting thread and `init`
    /// touch it, but the lock keeps `Sendable` honest at no cost that matters here.
    private let watches = Mutex<[Int32: Watched]>([:])

    private struct Watched: Sendable {
        let path: String
        let roles: [Role]
    }

    private enum Role: Sendable, Equatable {
        /// A directory watched for its files.
        case target
        /// An ancestor of a target that does not exist yet, watched for the next component.
        case ancestor(next: String)
    }

    private static let targetMask: UInt32 =
        UInt32(IN_CLOSE_WRITE) | UInt32(IN_MOVED_TO) | UInt32(IN_MOVED_FROM) | UInt32(IN_DELETE)
        | UInt32(IN_ATTRIB) | UInt32(IN_CREATE) | selfMask
    private static let ancestorMask: UInt32 =
        UInt32(IN_CREATE) | UInt32(IN_MOVED_TO) | UInt32(IN_MOVED_FROM) | UInt32(IN_DELETE) | selfMask
    private static let selfMask: UInt32 = UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF) | UInt32(IN_ONLYDIR)

    /// Watches `directories` (absolute paths) for files whose name `matters`. Throws the
    /// `inotify_init1` or `inotify_add_watch` errno (ENOSPC: the user's watch limit is reached).
    public init(directories: [String], matters: @escaping @Sendable (String) -> Bool) throws(Errno) {
        inotify = FileDescriptor(
            adopting: try valueOrErrno("inotify_init1") { inotify_init1(Int32(IN_CLOEXEC) | Int32(IN_NONBLOCK)) })
        wake = try WakePipe()
        targets = directories.filter { $0.hasPrefix("/") }
        self.matters = matters
        try rearm()
    }

    /// Blocks until the kernel has queued events (true), or until `stop` (false). It takes none of
    /// them: `hasChanged` does, so that whoever acts on a change can take it and act under one lock,
    /// and a thread that looks meanwhile waits for that action instead of missing the change.
    /// Throws the `poll` errno.
    public func waitForEvents() throws(Errno) -> Bool {
        while !stopped.load(ordering: .acquiring) {
            var fds = [
                pollfd(fd: inotify.rawValue, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wake.readDescriptor, events: Int16(POLLIN), revents: 0),
            ]
            _ = try valueOrErrno("poll inotify") { poll(&fds, 2, -1) }
            if fds[1].revents != 0 || stopped.load(ordering: .acquiring) { return false }
            if fds[0].revents != 0 { return true }
        }
        return false
    }

    /// Takes every queued event: whether a file that matters changed since the last look (or a
    /// watched directory appeared or went), without waiting. The kernel queues a change before the
    /// call that made it returns, so this sees every change made before it; the watches are moved
    /// before it returns, so a file made in a directory that has just appeared is seen by whoever
    /// reads the directory after it. Throws the `inotify_add_watch` errno when a watch could not
    /// follow a directory (ENOSPC: the user's watch limit reached): then something may have changed,
    /// and a directory may go unwatched until the next change that moves the watches.
    public func hasChanged() throws(Errno) -> Bool {
        let (changed, moved) = takeEvents()
        guard moved else { return changed }
        let before = existingTargets
        try rearm()
        return changed || existingTargets != before
    }

    /// The target directories watched as themselves (the ones that exist).
    private var existingTargets: Set<String> {
        watches.withLock { Set($0.values.filter { $0.roles.contains(.target) }.map(\.path)) }
    }

    /// Makes `waitForEvents` return false, now and from then on (the descriptors close with the object).
    public func stop() {
        stopped.store(true, ordering: .releasing)
        wake.wake()
    }

    /// Reads every queued event: whether a file that matters changed, and whether a watched
    /// directory appeared, moved or went (the watches must follow).
    private func takeEvents() -> (changed: Bool, moved: Bool) {
        var changed = false
        var moved = false
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let headerSize = MemoryLayout<inotify_event>.size
        while true {
            let count = buffer.withUnsafeMutableBytes { read(inotify.rawValue, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            let watched = watches.withLock { $0 }
            buffer.withUnsafeBytes { raw in
                var offset = 0
                while offset + headerSize <= count {
                    let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                    let nameBytes = raw[(offset + headerSize)..<min(count, offset + headerSize + Int(event.len))]
                    let name = String(decoding: nameBytes.prefix { $0 != 0 }, as: UTF8.self)
                    offset += headerSize + Int(event.len)
                    if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                        (changed, moved) = (true, true)
                        continue
                    }
                    // Events of a watch `rearm` dropped (its IN_IGNORED among them) mean nothing now.
                    guard let directory = watched[event.wd] else { continue }
                    let isTarget = directory.roles.contains(.target)
                    if event.mask & (UInt32(IN_IGNORED) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)) != 0 {
                        // A watched directory went: a target's files went with it.
                        moved = true
                        changed = changed || isTarget
                        continue
                    }
                    if isTarget && name.isEmpty && event.mask & UInt32(IN_ATTRIB) != 0 {
                        // The target's own owner or mode (which decides whether a system directory counts).
                        changed = true
                        continue
                    }
                    for role in directory.roles {
                        switch role {
                        case .ancestor(let next) where next == name:
                            // A step towards a target: a change only once the target itself exists.
                            moved = true
                        case .target where matters(name):
                            // Created empty: its writer's close is the change.
                            if event.mask & UInt32(IN_CREATE) != 0 && !Self.createdWhole(name, in: directory.path) {
                                continue
                            }
                            changed = true
                        default:
                            continue
                        }
                    }
                }
            }
        }
        return (changed, moved)
    }

    /// Whether a file just created in `directory` is already whole: a link (symbolic or hard) made
    /// in place, rather than an empty file its writer has yet to fill and close.
    private static func createdWhole(_ name: String, in directory: String) -> Bool {
        guard let status = try? FileSystem.status(directory + "/" + name, followLinks: false) else { return false }
        return status.kind == .symbolicLink || (status.kind == .regular && status.size > 0)
    }

    /// Watches each target, or its nearest existing ancestor for the next component of its path,
    /// and drops watches nothing needs any more. A directory that goes between the look and the watch
    /// makes it look again (a few times at most: the directories are being removed as it looks).
    private func rearm() throws(Errno) {
        var watched: [Int32: Watched] = [:]
        for attempt in 1...8 {
            do throws(Errno) {
                watched = try watchNearestDirectories()
                break
            } catch  where (error.code == .noEntry || error.code.rawValue == ENOTDIR) && attempt < 8 {
                continue
            }
        }
        let previous = watches.withLock { current in
            let old = current
            current = watched
            return old
        }
        for wd in previous.keys where watched[wd] == nil { _ = inotify_rm_watch(inotify.rawValue, wd) }
    }

    private func watchNearestDirectories() throws(Errno) -> [Int32: Watched] {
        var wanted: [String: (mask: UInt32, roles: [Role])] = [:]
        for target in targets {
            var path = target
            var next: String? = nil
            while (try? FileSystem.status(path))?.kind != .directory {
                guard path != "/", let slash = path.lastIndex(of: "/") else { break }
                next = String(path[path.index(after: slash)...])
                path = FileSystem.parentDirectory(of: path)
            }
            let role: Role = next.map { .ancestor(next: $0) } ?? .target
            let mask = next == nil ? Self.targetMask : Self.ancestorMask
            let existing = wanted[path] ?? (0, [])
            wanted[path] = (
                existing.mask | mask, existing.roles.contains(role) ? existing.roles : existing.roles + [role]
            )
        }
        var watched: [Int32: Watched] = [:]
        for (path, want) in wanted {
            let wd = try valueOrErrno("inotify_add_watch \(path)") {
                inotify_add_watch(inotify.rawValue, path, want.mask)
            }
            watched[wd] = Watched(path: path, roles: want.roles)
        }
        return watched
    }
}
