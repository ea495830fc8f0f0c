import KeychainSystem

/// Logging to stderr with journald priority prefixes (`<3>` error … `<7>` debug).
///
/// Messages are constant strings; details are key=value pairs of identifiers and counts only —
/// never a secret and never an attribute value.
public enum Log {
    public enum Level: Int32, Sendable, Comparable {
        case error = 3
        case warning = 4
        case notice = 5
        case info = 6
        case debug = 7
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }

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

    nonisolated(unsafe) public static var threshold: Level = .info

    public static func write(_ level: Level, _ message: StaticString, _ details: [(String, String)] = []) {
        guard level <= threshold else { return }
        var line = "<\(level.rawValue)>\(message)"
        for (k, v) in details { line += " \(k)=\(v)" }
        line += "\n"
        FileDescriptor.standard(2).writeAll(Array(line.utf8))
    }

    public static func error(_ m: StaticString, _ d: [(String, String)] = []) { write(.error, m, d) }
    public static func warning(_ m: StaticString, _ d: [(String, String)] = []) { write(.warning, m, d) }
    public static func info(_ m: StaticString, _ d: [(String, String)] = []) { write(.info, m, d) }
    public static func debug(_ m: StaticString, _ d: [(String, String)] = []) { write(.debug, m, d) }
}
