import KeychainCore

/// `withUnsafeBytes` for arrays with a typed-throwing body (the standard library's is untyped).
@inlinable
public func withBytes<R>(_ array: [UInt8], _ body: (UnsafeRawBufferPointer) throws(KeychainError) -> R) throws(KeychainError) -> R {
    let result: Result<R, KeychainError> = array.withUnsafeBytes { p in Result { () throws(KeychainError) -> R in try body(p) } }
    return try result.get()
}

/// `withUnsafeMutableBytes` for arrays with a typed-throwing body.
@inlinable
public func withMutableBytes<R>(_ array: inout [UInt8], _ body: (UnsafeMutableRawBufferPointer) throws(KeychainError) -> R) throws(KeychainError) -> R {
    let result: Result<R, KeychainError> = array.withUnsafeMutableBytes { p in Result { () throws(KeychainError) -> R in try body(p) } }
    return try result.get()
}
