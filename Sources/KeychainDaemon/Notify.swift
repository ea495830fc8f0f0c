#if canImport(Glibc)
import Glibc
#endif
import KeychainWire

/// sd_notify without libsystemd: one datagram to `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket).
public enum ServiceNotifier {
    public static func send(_ message: String) {
        guard let raw = getenv("NOTIFY_SOCKET") else { return }
        let path = String(cString: raw)
        guard var address = try? SocketAddress(path: path) else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let bytes = Array(message.utf8)
        _ = address.withSockaddr { addr, len in
            bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), addr, len) }
        }
    }
}
