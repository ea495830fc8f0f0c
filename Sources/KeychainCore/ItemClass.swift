/// The item classes keychaind stores, as data: each class's wire code, its attributes (wire key,
/// Apple's constant, type), the attributes that make an item unique and the two that are indexed.
/// Read by the query parser and the item store (KeychainItems), the blind indexes (ItemCodec), the
/// `Security` module's constants and conversions, and `keychainctl`; docs/protocol.md §7 is its text.
public struct ItemClass: Sendable, Hashable, CustomStringConvertible {
    /// The value type of an attribute, and the coercions an input value gets (KeychainItems/Attribute.swift).
    public enum AttributeType: Sendable, Hashable {
        /// text or bytes, kept as written; compared by bytes (UTF-8 for text), as Apple's SHA-1 columns do
        case stringOrData
        /// text only
        case text
        /// one of the accessibility codes
        case accessibility
        /// bytes (text tolerated), kept as written
        case data
        /// unsigned 32-bit integer (a FourCC, a port); bools → 0/1, decimal strings parsed
        case uint32
        /// boolean; integers and "0"/"1" accepted
        case flag
        /// date (CBOR tag 1)
        case date
    }

    /// One attribute: its wire key, Apple's constant and its type.
    public struct AttributeSpec: Sendable, Hashable {
        /// The wire key (`srvr`).
        public let key: String
        /// Apple's constant (`kSecAttrServer`).
        public let constant: String
        /// Its value type.
        public let type: AttributeType

        init(_ key: String, _ constant: String, _ type: AttributeType) {
            self.key = key
            self.constant = constant
            self.type = type
        }
    }

    /// The wire value of `class` (`genp`, `inet`): also the first four bytes of a persistent reference.
    public let code: String
    /// Apple's constant (`kSecClassGenericPassword`).
    public let constant: String
    /// How messages name its items ("generic password").
    public let name: String
    /// Its own attributes (the common ones are `common`), in the order docs and listings show them.
    public let own: [AttributeSpec]
    /// Apple's uniqueness key besides the class itself, in the order it is hashed: two items of the
    /// class with equal values of all of these (absent counting as empty) are errSecDuplicateItem.
    public let uniqueness: [String]
    /// The two attributes whose keyed digests are the store's search columns (`svce_ix`, `acct_ix`),
    /// besides the access group's: what a query naming them finds without opening rows.
    public let indexed: (primary: String, account: String)
    /// Attributes stored with these values when an add does not name them (so always returned, and
    /// matched by a query that names the default, as Apple's columns with default values are).
    public let defaults: [String: Value]

