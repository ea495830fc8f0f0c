/// The product's one version: `keychaind --version`, the `status` operation, the start-up log line,
/// and the Debian package (scripts/package reads it from this line).
public enum Product {
    /// The version of keychaind and of everything built with it.
    public static let version = "0.1.0"
}
