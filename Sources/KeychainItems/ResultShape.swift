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
            if returns.persistentRef { return .bytes(PersistentRef.make(id: ref())) }
            return .map(attributes)
        }
        var map = returns.attributes ? attributes : [:]
        if returns.data { map["v_Data"] = .secret(secret) }
        if returns.persistentRef { map["v_PersistentRef"] = .bytes(PersistentRef.make(id: ref())) }
        return .map(map)
    }
}