    /// Two classes are the same when their codes are.
    public static func == (a: ItemClass, b: ItemClass) -> Bool { a.code == b.code }
    /// Hashes the code.
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }
    /// The wire code.
    public var description: String { code }

    /// Every attribute of the class: its own, then the common ones.
    public let attributes: [AttributeSpec]
    /// The wire keys of `attributes`.
    public let keys: Set<String>

    /// The attribute of the class with wire key `key`, or nil.
    public func attribute(_ key: String) -> AttributeSpec? { attributes.first { $0.key == key } }

    /// Whether the class has an attribute with wire key `key`.
    public func has(_ key: String) -> Bool { keys.contains(key) }

    /// Whether `key` is part of the class's uniqueness key.
    public func isUnique(_ key: String) -> Bool { uniqueness.contains(key) }

    /// The attributes every class has (docs/protocol.md §7).
    public static let common: [AttributeSpec] = [
        .init("agrp", "kSecAttrAccessGroup", .text),
        .init("pdmn", "kSecAttrAccessible", .accessibility),
        .init("labl", "kSecAttrLabel", .stringOrData),
        .init("desc", "kSecAttrDescription", .stringOrData),
        .init("icmt", "kSecAttrComment", .stringOrData),
        .init("crtr", "kSecAttrCreator", .uint32),
        .init("type", "kSecAttrType", .uint32),
        .init("invi", "kSecAttrIsInvisible", .flag),
        .init("nega", "kSecAttrIsNegative", .flag),
        .init("sync", "kSecAttrSynchronizable", .flag),
        .init("cdat", "kSecAttrCreationDate", .date),
        .init("mdat", "kSecAttrModificationDate", .date),
    ]

    /// `kSecClassGenericPassword`.
    public static let genericPassword = ItemClass(
        code: "genp", constant: "kSecClassGenericPassword", name: "generic password",
        own: [
            .init("svce", "kSecAttrService", .stringOrData),
            .init("acct", "kSecAttrAccount", .stringOrData),
            .init("gena", "kSecAttrGeneric", .data),
        ],
        uniqueness: ["agrp", "svce", "acct", "sync"],
        indexed: (primary: "svce", account: "acct"),
        defaults: ["svce": .text(""), "acct": .text("")])

    /// `kSecClassInternetPassword`.
    public static let internetPassword = ItemClass(
        code: "inet", constant: "kSecClassInternetPassword", name: "internet password",
        own: [
            .init("acct", "kSecAttrAccount", .stringOrData),
            .init("srvr", "kSecAttrServer", .stringOrData),
            .init("ptcl", "kSecAttrProtocol", .text),
            .init("atyp", "kSecAttrAuthenticationType", .text),
            .init("port", "kSecAttrPort", .uint32),
            .init("path", "kSecAttrPath", .stringOrData),
            .init("sdmn", "kSecAttrSecurityDomain", .stringOrData),
        ],
        uniqueness: ["agrp", "acct", "srvr", "ptcl", "atyp", "port", "path", "sdmn", "sync"],
        indexed: (primary: "srvr", account: "acct"),
        defaults: ["acct": .text(""), "srvr": .text(""), "path": .text(""), "sdmn": .text(""), "port": .int(0)])

    /// Every class, generic passwords first.
    public static let all: [ItemClass] = [.genericPassword, .internetPassword]

    /// The class with wire code `code`, or nil.
    public init?(code: String) {
        switch code {
        case "genp": self = .genericPassword
        case "inet": self = .internetPassword
        default: return nil
        }
    }

    /// The classes' codes as a message lists them: "genp or inet".
    public static var codeList: String { all.map(\.code).joined(separator: " or ") }

    init(
        code: String, constant: String, name: String, own: [AttributeSpec], uniqueness: [String],
        indexed: (primary: String, account: String), defaults: [String: Value]
    ) {
        self.code = code
        self.constant = constant
        self.name = name
        self.own = own
        attributes = own + Self.common
        keys = Set(attributes.map(\.key))
        self.uniqueness = uniqueness
        self.indexed = indexed
        self.defaults = defaults
    }
}

/// Apple's `kSecAttrProtocol` values (SecItem.h): four-letter codes, some padded with a space.
public enum InternetProtocol {
    /// (Apple's constant suffix, wire value), e.g. ("HTTPS", "htps").
    public static let all: [(name: String, code: String)] = [
        ("FTP", "ftp "), ("FTPAccount", "ftpa"), ("HTTP", "http"), ("IRC", "irc "), ("NNTP", "nntp"),
        ("POP3", "pop3"), ("SMTP", "smtp"), ("SOCKS", "sox "), ("IMAP", "imap"), ("LDAP", "ldap"),
        ("AppleTalk", "atlk"), ("AFP", "afp "), ("Telnet", "teln"), ("SSH", "ssh "), ("FTPS", "ftps"),
        ("HTTPS", "htps"), ("HTTPProxy", "htpx"), ("HTTPSProxy", "htsx"), ("FTPProxy", "ftpx"),
        ("SMB", "smb "), ("RTSP", "rtsp"), ("RTSPProxy", "rtsx"), ("DAAP", "daap"),
        ("EPPC", "eppc"), ("IPP", "ipp "), ("NNTPS", "ntps"), ("LDAPS", "ldps"), ("TelnetS", "tels"),
        ("IMAPS", "imps"), ("IRCS", "ircs"), ("POP3S", "pops"),
    ]
}

/// Apple's `kSecAttrAuthenticationType` values (SecItem.h).
public enum AuthenticationType {
    /// (Apple's constant suffix, wire value), e.g. ("HTMLForm", "form").
    public static let all: [(name: String, code: String)] = [
        ("NTLM", "ntlm"), ("MSN", "msna"), ("DPA", "dpaa"), ("RPA", "rpaa"), ("HTTPBasic", "http"),
        ("HTTPDigest", "httd"), ("HTMLForm", "form"), ("Default", "dflt"),
    ]
}
