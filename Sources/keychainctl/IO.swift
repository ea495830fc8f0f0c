import KeychainClient
import KeychainCore
import KeychainSystem

// Input and output without Foundation (keychainctl links only the Swift runtime, KeychainClient and
// glibc, so a `find -w` costs a couple of milliseconds per process).

/// Everything a verb writes to stdout, written with one write(2) at the end (secrets may be binary).
struct Output {
    var bytes: [UInt8] = []

    mutating func write(_ s: String) { bytes.append(contentsOf: s.utf8) }
    mutating func line(_ s: String = "") {
        write(s)
        bytes.append(10)
    }
    mutating func raw(_ b: [UInt8]) { bytes.append(contentsOf: b) }
    /// A byte string as it is (a secret from wiping storage); anything else writes nothing.
    mutating func raw(_ v: Value) {
        switch v {
        case .secret(let s): s.withUnsafeBytes { bytes.append(contentsOf: $0) }
        case .bytes(let b): bytes.append(contentsOf: b)
        default: break
        }
    }

    /// Writes everything, then zeroes it (it may hold secrets, as `find -w` writes them) and empties it.
    mutating func flush(to fd: Int32 = 1) {
        IO.writeAll(fd, bytes)
        Zeroing.zeroShared(bytes)
        bytes.removeAll()
    }
}

enum IO {
    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) {
        FileDescriptor.standard(fd).writeAll(bytes)
    }

    static func stderrLine(_ s: String) { writeAll(2, Array((s + "\n").utf8)) }

    /// Reads a whole file descriptor until end of file.
    static func readAll(_ fd: Int32) throws(KeychainError) -> [UInt8] {
        do { return try FileDescriptor.standard(fd).readToEnd() } catch {
            throw KeychainError(.io, error)
        }
    }

    /// Reads one line from descriptor `fd`: the bytes up to the first newline (not included; a
    /// "\r" before it is dropped) or to end of file. Reads a byte at a time, so the next line stays
    /// in the descriptor for whoever reads it next (`passwd` reads the old and the new passphrase
    /// from one descriptor).
    static func readLine(_ fd: Int32) throws(KeychainError) -> [UInt8] {
        var line: [UInt8] = []
        line.reserveCapacity(4096)  // no reallocation leaving copies behind for typical lengths
        let stream = FileDescriptor.standard(fd)
        while true {
            let byte: UInt8?
            do { byte = try stream.readByte() } catch {
                wipe(&line)
                throw KeychainError(error.code == .badDescriptor ? .param : .io, "cannot read descriptor \(fd)", error)
            }
            guard let byte, byte != 10 else { break }
            appendWiping(byte, to: &line)
        }
        if line.last == 13 { line.removeLast() }
        return line
    }

    static func readFile(_ path: String) throws(KeychainError) -> [UInt8] {
        let file: FileDescriptor
        do { file = try FileDescriptor.open(path) } catch { throw KeychainError(.io, "cannot open \(path)", error) }
        do { return try file.readToEnd() } catch {
            throw KeychainError(.io, "cannot read \(path)", error)
        }
    }

    /// Writes `bytes` to `path` with mode 0600 through a temporary file renamed into place.
    static func writeFilePrivately(_ path: String, _ bytes: [UInt8]) throws(KeychainError) {
        let tmp = path + ".tmp-\(CurrentProcess.pid)"
        let file: FileDescriptor
        do { file = try FileDescriptor.open(tmp, [.writeOnly, .create, .exclusive], permissions: 0o600) } catch {
            throw KeychainError(.io, "cannot create \(tmp)", error)
        }
        do throws(Errno) {
            try file.writeAll(bytes)
            try file.sync()
            file.close()
        } catch {
            file.close()
            FileSystem.removeIfPresent(tmp)
            throw KeychainError(.io, "cannot write \(tmp)", error)
        }
        do { try FileSystem.rename(tmp, to: path) } catch {
            FileSystem.removeIfPresent(tmp)
            throw KeychainError(.io, "cannot rename \(tmp) to \(path)", error)
        }
    }

    /// `mkdir -p` (mode 0700 for what it creates).
    static func makeDirectories(_ path: String) throws(KeychainError) {
        var current = ""
        for part in path.split(separator: "/") {
            current += "/" + part
            do { try FileSystem.makeDirectory(current, permissions: 0o700) } catch {
                if error.code != .exists { throw KeychainError(.io, "cannot create \(current)", error) }
            }
        }
    }

    static func removeFile(_ path: String) throws(KeychainError) {
        do { try FileSystem.unlink(path) } catch {
            if error.code != .noEntry { throw KeychainError(.io, "cannot remove \(path)", error) }
        }
    }

    /// Drops one trailing newline ("\n" or "\r\n") — what `echo` and most editors add.
    static func chompNewline(_ b: inout [UInt8]) {
        if b.last == 10 {
            b.removeLast()
            if b.last == 13 { b.removeLast() }
        }
    }

    /// Zeroes the bytes where they are, also when a copy still shares them (a request's `.bytes`
    /// made from the same array): zeroing through `inout` would copy the shared storage first and
    /// zero only the copy.
    static func wipe(_ b: inout [UInt8]) {
        Zeroing.zeroShared(b)
    }

    /// Appends a byte of a secret; when `b` must grow, its old storage is zeroed, not left behind.
    static func appendWiping(_ byte: UInt8, to b: inout [UInt8]) {
        if b.count == b.capacity {
            var bigger: [UInt8] = []
            bigger.reserveCapacity(max(4096, b.capacity * 2))
            bigger.append(contentsOf: b)
            wipe(&b)
            b = bigger
        }
        b.append(byte)
    }

    /// The first `count` bytes of `b` in storage of their own, never shared with `b` (which `wipe`
    /// may then zero in place without touching the copy).
    static func copy(_ b: [UInt8], count: Int) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: count) { out, initialized in
            b.withUnsafeBufferPointer { src in
                _ = out.initialize(fromContentsOf: src[..<count])
            }
            initialized = count
        }
    }
}

