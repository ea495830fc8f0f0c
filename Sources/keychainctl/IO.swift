#if canImport(Glibc)
import Glibc
#endif
import KeychainClient

// Input and output without Foundation (keychainctl links only the Swift runtime, KeychainClient and
// glibc, so a `find -w` costs a couple of milliseconds per process).

/// Everything a verb writes to stdout, written with one write(2) at the end (secrets may be binary).
struct Output {
    var bytes: [UInt8] = []

    mutating func write(_ s: String) { bytes.append(contentsOf: s.utf8) }
    mutating func line(_ s: String = "") { write(s); bytes.append(10) }
    mutating func raw(_ b: [UInt8]) { bytes.append(contentsOf: b) }

    func flush(to fd: Int32 = 1) { IO.writeAll(fd, bytes) }
}

enum IO {
    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + off, $0.count - off) }
            if n < 0 {
                if errno == EINTR { continue }
                return
            }
            off += n
        }
    }

    static func stderrLine(_ s: String) { writeAll(2, Array((s + "\n").utf8)) }

    /// Reads a whole file descriptor until end of file.
    static func readAll(_ fd: Int32) throws(KeychainError) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw KeychainError(.io, "read failed: \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            out.append(contentsOf: chunk[0..<n])
        }
        wipe(&chunk)
        return out
    }

    /// Reads one line from descriptor `fd`: the bytes up to the first newline (not included; a
    /// "\r" before it is dropped) or to end of file. Reads a byte at a time, so the next line stays
    /// in the descriptor for whoever reads it next (`passwd` reads the old and the new passphrase
    /// from one descriptor).
    static func readLine(_ fd: Int32) throws(KeychainError) -> [UInt8] {
        var line: [UInt8] = []
        line.reserveCapacity(4096)  // no reallocation leaving copies behind for typical lengths
        var byte: UInt8 = 0
        while true {
            let n = Glibc.read(fd, &byte, 1)
            if n < 0 {
                if errno == EINTR { continue }
                let e = errno
                wipe(&line)
                throw KeychainError(e == EBADF ? .param : .io, "cannot read descriptor \(fd): \(String(cString: strerror(e)))")
            }
            if n == 0 || byte == 10 { break }
            line.append(byte)
        }
        byte = 0
        if line.last == 13 { line.removeLast() }
        return line
    }

    static func readFile(_ path: String) throws(KeychainError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw KeychainError(.io, "cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        do throws(KeychainError) { return try readAll(fd) } catch {
            throw KeychainError(.io, "cannot read \(path): \(error.message)")
        }
    }

    /// Writes `bytes` to `path` with mode 0600 through a temporary file renamed into place.
    static func writeFilePrivately(_ path: String, _ bytes: [UInt8]) throws(KeychainError) {
        let tmp = path + ".tmp-\(getpid())"
        let fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw KeychainError(.io, "cannot create \(tmp): \(String(cString: strerror(errno)))") }
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + off, $0.count - off) }
            if n < 0 {
                if errno == EINTR { continue }
                let e = errno
                close(fd)
                unlink(tmp)
                throw KeychainError(.io, "cannot write \(tmp): \(String(cString: strerror(e)))")
            }
            off += n
        }
        if fsync(fd) != 0 || close(fd) != 0 {
            let e = errno
            unlink(tmp)
            throw KeychainError(.io, "cannot write \(tmp): \(String(cString: strerror(e)))")
        }
        if rename(tmp, path) != 0 {
            let e = errno
            unlink(tmp)
            throw KeychainError(.io, "cannot rename \(tmp) to \(path): \(String(cString: strerror(e)))")
        }
    }

    /// `mkdir -p` (mode 0700 for what it creates).
    static func makeDirectories(_ path: String) throws(KeychainError) {
        var current = ""
        for part in path.split(separator: "/") {
            current += "/" + part
            if mkdir(current, 0o700) != 0 && errno != EEXIST {
                throw KeychainError(.io, "cannot create \(current): \(String(cString: strerror(errno)))")
            }
        }
    }

    static func removeFile(_ path: String) throws(KeychainError) {
        if unlink(path) != 0 && errno != ENOENT {
            throw KeychainError(.io, "cannot remove \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// Drops one trailing newline ("\n" or "\r\n") — what `echo` and most editors add.
    static func chompNewline(_ b: inout [UInt8]) {
        if b.last == 10 { b.removeLast(); if b.last == 13 { b.removeLast() } }
    }

    static func wipe(_ b: inout [UInt8]) {
        b.withUnsafeMutableBytes { raw in
            if let p = raw.baseAddress { memset(p, 0, raw.count) }
        }
    }
}

/// Reading a secret or passphrase from the terminal without echo (swift-on-linux §4): /dev/tty, or
/// stdin when there is no terminal (pipes, tests). The terminal is restored on every exit path,
/// including Ctrl-C.
enum Prompt {
    nonisolated(unsafe) private static var savedTermios = termios()
    nonisolated(unsafe) private static var savedFD: Int32 = -1

    static func readSecret(_ prompt: String) throws(KeychainError) -> [UInt8] {
        var fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
        let ownFD = fd >= 0
        if !ownFD { fd = 0 }
        defer { if ownFD { close(fd) } }
        let echoOff = isatty(fd) == 1
        IO.writeAll(ownFD ? fd : 2, Array(prompt.utf8))
        if echoOff {
            var t = termios()
            guard tcgetattr(fd, &t) == 0 else { throw KeychainError(.io, "cannot read the terminal settings") }
            savedTermios = t
            savedFD = fd
            signal(SIGINT, restoreAndDie)
            signal(SIGTERM, restoreAndDie)
            t.c_lflag &= ~tcflag_t(ECHO | ECHOE | ECHOK)
            t.c_lflag |= tcflag_t(ECHONL)
            _ = tcsetattr(fd, TCSAFLUSH, &t)
        }
        defer {
            if echoOff {
                _ = tcsetattr(fd, TCSAFLUSH, &savedTermios)
                savedFD = -1
                signal(SIGINT, SIG_DFL)
                signal(SIGTERM, SIG_DFL)
            }
        }
        var out: [UInt8] = []
        var byte: UInt8 = 0
        while true {
            let n = Glibc.read(fd, &byte, 1)
            if n < 0 {
                if errno == EINTR { continue }
                throw KeychainError(.io, "cannot read the secret: \(String(cString: strerror(errno)))")
            }
            if n == 0 {
                if out.isEmpty && !echoOff {
                    throw KeychainError(.param, "no secret given: use -w, --stdin, or run in a terminal to be asked")
                }
                break
            }
            if byte == 10 { break }
            out.append(byte)
        }
        if out.last == 13 { out.removeLast() }
        return out
    }

    /// Asks twice and insists the two agree (new secrets and passphrases).
    static func readNewSecret(_ prompt: String, _ again: String) throws(KeychainError) -> [UInt8] {
        var first = try readSecret(prompt)
        if isatty(0) == 1 || open("/dev/tty", O_RDONLY | O_CLOEXEC).closingValid() {
            var second = try readSecret(again)
            defer { IO.wipe(&second) }
            if first != second {
                IO.wipe(&first)
                throw KeychainError(.param, "the two entries differ")
            }
        }
        return first
    }
}

private func restoreAndDie(_ sig: Int32) {
    if Prompt.savedFDForSignal >= 0 { Prompt.restoreForSignal() }
    signal(sig, SIG_DFL)
    raise(sig)
}

extension Prompt {
    static var savedFDForSignal: Int32 { savedFD }
    static func restoreForSignal() { _ = tcsetattr(savedFD, TCSAFLUSH, &savedTermios) }
}

extension Int32 {
    /// For a descriptor just opened to test availability: true if valid (and closes it).
    fileprivate func closingValid() -> Bool {
        guard self >= 0 else { return false }
        close(self)
        return true
    }
}
