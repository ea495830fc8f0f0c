import Glibc

/// A failed system call: the `errno` it left and the name of the call, kept as the cause.
///
/// The only place in keychaind where an errno becomes text (`strerror`). Messages name the call and
/// what the kernel said, never data.
public struct Errno: Error, Hashable, Sendable, CustomStringConvertible {
    /// The errno value.
    public let code: Code
    /// The system call that failed (`"open"`, `"connect"`, …), or a short description of it.
    public let call: String

    /// An errno value, with names for the ones keychaind acts on.
    public struct Code: RawRepresentable, Hashable, Sendable {
        /// The errno number.
        public let rawValue: Int32
        /// The code for an errno number.
        public init(rawValue: Int32) { self.rawValue = rawValue }

        /// EINTR: a signal interrupted the call.
        public static let interrupted = Code(rawValue: EINTR)
        /// ENOENT: no such file or directory.
        public static let noEntry = Code(rawValue: ENOENT)
        /// EEXIST: the file exists.
        public static let exists = Code(rawValue: EEXIST)
        /// EWOULDBLOCK: the call would block (a lock held elsewhere, a timeout).
        public static let wouldBlock = Code(rawValue: EWOULDBLOCK)
        /// EAGAIN: try again (on Linux the same number as EWOULDBLOCK).
        public static let tryAgain = Code(rawValue: EAGAIN)
        /// EBADF: not an open descriptor.
        public static let badDescriptor = Code(rawValue: EBADF)
        /// EADDRINUSE: the socket address is taken.
        public static let addressInUse = Code(rawValue: EADDRINUSE)
        /// ENOSPC: the disk is full.
        public static let noSpace = Code(rawValue: ENOSPC)
        /// EDQUOT: the disk quota is used up.
        public static let quotaExceeded = Code(rawValue: EDQUOT)
        /// ENOPROTOOPT: the kernel does not know the socket option.
        public static let noProtocolOption = Code(rawValue: ENOPROTOOPT)
        /// ECONNABORTED: a connection ended before it was accepted.
        public static let connectionAborted = Code(rawValue: ECONNABORTED)
        /// EPROTO: a protocol error while accepting.
        public static let protocolError = Code(rawValue: EPROTO)
        /// EMFILE: this process has no descriptor left.
        public static let tooManyFiles = Code(rawValue: EMFILE)
        /// ENFILE: the system has no descriptor left.
        public static let tooManyFilesInSystem = Code(rawValue: ENFILE)
        /// ENOBUFS: no buffer space.
        public static let noBuffers = Code(rawValue: ENOBUFS)
        /// ENOMEM: out of memory.
        public static let noMemory = Code(rawValue: ENOMEM)

        /// The timeout of a blocking socket call ran out (`SO_RCVTIMEO`, `SO_SNDTIMEO`).
        public var isTimeout: Bool { self == .wouldBlock || self == .tryAgain }
        /// The process or system is out of descriptors or memory: worth waiting and retrying.
        public var isResourceShortage: Bool {
            self == .tooManyFiles || self == .tooManyFilesInSystem || self == .noBuffers || self == .noMemory
        }
    }

    /// An errno value attributed to `call`.
    public init(_ code: Code, call: String) {
        self.code = code
        self.call = call
    }

    /// An errno number attributed to `call`.
    public init(_ rawValue: Int32, call: String) {
        self.init(Code(rawValue: rawValue), call: call)
    }

    /// The calling thread's `errno` right now, attributed to `call`.
    public static func current(_ call: String) -> Errno {
        Errno(Code(rawValue: errno), call: call)
    }

    /// What the C library says about the code (`strerror`), for example "No such file or directory".
    public var message: String {
        // glibc's strerror returns a constant string for every code it knows (thread-safe then).
        guard let text = strerror(code.rawValue) else { return "errno \(code.rawValue)" }
        return String(cString: text)
    }

    /// "call failed: message".
    public var description: String { "\(call) failed: \(message)" }
}

/// Runs a system call that returns -1 and sets `errno` on failure, calling it again when a signal
/// interrupted it (EINTR). Returns its result, or throws the `Errno` it left, named `call`.
public func valueOrErrno<I: FixedWidthInteger>(
    _ call: @autoclosure () -> String,
    retryOnInterrupt: Bool = true,
    _ body: () -> I
) throws(Errno) -> I {
    while true {
        let result = body()
        if result != -1 { return result }
        let code = errno
        if code == EINTR && retryOnInterrupt { continue }
        throw Errno(code, call: call())
    }
}

/// For calls that return 0 or an errno value themselves (pthread_create, …).
public func checkReturned(_ code: Int32, _ call: @autoclosure () -> String) throws(Errno) {
    guard code == 0 else { throw Errno(code, call: call()) }
}
