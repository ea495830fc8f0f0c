import KeychainCore
import KeychainSystem

/// Apple's result shapes (docs/protocol.md §9), per item.
enum ResultShape {
    /// `r_Data` alone → the secret; `r_PersistentRef` alone → the reference; `r_Attributes` alone →
    /// the attribute map; several → one map with the attributes (if asked) plus `v_Data` /
    /// `v_PersistentRef`.
    /// `ref` is read only when the query asks for it (a stored row's getter copies it).
    static func value(
        attributes: [String: Value], secret: SecretBytes, ref: @autoclosure () -> [UInt8], returns: ReturnFlags
    ) -> Value {
        if returns.count == 1 {
            if returns.data { return .secret(secret) }
            if returns.persistentRef { return .bytes(PersistentRef.make(id: ref(), of: itemClass(attributes))) }
            return .map(visible(attributes))
        }
        var map = returns.attributes ? visible(attributes) : [:]
        if returns.data { map["v_Data"] = .secret(secret) }
        if returns.persistentRef {
            map["v_PersistentRef"] = .bytes(PersistentRef.make(id: ref(), of: itemClass(attributes)))
        }
        return .map(map)
    }

    /// The class of an item by its stored attributes: a `class` entry for every class but generic
    /// passwords (whose rows, older than the other classes, have none). A key-only match has no
    /// attributes: it is always a generic password (ItemService.compiled).
    static func itemClass(_ attributes: [String: Value]) -> ItemClass {
        guard case .text(let code)? = attributes["class"] else { return .genericPassword }
        return ItemClass(code: code) ?? .genericPassword
    }

    /// The attributes an answer shows: the stored ones without the class mark (the query named the class).
    private static func visible(_ attributes: [String: Value]) -> [String: Value] {
        guard attributes["class"] != nil else { return attributes }
        var shown = attributes
        shown["class"] = nil
        return shown
    }
}
