import Glibc

/// Tells a waiting thread when files in some directories appear, change or go (inotify), including
/// directories that do not exist yet: until one exists, its nearest existing ancestor is watched for
/// the next component of its path, and the watch moves down as the path is created (and back up when
/// it is removed).
///
/// Only files whose name `matters` are reported: a file counts as changed when it is written and
/// closed, renamed in or out, removed, linked in (a symbolic or hard link), or its owner or mode
/// changes, and when the directory's own owner or mode changes. A file created by `open` is reported
/// when its writer closes it, not when it appears empty (a writer that closes it part-way is seen
/// part-way). Not followed: a watched directory reached through a symbolic link that is re-pointed,
/// a directory above a watched one that is renamed, and the owner or mode of directories above it;
/// `rewatch` (keychaind: SIGHUP) looks again.
public final class DirectoryWatch: Sendable {
    private let inotify: FileDescriptor
    private let wake: WakePipe
    private let targets: [String]
    private let matters: @Sendable (String) -> Bool
    /// What each watch descriptor stands for, and whether `stop` was called. The lock is held while
    /// events are taken and the watches moved, so two threads looking at once take each event once.
    private let state = Locked(State())

    private struct State {
        var watches: [Int32: [Role]] = [:]
        var stopped = false
    }

    private enum Role: Equatable {
        /// A target directory, watched for its files.
        case target(String)
        /// An existing ancestor of a target that does not exist yet, watched for the next component.
        case ancestor(String, next: String)
    }

