import KeychainSystem

/// Logging to stderr with journald priority prefixes (`<3>` error … `<7>` debug).
///
/// Messages are constant strings; details are key=value pairs of identifiers and counts only —
/// never a secret and never an attribute value.
public enum Log {
    /// How serious a log line is; the raw value is the journald priority it is prefixed with.
    public enum Level: Int32, Sendable, Comparable {
        case error = 3
        case warning = 4
        case notice = 5
        case info = 6
        case debug = 7
        /// Orders by priority number: `error` < `warning` < … < `debug`, the more severe first.
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }

        /// The level named `name` (`error`, `warning`, `notice`, `info`, `debug`), or nil for any other name.
        public init?(name: String) {
            switch name {
            case "error": self = .error
            case "warning": self = .warning
            case "notice": self = .notice
            case "info": self = .info
            case "debug": self = .debug
            default: return nil
            }
        }
    }

    /// The least severe level written; set at start from the settings (`--log-level`, `logLevel`).
    nonisolated(unsafe) public static var threshold: Level = .info

    /// Writes one line, `<priority>message key=value…`, to stderr when `level` passes the threshold.
    /// Control characters in a detail (a file name may hold a newline) are written as `\n`, `\u{1b}`
    /// and so on, so a value can never start a line of its own, with a priority of its choosing.
    public static func write(_ level: Level, _ message: StaticString, _ details: [(String, String)] = []) {
        guard level <= threshold else { return }
        var line = "<\(level.rawValue)>\(message)"
        for (k, v) in details { line += " \(k)=\(escaped(v))" }
        line += "\n"
        FileDescriptor.standard(2).writeAll(Array(line.utf8))
    }

    /// `value` with its control characters (C0, DEL, C1) escaped; the common case, none, is not copied.
    package static func escaped(_ value: String) -> String {
        func isControl(_ u: Unicode.Scalar) -> Bool { u.value < 0x20 || (0x7F...0x9F).contains(u.value) }
        guard value.unicodeScalars.contains(where: isControl) else { return value }
        var out = ""
        for u in value.unicodeScalars {
            if u == "\n" {
                out += "\\n"
            } else if isControl(u) {
                out += "\\u{\(String(u.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(u)
            }
        }
        return out
    }

    /// Logs `m` with details `d` at error level; details must never hold a secret or attribute value.
    public static func error(_ m: StaticString, _ d: [(String, String)] = []) { write(.error, m, d) }
    /// Logs `m` with details `d` at warning level; details must never hold a secret or attribute value.
    public static func warning(_ m: StaticString, _ d: [(String, String)] = []) { write(.warning, m, d) }
    /// Logs `m` with details `d` at info level; details must never hold a secret or attribute value.
    public static func info(_ m: StaticString, _ d: [(String, String)] = []) { write(.info, m, d) }
    /// Logs `m` with details `d` at debug level; details must never hold a secret or attribute value.
    public static func debug(_ m: StaticString, _ d: [(String, String)] = []) { write(.debug, m, d) }
}
