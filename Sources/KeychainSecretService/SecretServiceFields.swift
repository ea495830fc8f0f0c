import KeychainCore
public import KeychainItems

/// What the Secret Service reads from an item: its own attributes (stored in `gena`, see
/// KeychainItems' `SecretServiceFields`) or those derived from its service and account.
extension SecretServiceFields {
    /// The content type a secret gets when the caller names none, or its item has none stored.
    public static let defaultContentType = "text/plain"
    /// The attribute names of an item created through the keychain API.
    public static let serviceName = "service"
    /// The attribute name that carries an item's account (`kSecAttrAccount`).
    public static let accountName = "account"

    /// The attributes an item shows the Secret Service: its own, or `service` and `account` from its
    /// service and account (text, or bytes that are UTF-8; left out when they are neither, so what a
    /// search finds through the index columns and what the item shows always agree).
    static func view(of attributes: [String: Value]) -> (
        attributes: SecretServiceAttributes, contentType: String, own: Bool
    ) {
        if isInternetPassword(attributes) {
            return (NetworkPassword.view(of: attributes), defaultContentType, false)
        }
        if let own = decode(attributes["gena"]) { return (own.attributes, own.contentType, true) }
        var derived: [[UInt8]: [UInt8]] = [:]
        for (name, key) in [(serviceName, "svce"), (accountName, "acct")] {
            if let b = attributes[key].flatMap(ItemService.attributeBytes(of:)),
                String(validating: b, as: UTF8.self) != nil
            {
                derived[Array(name.utf8)] = b
            }
        }
        return (SecretServiceAttributes(derived), defaultContentType, false)
    }

    /// Whether stored attributes are an internet password's (shown under the NetworkPassword schema).
    static func isInternetPassword(_ attributes: [String: Value]) -> Bool {
        attributes["class"] == .text(ItemClass.internetPassword.code)
    }

    /// Whether `attributes` are exactly the shape of an item made through the keychain API — a
    /// `service` and an `account` and nothing else — so they can be that item's own service and account.
    static func isServiceAndAccount(_ attributes: SecretServiceAttributes) -> Bool {
        attributes.count == 2 && attributes[serviceName] != nil && attributes[accountName] != nil
    }
}
