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
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        public static let interrupted = Code(rawValue: EINTR)
        public static let noEntry = Code(rawValue: ENOENT)
        public static let exists = Code(rawValue: EEXIST)
        public static let wouldBlock = Code(rawValue: EWOULDBLOCK)
        public static let tryAgain = Code(rawValue: EAGAIN)
        public static let badDescriptor = Code(rawValue: EBADF)
        public static let addressInUse = Code(rawValue: EADDRINUSE)
        public static let noSpace = Code(rawValue: ENOSPC)
        public static let quotaExceeded = Code(rawValue: EDQUOT)
        public static let noProtocolOption = Code(rawValue: ENOPROTOOPT)
        public static let connectionAborted = Code(rawValue: ECONNABORTED)
        public static let protocolError = Code(rawValue: EPROTO)
        public static let tooManyFiles = Code(rawValue: EMFILE)
        public static let tooManyFilesInSystem = Code(rawValue: ENFILE)
        public static let noBuffers = Code(rawValue: ENOBUFS)
        public static let noMemory = Code(rawValue: ENOMEM)

        /// The timeout of a blocking socket call ran out (`SO_RCVTIMEO`, `SO_SNDTIMEO`).
        public var isTimeout: Bool { self == .wouldBlock || self == .tryAgain }
        /// The process or system is out of descriptors or memory: worth waiting and retrying.
        public var isResourceShortage: Bool {
            self == .tooManyFiles || self == .tooManyFilesInSystem || self == .noBuffers || self == .noMemory
        }
    }

    public init(_ code: Code, call: String) {
        self.code = code
        self.call = call
    }

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

    public var description: String { "\(call) failed: \(message)" }
}

/// Runs a system call that returns -1 and sets `errno` on failure, calling it again when a signal
/// interrupted it (EINTR). Returns its result, or throws the `Errno` it left, named `call`.
public func valueOrErrno<I: FixedWidthInteger>(_ call: @autoclosure () -> String,
                                                retryOnInterrupt: Bool = true,
                                                _ body: () -> I) throws(Errno) -> I {
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
