import CAssuan
import CAssuanHooks

/// A libgpg-error value from libassuan or from the server's `ERR` line, as a Swift error.
struct AssuanError: Error, CustomStringConvertible {
    /// The whole `gpg_error_t` (source and code).
    let value: UInt32

    /// The code part (GPG_ERR_CANCELED, GPG_ERR_TIMEOUT, …).
    var code: UInt32 { UInt32(kc_gpg_err_code(value)) }
    var isCanceled: Bool { code == UInt32(GPG_ERR_CANCELED.rawValue) || code == UInt32(GPG_ERR_NOT_CONFIRMED.rawValue) }
    var isTimeout: Bool { code == UInt32(GPG_ERR_TIMEOUT.rawValue) }

    /// libgpg-error's text for it (never a secret: the server's own words are not kept).
    var description: String { String(cString: gpg_strerror(value)) + " (\(value))" }
}

/// One Assuan server run as a child on a pipe (`assuan_pipe_connect`): the context owns the pipe and
/// the child, and releasing it (deinit) closes the pipe and waits for the child. Every buffer
/// libassuan allocates for the context is zeroed when freed (CAssuanHooks), and its logging is off.
final class AssuanPipe {
    private let ctx: assuan_context_t

    /// Starts `program` with `arguments` (argv[0] first) and reads its greeting. Nothing secret may
    /// go in the arguments: any process can read them.
    init(program: String, arguments: [String]) throws(AssuanError) {
        var made: UnsafeMutableRawPointer?
        let err = kc_assuan_new(&made)
        guard err == 0, let made else { throw AssuanError(value: err) }
        ctx = assuan_context_t(made)
        // Only the child's stdin and stdout are libassuan's; no other descriptor of ours goes with it.
        var noFDs: [assuan_fd_t] = [-1]
        let result = Self.withCStrings(arguments) { argv in
            assuan_pipe_connect(ctx, program, argv, &noFDs, nil, nil, 0)
        }
        if result != 0 {
            assuan_release(ctx)
            throw AssuanError(value: result)
        }
    }

    deinit { assuan_release(ctx) }

    /// Sends one command line (no newline) and waits for `OK`; an `ERR` is thrown. Data lines in the
    /// answer go to `data` (their escaping undone by libassuan).
    func transact(_ line: [UInt8], data: ((UnsafeRawBufferPointer) -> Void)? = nil) throws(AssuanError) {
        final class Sink {
            let body: ((UnsafeRawBufferPointer) -> Void)?
            init(_ body: ((UnsafeRawBufferPointer) -> Void)?) { self.body = body }
        }
        let sink = Sink(data)
        let err = withExtendedLifetime(sink) { () -> gpg_error_t in
            var command = line
            command.append(0)
            return command.withUnsafeBufferPointer { c in
                c.withMemoryRebound(to: CChar.self) { c in
                    assuan_transact(
                        ctx, c.baseAddress,
                        { opaque, buffer, length in
                            guard let opaque else { return 0 }
                            let sink = Unmanaged<Sink>.fromOpaque(opaque).takeUnretainedValue()
                            if let buffer { sink.body?(UnsafeRawBufferPointer(start: buffer, count: length)) }
                            return 0
                        }, Unmanaged.passUnretained(sink).toOpaque(), nil, nil, nil, nil)
                }
            }
        }
        if err != 0 { throw AssuanError(value: err) }
    }

    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafeMutablePointer<UnsafePointer<CChar>?>) -> R)
        -> R
    {
        // One buffer of NUL-terminated strings, and pointers into it.
        var bytes: [CChar] = []
        var offsets: [Int] = []
        for s in strings {
            offsets.append(bytes.count)
            bytes += s.utf8.map { CChar(bitPattern: $0) }
            bytes.append(0)
        }
        return bytes.withUnsafeBufferPointer { all in
            var argv: [UnsafePointer<CChar>?] = offsets.map { all.baseAddress! + $0 }
            argv.append(nil)
            return argv.withUnsafeMutableBufferPointer { body($0.baseAddress!) }
        }
    }
}
