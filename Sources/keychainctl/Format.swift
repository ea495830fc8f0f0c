import KeychainClient
import KeychainCore
import KeychainSystem

// Output formats: JSON for scripts (wire keys, secrets and other bytes base64, dates ISO 8601 UTC),
// aligned text for people (dates in local time).

enum JSON {
    static func string(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20:
                let hex = Array("0123456789abcdef")
                out += "\\u00" + String(hex[Int(u.value >> 4)]) + String(hex[Int(u.value & 15)])
            default: out.unicodeScalars.append(u)
            }
        }
        return out + "\""
    }

    /// A wire value as JSON; byte strings become base64 text, dates ISO 8601 in UTC.
    static func encode(_ v: Value) -> String {
        switch v {
        case .int(let i): return String(i)
        case .bytes(let b): return string(Base64.encode(b))
        case .secret(let s): return string(Base64.encode(s.unprotectedArray))
        case .text(let s): return string(s)
        case .array(let a): return "[" + a.map(encode).joined(separator: ",") + "]"
        case .map(let m):
            return "{" + m.keys.sorted().map { string($0) + ":" + encode(m[$0]!) }.joined(separator: ",") + "}"
        case .bool(let b): return b ? "true" : "false"
        case .float(let d): return d.isFinite ? String(d) : "null"
        case .date(let d): return string(Dates.iso8601UTC(d))
        case .null: return "null"
        }
    }
}

enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ b: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((b.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= b.count {
            let n = UInt32(b[i]) << 16 | UInt32(b[i + 1]) << 8 | UInt32(b[i + 2])
            out += [
                alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)],
            ]
            i += 3
        }
        let rest = b.count - i
        if rest == 1 {
            let n = UInt32(b[i]) << 16
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], 61, 61]
        } else if rest == 2 {
            let n = UInt32(b[i]) << 16 | UInt32(b[i + 1]) << 8
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], 61]
        }
        return String(decoding: out, as: UTF8.self)
    }
}

enum Dates {
    private static func format(_ epoch: Double, _ fmt: String, local: Bool) -> String {
        WallClock.format(epoch, fmt, local: local)
    }

    /// `2025-01-31 14:05:09 +0100` in the local time zone.
    static func local(_ epoch: Double) -> String { format(epoch, "%Y-%m-%d %H:%M:%S %z", local: true) }

    /// `2025-01-31T13:05:09Z`, with milliseconds when the time has a fraction.
    static func iso8601UTC(_ epoch: Double) -> String {
        let base = format(epoch, "%Y-%m-%dT%H:%M:%S", local: false)
        let ms = Int(((epoch - epoch.rounded(.down)) * 1000).rounded(.down))
        if ms == 0 { return base + "Z" }
        let s = String(ms)
        return base + "." + String(repeating: "0", count: 3 - s.count) + s + "Z"
    }
}

/// Human-readable item attributes: one per line, labels aligned, dates in local time.
enum Human {
    private static let order: [(String, String)] = [
        ("svce", "service"), ("srvr", "server"), ("ptcl", "protocol"), ("port", "port"), ("path", "path"),
        ("sdmn", "security domain"), ("atyp", "authentication type"), ("acct", "account"), ("agrp", "access group"),
        ("labl", "label"),
        ("desc", "description"), ("icmt", "comment"), ("pdmn", "accessible"), ("accc", "access control"),
        ("sync", "synchronizable"),
        ("invi", "invisible"), ("nega", "negative"), ("crtr", "creator"), ("type", "type"), ("gena", "generic"),
        ("cdat", "created"), ("mdat", "modified"),
    ]
    private static let skipped: Set<String> = ["class", "v_Data", "v_PersistentRef", "tomb", "musr"]

    static let accessibilityNames: [String: String] = [
        "ak": "when unlocked", "ck": "after first unlock", "dk": "always",
        "akpu": "when passcode set, this device only", "aku": "when unlocked, this device only",
        "cku": "after first unlock, this device only", "dku": "always, this device only",
    ]

    static func item(_ m: [String: Value]) -> [(String, String)] {
        var rows: [(String, String)] = []
        for (key, label) in order {
            if let v = m[key] { rows.append((label, text(v, key: key))) }
        }
        let known = Set(order.map(\.0)).union(skipped)
        for key in m.keys.sorted() where !known.contains(key) {
            rows.append((key, text(m[key]!, key: key)))
        }
        return rows
    }

    /// A password as macOS `security find-… -g` shows it: quoted text when it is UTF-8 without
    /// control characters, else its bytes in hex (0x…).
    static func password(_ v: Value) -> String {
        let bytes: [UInt8]
        switch v {
        case .secret(let s): bytes = s.withUnsafeBytes { Array($0) }
        case .bytes(let b): bytes = b
        case .text(let t): bytes = Array(t.utf8)
        default: return ""
        }
        if let text = String(validating: bytes, as: UTF8.self),
            !text.unicodeScalars.contains(where: { $0.value < 0x20 })
        {
            return "\"" + text + "\""
        }
        return "0x"
            + bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }
            .joined()
    }

    static func aligned(_ rows: [(String, String)]) -> String {
        let width = rows.map(\.0.count).max() ?? 0
        return rows.map { $0.0 + String(repeating: " ", count: width - $0.0.count) + "  " + $0.1 }
            .joined(separator: "\n")
    }

    static func text(_ v: Value, key: String) -> String {
        switch v {
        case .text(let s):
            if key == "pdmn", let name = accessibilityNames[s] { return "\(s) (\(name))" }
            return s
        case .int(let i):
            if key == "crtr" || key == "type", let cc = fourCC(i) { return "\(i) ('\(cc)')" }
            return String(i)
        case .bool(let b): return b ? "yes" : "no"
        case .date(let d): return Dates.local(d)
        case .secret(let s):
            return text(.bytes(s.unprotectedArray), key: key)
        case .bytes(let b):
            if let s = String(validating: b, as: UTF8.self),
                s.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F })
            {
                return s
            }
            return "<\(b.count) bytes> " + Base64.encode(b)
        case .float(let d): return String(d)
        case .array(let a): return a.map { text($0, key: key) }.joined(separator: ", ")
        case .map(let m):
            if key == "accc", case .int(let flags)? = m["flags"] { return accessControl(flags) }
            return JSON.encode(v)
        case .null: return "-"
        }
    }

    /// An item's access control (Apple's SecAccessControlCreateFlags): what reading its data asks for.
    static func accessControl(_ flags: Int64) -> String {
        var names: [String] = []
        if flags & (1 << 4) != 0 { names.append("devicePasscode") }
        if flags & 1 != 0 { names.append("userPresence") }
        let joined = names.joined(separator: flags & (1 << 14) != 0 ? " or " : " and ")
        return "\(joined) (reading the data needs the person's presence)"
    }

    /// A four-character code when the 32-bit value is four printable ASCII bytes.
    private static func fourCC(_ i: Int64) -> String? {
        guard i > 0, i <= Int64(UInt32.max) else { return nil }
        let bytes = [UInt8(i >> 24 & 255), UInt8(i >> 16 & 255), UInt8(i >> 8 & 255), UInt8(i & 255)]
        guard bytes.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func duration(_ seconds: Double) -> String {
        let s = Int(seconds)
        if s < 60 { return "\(s)s" }
        if s < 3600 { return "\(s / 60)m \(s % 60)s" }
        if s < 86400 { return "\(s / 3600)h \(s % 3600 / 60)m" }
        return "\(s / 86400)d \(s % 86400 / 3600)h"
    }
}