    private static let targetMask: UInt32 =
        UInt32(IN_CLOSE_WRITE) | UInt32(IN_MOVED_TO) | UInt32(IN_MOVED_FROM) | UInt32(IN_DELETE)
        | UInt32(IN_ATTRIB) | UInt32(IN_CREATE) | selfMask
    private static let ancestorMask: UInt32 =
        UInt32(IN_CREATE) | UInt32(IN_MOVED_TO) | UInt32(IN_MOVED_FROM) | UInt32(IN_DELETE) | selfMask
    private static let selfMask: UInt32 = UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF) | UInt32(IN_ONLYDIR)
    /// At most this much of the queue is taken per look (a process making and removing files as fast
    /// as it can must not keep a look from ending); what is left wakes the waiting thread again.
    private static let maximumTakenBytes = 256 * 1024

    /// Watches `directories` (absolute paths; others are `ignored`) for files whose name `matters`.
    /// Throws the `inotify_init1` errno; a directory that cannot be watched (the user's watch limit
    /// reached, no permission) is left out, and `rewatch` says so.
    public init(directories: [String], matters: @escaping @Sendable (String) -> Bool) throws(Errno) {
        inotify = FileDescriptor(
            adopting: try valueOrErrno("inotify_init1") { inotify_init1(Int32(IN_CLOEXEC) | Int32(IN_NONBLOCK)) })
        wake = try WakePipe()
        targets = directories.filter { $0.hasPrefix("/") }
        self.matters = matters
        state.withLock { _ = try? rearm(&$0) }
    }

    /// The directories given that are not absolute paths: not watched.
    public static func ignored(_ directories: [String]) -> [String] { directories.filter { !$0.hasPrefix("/") } }

    /// Blocks until the kernel has queued events (true), or until `stop` (false). It takes none of
    /// them: `hasChanged` does, so that whoever acts on a change can take it and act under one lock,
    /// and a thread that looks meanwhile waits for that action instead of missing the change.
    /// Throws the `poll` errno.
    public func waitForEvents() throws(Errno) -> Bool {
        while !state.withLock({ $0.stopped }) {
            var fds = [
                pollfd(fd: inotify.rawValue, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wake.readDescriptor, events: Int16(POLLIN), revents: 0),
            ]
            _ = try valueOrErrno("poll inotify") { poll(&fds, 2, -1) }
            if fds[1].revents != 0 || state.withLock({ $0.stopped }) { return false }
            if fds[0].revents != 0 { return true }
        }
        return false
    }

    /// As `waitForEvents`, giving up after `timeoutMilliseconds`: true when events are queued, false
    /// after `stop`, nil when the time passed without either.
    public func waitForEvents(timeoutMilliseconds: Int32) throws(Errno) -> Bool? {
        if state.withLock({ $0.stopped }) { return false }
        var fds = [
            pollfd(fd: inotify.rawValue, events: Int16(POLLIN), revents: 0),
            pollfd(fd: wake.readDescriptor, events: Int16(POLLIN), revents: 0),
        ]
        let n = try valueOrErrno("poll inotify") { poll(&fds, 2, timeoutMilliseconds) }
        if fds[1].revents != 0 || state.withLock({ $0.stopped }) { return false }
        if n > 0 && fds[0].revents != 0 { return true }
        return nil
    }

    /// Takes the queued events: whether a file that matters changed since the last look (or a target
    /// directory appeared or went), without waiting. The kernel queues a change before the call
    /// that made it returns, so this sees every change made before it (short of a flood: see
    /// `maximumTakenBytes`); the watches are moved before it returns, so a file made in a directory
    /// that has just appeared is seen by whoever reads the directory after it. Throws the `read` or
    /// `inotify_add_watch` errno, when something may have changed unseen.
    public func hasChanged() throws(Errno) -> Bool {
        try state.withLock { (state) throws(Errno) -> Bool in
            let (changed, moved) = try takeEvents(state.watches)
            guard moved else { return changed }
            let before = Self.existingTargets(state.watches)
            try rearm(&state)
            return changed || Self.existingTargets(state.watches) != before
        }
    }

    /// Looks at every target again and moves the watches to where they belong now (after changes it
    /// does not follow). Throws the `inotify_add_watch` errno of a directory that cannot be watched;
    /// the others are watched all the same.
    public func rewatch() throws(Errno) {
        try state.withLock { (state) throws(Errno) in try rearm(&state) }
    }

    /// Makes `waitForEvents` return false, now and from then on (the descriptors close with the object).
    public func stop() {
        state.withLock { $0.stopped = true }
        wake.wake()
    }

    private static func existingTargets(_ watches: [Int32: [Role]]) -> Set<String> {
        var paths = Set<String>()
        for roles in watches.values {
            for case .target(let path) in roles { paths.insert(path) }
        }
        return paths
    }

    /// Reads the queued events (up to `maximumTakenBytes`): whether a file that matters changed, and
    /// whether a watched directory appeared, moved or went (the watches must follow).
    private func takeEvents(_ watches: [Int32: [Role]]) throws(Errno) -> (changed: Bool, moved: Bool) {
        var changed = false
        var moved = false
        // Most looks (one per new connection in keychaind) find nothing: say so without a buffer.
        var ready = pollfd(fd: inotify.rawValue, events: Int16(POLLIN), revents: 0)
        guard try valueOrErrno("poll inotify", { poll(&ready, 1, 0) }) > 0 else { return (false, false) }
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let headerSize = MemoryLayout<inotify_event>.size
        var taken = 0
        while taken < Self.maximumTakenBytes {
            let read = buffer.withUnsafeMutableBytes { b in Result { () throws(Errno) in try inotify.read(into: b) } }
            let count: Int
            switch read {
            case .success(let n): count = n
            case .failure(let error) where error.code.isTimeout: count = 0  // EAGAIN: the queue is empty
            case .failure(let error): throw error
            }
            guard count > 0 else { break }
            taken += count
            buffer.withUnsafeBytes { raw in
                var offset = 0
                while offset + headerSize <= count {
                    let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                    let nameBytes = raw[(offset + headerSize)..<min(count, offset + headerSize + Int(event.len))]
                    let name = String(decoding: nameBytes.prefix { $0 != 0 }, as: UTF8.self)
                    offset += headerSize + Int(event.len)
                    let (c, m) = classify(event.mask, name, watches[event.wd])
                    changed = changed || c
                    moved = moved || m
                }
            }
        }
        return (changed, moved)
    }

    /// What one event means: a change to a file that matters, a directory to follow, or nothing.
    private func classify(_ mask: UInt32, _ name: String, _ roles: [Role]?) -> (changed: Bool, moved: Bool) {
        // The queue overflowed: anything may have happened.
        if mask & UInt32(IN_Q_OVERFLOW) != 0 { return (true, true) }
        // Events of a watch `rearm` dropped (its IN_IGNORED among them) mean nothing now.
        guard let roles else { return (false, false) }
        var changed = false
        var moved = false
        for role in roles {
            switch role {
            case .target(let directory):
                if mask & (UInt32(IN_IGNORED) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)) != 0 {
                    (changed, moved) = (true, true)  // it went, and its files with it
                } else if name.isEmpty {
                    // Its own owner or mode (which decides whether a system directory counts).
                    changed = changed || mask & UInt32(IN_ATTRIB) != 0
                } else if matters(name) {
                    // Made by `open`: its writer's close is the change. A link is whole at once.
                    changed = changed || mask & UInt32(IN_CREATE) == 0 || Self.isLink(name, in: directory)
                }
            case .ancestor(_, let next):
                if mask & (UInt32(IN_IGNORED) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)) != 0 || name == next {
                    // A step towards a target (or away): a change only once a target itself appears.
                    moved = true
                }
            }
        }
        return (changed, moved)
    }

    /// Whether the file just created as `name` in `directory` is a link made in place (symbolic, or
    /// a hard link to a file that was whole already) rather than a file its writer has yet to close.
    private static func isLink(_ name: String, in directory: String) -> Bool {
        guard let status = try? FileSystem.status(directory + "/" + name, followLinks: false) else { return false }
        return status.kind == .symbolicLink || (status.kind == .regular && status.linkCount > 1)
    }

    /// Watches each target, or its nearest existing ancestor for the next component of its path, and
    /// drops watches nothing needs any more. A directory made while it looks (`mkdir -p`) may appear
    /// after its parent was found without it and before the parent's watch was added, which no event
    /// would tell: so it looks again until what it finds is what it watches. Every directory it can
    /// watch is watched; the first errno of one it cannot is thrown afterwards.
    private func rearm(_ state: inout State) throws(Errno) {
        var failure: Errno?
        var watched: [Int32: [Role]] = [:]
        for _ in 0..<8 {
            let wanted = targets.map(Self.nearestDirectory)
            watched = [:]
            failure = nil
            for role in wanted {
                let (path, mask): (String, UInt32)
                switch role {
                case .target(let p): (path, mask) = (p, Self.targetMask)
                case .ancestor(let p, _): (path, mask) = (p, Self.ancestorMask)
                }
                // Two paths to one directory (a symbolic link, or one target above another) get one
                // watch descriptor: the masks add up and it stands for both roles.
                let wd = inotify_add_watch(inotify.rawValue, path, mask | UInt32(IN_MASK_ADD))
                if wd < 0 {
                    failure = failure ?? Errno.current("inotify_add_watch \(path)")
                    continue
                }
                if !(watched[wd]?.contains(role) ?? false) { watched[wd, default: []].append(role) }
            }
            if targets.map(Self.nearestDirectory) == wanted { break }
        }
        let previous = state.watches
        state.watches = watched
        for wd in previous.keys where watched[wd] == nil { _ = inotify_rm_watch(inotify.rawValue, wd) }
        if let failure { throw failure }
    }

    /// The target itself when it is a directory, else its nearest existing ancestor and the next
    /// component of the target's path below it.
    private static func nearestDirectory(_ target: String) -> Role {
        var path = target
        var next: String? = nil
        while (try? FileSystem.status(path))?.kind != .directory {
            guard path != "/", let slash = path.lastIndex(of: "/") else { break }
            next = String(path[path.index(after: slash)...])
            path = FileSystem.parentDirectory(of: path)
        }
        return next.map { .ancestor(path, next: $0) } ?? .target(path)
    }
}