/// Reading a secret or passphrase from the terminal without echo: /dev/tty, or stdin when there is no
/// terminal (pipes, tests). The terminal is restored on every exit path, including Ctrl-C.
enum Prompt {
    /// What a missing item secret is told: the ways to give one.
    static let noSecret = KeychainError(.param, "no secret given: use -w, --stdin, or run in a terminal to be asked")

    /// One line read without echo; `missing` is thrown when there is no terminal and nothing to read
    /// (it names the options of the verb at hand).
    static func readSecret(_ prompt: String, missing: KeychainError = noSecret) throws(KeychainError) -> [UInt8] {
        let tty = Terminal.open()
        // Read through its number below: kept open until this function returns.
        defer { withExtendedLifetime(tty) {} }
        let fd = tty?.rawValue ?? 0
        let stream = FileDescriptor.standard(fd)
        let echoOff = stream.isTerminal
        // A prompt only where a person reads it: piped input needs none, and an error then stands
        // alone on its line.
        if tty != nil || echoOff { IO.writeAll(tty != nil ? fd : 2, Array(prompt.utf8)) }
        func read() throws(KeychainError) -> [UInt8] {
            var out: [UInt8] = []
            out.reserveCapacity(4096)  // no reallocation leaving copies behind for typical lengths
            while true {
                let byte: UInt8?
                do { byte = try stream.readByte() } catch {
                    IO.wipe(&out)
                    throw KeychainError(.io, "cannot read the secret", error)
                }
                guard let byte else {
                    if out.isEmpty && !echoOff { throw missing }
                    break
                }
                if byte == 10 { break }
                IO.appendWiping(byte, to: &out)
            }
            if out.last == 13 { out.removeLast() }
            return out
        }
        if echoOff {
            guard let out = try Terminal.withoutEcho(fd, read) else {
                throw KeychainError(
                    .io,
                    "cannot turn off the terminal's echo, so nothing secret is read from it: use --stdin, or --passphrase-file for a passphrase"
                )
            }
            return out
        }
        return try read()
    }

    /// Asks `question` on the terminal `tty` and reads the answer (echoed): true for y or yes, false
    /// for anything else, an empty line or the end of input.
    static func confirm(_ tty: FileDescriptor, _ question: String) throws(KeychainError) -> Bool {
        IO.writeAll(tty.rawValue, Array(question.utf8))
        let stream = FileDescriptor.standard(tty.rawValue)
        var answer: [UInt8] = []
        while true {
            let byte: UInt8?
            do { byte = try stream.readByte() } catch { throw KeychainError(.io, "cannot read the answer", error) }
            guard let byte, byte != 10 else { break }
            if answer.count < 64 && byte != 32 && byte != 9 && byte != 13 { answer.append(byte) }
        }
        let text = String(decoding: answer, as: UTF8.self).lowercased()
        return text == "y" || text == "yes"
    }

    /// Asks twice and insists the two agree (new secrets and passphrases).
    static func readNewSecret(_ prompt: String, _ again: String, missing: KeychainError = noSecret)
        throws(KeychainError) -> [UInt8]
    {
        var first = try readSecret(prompt, missing: missing)
        if FileDescriptor.standard(0).isTerminal || Terminal.isAvailable {
            var second = try readSecret(again, missing: missing)
            defer { IO.wipe(&second) }
            if first != second {
                IO.wipe(&first)
                throw KeychainError(.param, "the two entries differ")
            }
        }
        return first
    }
}

/// A passphrase on a descriptor (`--passphrase-fd`, `--new-passphrase-fd`: how pam_keychaind's
/// helper hands over the login password) is read while this process is non-dumpable, so that no
/// other process of the user can open the descriptor through `/proc/<pid>/fd`, attach or read this
/// process's memory meanwhile. It turns dumpable again once every such descriptor has been read —
/// which each verb does before it asks the daemon anything — because keychaind identifies its peers
/// through `/proc/<pid>/exe`, which a non-dumpable process hides from a daemon of the same uid.
enum DescriptorPassphrases {
    nonisolated(unsafe) private static var protected = false
    nonisolated(unsafe) private static var unread = 0

    /// keychainctl's first step: non-dumpable when an argument names a passphrase descriptor.
    static func protectIfGiven(_ arguments: ArraySlice<String>) {
        let names = ["--passphrase-fd", "--new-passphrase-fd"]
        guard arguments.contains(where: { a in names.contains { a == $0 || a.hasPrefix($0 + "=") } }) else { return }
        protected = (try? CurrentProcess.makeUndumpable()) != nil
    }

    /// Once the arguments are parsed: how many descriptor reads are to come (none: dumpable now).
    static func expect(_ reads: Int) {
        unread = reads
        if unread <= 0 { release() }
    }

    /// After a passphrase was read from a descriptor (or the read failed).
    static func didRead() {
        unread -= 1
        if unread <= 0 { release() }
    }

    private static func release() {
        guard protected else { return }
        protected = false
        try? CurrentProcess.makeDumpable()
    }
}
