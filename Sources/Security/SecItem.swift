public import Foundation
internal import KeychainClient
internal import KeychainCore

// Apple's four SecItem calls, with Apple's signatures and semantics (the daemon implements the
// semantics; these functions convert the dictionaries, send one request on the shared connection and
// reshape the result). Safe from any thread; each call blocks its thread until keychaind answers, as
// Apple's do. From Swift concurrency, prefer the `async` methods of `Keychain`.

// swift-format-ignore: AlwaysUseLowerCamelCase
/// Adds an item. With `kSecReturn…` keys, `result` receives the new item in the shape
/// `SecItemCopyMatching` would return it.
@discardableResult
public func SecItemAdd(_ attributes: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    result?.pointee = nil
    return secCall { () throws(KeychainError) in
        let query = try Conversion.map(attributes, what: "the attributes dictionary")
        let value = try KeychainConnection.shared.call(.add, query: query)
        let shaped = try Conversion.result(value, for: query, op: .add)
        if let result { result.pointee = shaped }
    }
}

// swift-format-ignore: AlwaysUseLowerCamelCase
/// Finds items. `result` receives `Data` (kSecReturnData), `[String: Any]` (kSecReturnAttributes or
/// several return keys), or an array of those for kSecMatchLimitAll; nothing without return keys.
@discardableResult
public func SecItemCopyMatching(_ query: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    result?.pointee = nil
    return secCall { () throws(KeychainError) in
        let q = try Conversion.map(query, what: "the query")
        let value = try KeychainConnection.shared.call(.copy, query: q)
        let shaped = try Conversion.result(value, for: q, op: .copy)
        if let result { result.pointee = shaped }
    }
}

// swift-format-ignore: AlwaysUseLowerCamelCase
/// Updates every item matching `query` with `attributesToUpdate`.
@discardableResult
public func SecItemUpdate(_ query: CFDictionary, _ attributesToUpdate: CFDictionary) -> OSStatus {
    secCall { () throws(KeychainError) in
        let q = try Conversion.map(query, what: "the query")
        let a = try Conversion.map(attributesToUpdate, what: "attributesToUpdate")
        _ = try KeychainConnection.shared.call(.update, query: q, attributes: a)
    }
}

// swift-format-ignore: AlwaysUseLowerCamelCase
/// Deletes every item matching `query`.
@discardableResult
public func SecItemDelete(_ query: CFDictionary) -> OSStatus {
    secCall { () throws(KeychainError) in
        let q = try Conversion.map(query, what: "the query")
        _ = try KeychainConnection.shared.call(.delete, query: q)
    }
}

/// Runs one SecItem call, turning its error into the OSStatus and remembering the message for
/// `SecCopyErrorMessageString` on this thread.
private func secCall(_ body: () throws(KeychainError) -> Void) -> OSStatus {
    do throws(KeychainError) {
        try body()
        return errSecSuccess
    } catch {
        LastError.record(error)
        return error.status.rawValue
    }
}
