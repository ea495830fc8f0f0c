import Foundation

/// A fresh private directory for one test (mode 0700, under `$TMPDIR`), removed with everything in
/// it when the object goes away or `remove()` is called.
public final class TemporaryDirectory {
    /// The directory's absolute path.
    public let path: String

    /// Creates `<tmp>/<prefix>-XXXXXX`.
    public init(prefix: String = "keychaind-test") throws {
        var template = Array((NSTemporaryDirectory() + "/\(prefix)-XXXXXX").utf8CString)
        guard let made = mkdtemp(&template) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: prefix])
        }
        path = String(cString: made)
    }

    deinit { remove() }

    /// `path` + "/" + `name`.
    public func appending(_ name: String) -> String { path + "/" + name }

    /// Removes the directory now (later calls do nothing).
    public func remove() {
        try? FileManager.default.removeItem(atPath: path)
    }
}
