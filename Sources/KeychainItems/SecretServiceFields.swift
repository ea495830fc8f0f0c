package import KeychainCore
import KeychainCrypto

/// Secret Service attributes: names and values as UTF-8 bytes, compared byte for byte (Swift's
/// `String ==` would take NFC and NFD spellings for one name, and D-Bus clients do not).
public struct SecretServiceAttributes: Sendable, Hashable {
    /// name → value, both UTF-8.
    public private(set) var pairs: [[UInt8]: [UInt8]]

    /// Attributes from name and value bytes as given; checks no limits (see `problem`).
    public init(_ pairs: [[UInt8]: [UInt8]] = [:]) { self.pairs = pairs }

    /// Attributes from strings, stored as their UTF-8 bytes; a repeated name keeps the last value.
    public init(strings: [(String, String)]) {
        var p: [[UInt8]: [UInt8]] = [:]
        for (n, v) in strings { p[Array(n.utf8)] = Array(v.utf8) }
        pairs = p
    }

    /// How many attributes there are.
    public var count: Int { pairs.count }
    /// Whether there are no attributes.
    public var isEmpty: Bool { pairs.isEmpty }
    /// The value bytes of the attribute whose name is `name` in UTF-8, or nil when there is none.
    public subscript(name: String) -> [UInt8]? { pairs[Array(name.utf8)] }

    /// Sorted by name bytes: the stored order and the order results are sent in.
    public var sorted: [(name: [UInt8], value: [UInt8])] {
        pairs.map { (name: $0.key, value: $0.value) }.sorted { $0.name.lexicographicallyPrecedes($1.name) }
    }

    /// Whether every pair of `query` is one of these (a Secret Service search: all given attributes
    /// match exactly; other attributes may exist).
    public func contains(_ query: SecretServiceAttributes) -> Bool {
        query.pairs.allSatisfy { pairs[$0.key] == $0.value }
    }

    /// Limits on what one item may carry over the bus, so a huge map is refused before it costs
    /// anything: at most `maxCount` attributes, each name and value at most `maxFieldBytes`, all of
    /// them together at most `maxTotalBytes`.
    public static let maxCount = 256
    /// The most bytes one attribute name or one value may have.
    public static let maxFieldBytes = 4096
    /// The most bytes all names and values together may have.
    public static let maxTotalBytes = 64 * 1024

    /// Why these attributes are refused, or nil.
    public var problem: String? {
        if pairs.count > Self.maxCount { return "at most \(Self.maxCount) attributes are allowed, not \(pairs.count)" }
        var total = 0
        for (n, v) in pairs {
            if n.count > Self.maxFieldBytes || v.count > Self.maxFieldBytes {
                return "an attribute name or value is longer than \(Self.maxFieldBytes) bytes"
            }
            total += n.count + v.count
        }
        if total > Self.maxTotalBytes {
            return "the attributes take \(total) bytes; at most \(Self.maxTotalBytes) are allowed"
        }
        return nil
    }
}

/// Where a keychain item keeps what only the Secret Service has: its attribute map and the content
/// type of its secret. They live in the item's `gena` (kSecAttrGeneric), sealed with the other
/// attributes, as `"kcss" 0x01` followed by the CBOR map `{"a": [[name, value], …], "t": type}`.
/// An item whose `gena` is anything else shows the Secret Service the attributes derived from its
/// service and account (docs/secret-service.md).
public enum SecretServiceFields {
    package static let magic: [UInt8] = [0x6B, 0x63, 0x73, 0x73, 0x01]  // "kcss", version 1
    /// The `gena` bytes for these attributes and content type.
    package static func encode(_ attributes: SecretServiceAttributes, contentType: String) -> [UInt8] {
        let pairs: [Value] = attributes.sorted.map {
            .array([.text(String(decoding: $0.name, as: UTF8.self)), .text(String(decoding: $0.value, as: UTF8.self))])
        }
        return magic + CBOR.encode(.map(["a": .array(pairs), "t": .text(contentType)]))
    }

    /// The Secret Service fields an item's `gena` holds, or nil when it holds none.
    package static func decode(_ gena: Value?) -> (attributes: SecretServiceAttributes, contentType: String)? {
        guard case .bytes(let b)? = gena, b.count > magic.count, b.starts(with: magic),
            case .map(let m)? = try? CBOR.decode(Array(b[magic.count...])),
            case .array(let list)? = m["a"], case .text(let type)? = m["t"]
        else { return nil }
        var pairs: [[UInt8]: [UInt8]] = [:]
        for entry in list {
            guard case .array(let p) = entry, p.count == 2, case .text(let n) = p[0], case .text(let v) = p[1] else {
                return nil
            }
            pairs[Array(n.utf8)] = Array(v.utf8)
        }
        return (SecretServiceAttributes(pairs), type)
    }

