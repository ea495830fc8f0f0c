import Foundation

/// Known-answer files in `Tests/Golden`, written by an earlier keychaind (see its README.md): the
/// current code must keep opening them, byte for byte as they are.
public enum Golden {
    /// `Tests/Golden` in the source tree.
    public static let directory: String = {
        let here = URL(fileURLWithPath: #filePath)  // Tests/KeychainTestSupport/Golden.swift
        return here.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Golden").path
    }()

    /// The bytes of `Tests/Golden/<name>`.
    public static func bytes(_ name: String) throws -> [UInt8] {
        [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory + "/" + name)))
    }

    /// Copies the golden keychain `name` (a data directory) into `destination` with the modes
    /// keychaind insists on (0700 directory, 0600 files), which git does not keep.
    public static func copyKeychain(_ name: String, to destination: String) throws {
        let source = directory + "/" + name
        let files = FileManager.default
        try files.createDirectory(
            atPath: destination, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        for file in try files.contentsOfDirectory(atPath: source) {
            try files.copyItem(atPath: source + "/" + file, toPath: destination + "/" + file)
            try files.setAttributes([.posixPermissions: 0o600], ofItemAtPath: destination + "/" + file)
        }
    }
}
