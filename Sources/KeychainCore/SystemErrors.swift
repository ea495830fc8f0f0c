public import KeychainSystem

extension KeychainError {
    /// A failed system call as a keychaind error: `context` (what was being done, for example
    /// "cannot open /path"), then what the kernel said. The call itself is kept in `errno.call`.
    public init(_ status: Status, _ context: String, _ errno: Errno) {
        self.init(status, "\(context): \(errno.message)")
    }

    /// A failed system call with the call's own name as the context ("send failed: Broken pipe").
    public init(_ status: Status, _ errno: Errno) {
        self.init(status, errno.description)
    }
}