    /// The attribute-index entries of an item with these stored attributes: the mark and one digest
    /// per pair when it has its own Secret Service attributes, none otherwise (its service and account
    /// are searched through their own columns).
    static func indexes(for attributes: [String: Value], _ index: BlindIndexer) -> [[UInt8]] {
        if attributes["class"] == .text(ItemClass.internetPassword.code) {
            // No mark: an internet password's attributes are its own class's, not `gena`'s.
            return NetworkPassword.view(of: attributes).sorted.map {
                index.secretServiceAttribute(name: $0.name, value: $0.value)
            }
        }
        guard let own = decode(attributes["gena"]) else { return [] }
        return [index.secretServiceItemMark]
            + own.attributes.sorted.map { index.secretServiceAttribute(name: $0.name, value: $0.value) }
    }
}

/// Internet passwords on the Secret Service: the `org.gnome.keyring.NetworkPassword` schema's
/// attributes are an internet password's (docs/secret-service.md). An internet password shows the bus
/// `xdg:schema` and each of its attributes that is set; its attribute-index entries are one digest per
/// pair it shows, so a search finds it by any of them without decrypting anything.
public enum NetworkPassword {
    /// The schema's name, the value of `xdg:schema`.
    public static let schema = "org.gnome.keyring.NetworkPassword"
    /// The attribute naming the schema.
    public static let schemaAttribute = "xdg:schema"
    /// The schema's text attributes and the wire keys they are: user, server, domain, object, authtype.
    static let textFields: [(name: String, key: String)] = [
        ("user", "acct"), ("server", "srvr"), ("domain", "sdmn"), ("object", "path"), ("authtype", "atyp"),
    ]
    /// libsecret's protocol names and Apple's `kSecAttrProtocol` codes (InternetProtocol); a name or a
    /// code not in this list is kept as it is written.
    public static let protocols: [(name: String, code: String)] = [
        ("ftp", "ftp "), ("http", "http"), ("https", "htps"), ("irc", "irc "), ("ircs", "ircs"), ("nntp", "nntp"),
        ("nntps", "ntps"), ("pop3", "pop3"), ("pop3s", "pops"), ("smtp", "smtp"), ("socks", "sox "),
        ("imap", "imap"), ("imaps", "imps"), ("ldap", "ldap"), ("ldaps", "ldps"), ("afp", "afp "),
        ("telnet", "teln"), ("telnets", "tels"), ("ssh", "ssh "), ("ftps", "ftps"), ("smb", "smb "),
        ("rtsp", "rtsp"), ("daap", "daap"), ("ipp", "ipp "), ("eppc", "eppc"),
    ]

    /// The `kSecAttrProtocol` value for a libsecret protocol name.
    public static func code(ofProtocol name: String) -> String {
        protocols.first { $0.name == name }?.code ?? name
    }

    /// The libsecret protocol name for a `kSecAttrProtocol` value.
    public static func name(ofProtocol code: String) -> String {
        protocols.first { $0.code == code }?.name ?? code
    }

    /// The attributes an internet password with these stored attributes shows the bus: the schema,
    /// then each of user, server, protocol, port, domain, object and authtype that is set (not empty,
    /// a port not 0; text, or bytes that are UTF-8).
    package static func view(of attributes: [String: Value]) -> SecretServiceAttributes {
        var pairs: [[UInt8]: [UInt8]] = [Array(schemaAttribute.utf8): Array(schema.utf8)]
        for (name, key) in textFields {
            if let b = attributes[key].flatMap(Attribute.bytes(of:)), !b.isEmpty,
                String(validating: b, as: UTF8.self) != nil
            {
                pairs[Array(name.utf8)] = b
            }
        }
        if case .text(let code)? = attributes["ptcl"], !code.isEmpty {
            pairs[Array("protocol".utf8)] = Array(name(ofProtocol: code).utf8)
        }
        if case .int(let port)? = attributes["port"], port != 0 { pairs[Array("port".utf8)] = Array(String(port).utf8) }
        return SecretServiceAttributes(pairs)
    }

    /// The internet-password attributes (`acct`, `srvr`, `ptcl`, `port`, `sdmn`, `path`, `atyp`) for
    /// Secret Service attributes of the schema, or nil when they are not exactly what such an item
    /// shows back: another schema, an attribute the schema lacks, an empty value, a port that is not
    /// a decimal number from 1 to 2³²−1 written plainly. Those stay Secret Service items of their own.
    package static func attributes(for ss: SecretServiceAttributes) -> [String: Value]? {
        guard ss[schemaAttribute] == Array(schema.utf8) else { return nil }
        var stored: [String: Value] = ["class": .text(ItemClass.internetPassword.code)]
        for (key, value) in ItemClass.internetPassword.defaults { stored[key] = value }
        func text(_ name: String) -> String? { ss[name].map { String(decoding: $0, as: UTF8.self) } }
        for (name, key) in textFields { if let v = text(name) { stored[key] = .text(v) } }
        if let p = text("protocol") { stored["ptcl"] = .text(code(ofProtocol: p)) }
        if let p = text("port") {
            guard let n = UInt32(p) else { return nil }
            stored["port"] = .int(Int64(n))
        }
        return view(of: stored) == ss ? stored : nil
    }
}
