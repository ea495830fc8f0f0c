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
        if let result { result.pointee = namingClass(shaped, attributes) }
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
        if let result { result.pointee = namingClass(shaped, query) }
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

/// `shaped` with the item class in each attribute dictionary when `query` asks for attributes and
/// for the item reference: Apple's client builds such a dictionary from the reference, which carries
/// the class (KeychainAccess reads `Attributes.class` from it). keychaind has no reference objects,
/// so the class comes from the query. Without kSecReturnRef the dictionaries stay as Apple's are,
/// without a class entry. Results that are no dictionary (the secret alone) are returned untouched.
private func namingClass(_ shaped: AnyObject?, _ query: CFDictionary) -> AnyObject? {
    guard let shaped, !(shaped is NSData), let wantsRef = query.object(forKey: "r_Ref"),
        Conversion.bool(wantsRef) == true, let wantsAttributes = query.object(forKey: "r_Attributes"),
        Conversion.bool(wantsAttributes) == true, let itemClass = query.object(forKey: "class").flatMap(Conversion.text)
    else { return shaped }
    func named(_ item: Any) -> Any {
        guard var attributes = item as? [String: Any] else { return item }
        attributes["class"] = itemClass
        return attributes
    }
    if let items = shaped as? [Any] { return items.map(named) as NSArray }
    return (named(shaped) as? [String: Any]).map { $0 as NSDictionary } ?? shaped
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
