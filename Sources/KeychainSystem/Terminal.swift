import Glibc

/// Reading from a terminal without echo: the settings are put back on every way out, Ctrl-C and
/// SIGTERM included.
public enum Terminal {
    nonisolated(unsafe) private static var saved = termios()
    nonisolated(unsafe) private static var savedFD: Int32 = -1

    /// Opens the controlling terminal (`/dev/tty`) for reading and writing; nil when there is none.
    public static func open() -> FileDescriptor? {
        try? FileDescriptor.open("/dev/tty", [.readWrite, .noControllingTerminal])
    }

    /// The device path of the terminal open on `fd` (`/dev/pts/3`), or nil.
    public static func name(of fd: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: 256)
        guard ttyname_r(fd, &buffer, buffer.count) == 0 else { return nil }
        let end = buffer.firstIndex(of: 0) ?? buffer.count
        return String(decoding: buffer[..<end].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Whether standard input is a pipe or a regular file (a script hands something over on it).
    public static var standardInputIsPipeOrFile: Bool {
        var st = stat()
        guard fstat(0, &st) == 0 else { return false }
        let type = st.st_mode & S_IFMT
        return type == S_IFIFO || type == S_IFREG
    }

    /// Whether this process has a controlling terminal it can open.
    public static var isAvailable: Bool { open() != nil }

    /// Runs `body` with echo turned off on `fd` (a newline is still echoed), restoring the settings
    /// afterwards and on SIGINT/SIGTERM (which then end the process as they would have). Nil, without
    /// running `body`, when the settings cannot be read or echo does not go off (tcsetattr succeeds
    /// when any one change took, so the result is read back): a secret is never read while echoed.
    public static func withoutEcho<R, E: Error>(_ fd: Int32, _ body: () throws(E) -> R) throws(E) -> R? {
        var t = termios()
        guard tcgetattr(fd, &t) == 0 else { return nil }
        saved = t
        savedFD = fd
        signal(SIGINT, restoreAndDie)
        signal(SIGTERM, restoreAndDie)
        t.c_lflag &= ~tcflag_t(ECHO | ECHOE | ECHOK)
        t.c_lflag |= tcflag_t(ECHONL)
        var now = termios()
        guard tcsetattr(fd, TCSAFLUSH, &t) == 0, tcgetattr(fd, &now) == 0, now.c_lflag & tcflag_t(ECHO) == 0 else {
            _ = tcsetattr(fd, TCSAFLUSH, &saved)
            savedFD = -1
            signal(SIGINT, SIG_DFL)
            signal(SIGTERM, SIG_DFL)
            return nil
        }
        defer {
            _ = tcsetattr(fd, TCSAFLUSH, &saved)
            savedFD = -1
            signal(SIGINT, SIG_DFL)
            signal(SIGTERM, SIG_DFL)
        }
        return try body()
    }

    fileprivate static func restoreForSignal() {
        if savedFD >= 0 { _ = tcsetattr(savedFD, TCSAFLUSH, &saved) }
    }
}

private func restoreAndDie(_ sig: Int32) {
    Terminal.restoreForSignal()
    signal(sig, SIG_DFL)
    raise(sig)
}
