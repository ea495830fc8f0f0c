/// `withUnsafeBytes` for arrays with a typed-throwing body (the standard library's rethrows, which
/// loses the error type).
@inlinable
public func withBytes<R, E: Error>(_ array: [UInt8], _ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
    let result: Result<R, E> = array.withUnsafeBytes { p in Result { () throws(E) -> R in try body(p) } }
    return try result.get()
}

/// `withUnsafeMutableBytes` for arrays with a typed-throwing body.
@inlinable
public func withMutableBytes<R, E: Error>(
    _ array: inout [UInt8], _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R
) throws(E) -> R {
    let result: Result<R, E> = array.withUnsafeMutableBytes { p in Result { () throws(E) -> R in try body(p) } }
    return try result.get()
}
