import KeychainSystem

/// sd_notify without libsystemd: one datagram to `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket).
public enum ServiceNotifier {
    /// Sends `message` (e.g. `READY=1`) to systemd; does nothing when `$NOTIFY_SOCKET` is unset or unreachable.
    public static func send(_ message: String) {
        guard let path = CurrentProcess.environment("NOTIFY_SOCKET"),
            let address = try? SocketAddress(path: path),
            let socket = try? Socket.datagram()
        else { return }
        try? socket.send(Array(message.utf8), to: address)
    }
}
