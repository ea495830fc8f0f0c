import Foundation
import KeychainRequests
import Testing

@testable import KeychainDaemon

/// Flatpak app IDs: how a sandbox's `/.flatpak-info` is read, and how registrations name them.
@Suite("Flatpak registrations")
struct FlatpakRegistrationTests {
    @Test func theApplicationNameIsTheAppID() {
        let info =
            "[Instance]\nname=org.example.Other\n\n[Application]\n# a comment\nname = org.example.App\nruntime=runtime/x\n"
        #expect(FlatpakInfo.appID(in: Array(info.utf8)) == "org.example.App")
    }

    @Test func ambiguousOrInvalidFilesNameNoApp() {
        for info in [
            "[Application]\nname=org.example.One\nname=org.example.Two\n", "[Application]\nname=../etc/x\n",
            "[Application]\nname=org.example\n", "[Application]\nname=org.1example.App\n",
            "[Instance]\nname=org.example.App\n",
            "[Application\nname=org.example.App\n", "",
        ] {
            #expect(FlatpakInfo.appID(in: Array(info.utf8)) == nil, "\(info)")
        }
        #expect(FlatpakInfo.appID(in: [0xFF, 0xFE]) == nil)
    }

    @Test func aRegistrationMayNameFlatpakAppIDsInsteadOfExecutables() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fp-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let good = dir + "/good.json"
        try
            #"{"application-identifier": "T.fp", "keychain-access-groups": ["T.fp"], "flatpak-app-ids": ["org.example.App"]}"#
            .write(toFile: good, atomically: true, encoding: .utf8)
        let entry = try AppFiles.parse(file: good)
        #expect(entry.flatpakAppIDs == ["org.example.App"] && entry.executables.isEmpty)
        let registry = AppRegistry(apps: [entry], bundledCLI: nil)
        let app = registry.flatpakApp("org.example.App")
        #expect(app.applicationIdentifier == "T.fp" && !app.admin)
        let other = registry.flatpakApp("org.example.Other")
        #expect(
            other.applicationIdentifier == "flatpak.org.example.Other"
                && other.accessGroups == ["flatpak.org.example.Other"])

        let bad = dir + "/bad.json"
        try #"{"application-identifier": "T.fp", "keychain-access-groups": ["T.fp"], "flatpak-app-ids": ["not an id"]}"#
            .write(toFile: bad, atomically: true, encoding: .utf8)
        #expect(throws: ConfigurationError.self) { try AppFiles.parse(file: bad) }
        let neither = dir + "/neither.json"
        try #"{"application-identifier": "T.fp", "keychain-access-groups": ["T.fp"]}"#
            .write(toFile: neither, atomically: true, encoding: .utf8)
        #expect(throws: ConfigurationError.self) { try AppFiles.parse(file: neither) }
    }

    @Test func anAdminRegistrationIsNoAdminInASandbox() {
        var entry = AppEntry(
            applicationIdentifier: "T.admin", accessGroups: ["T.admin"], executables: [], admin: true, file: "x.json")
        entry.flatpakAppIDs = ["org.example.Admin"]
        #expect(!AppRegistry(apps: [entry], bundledCLI: nil).flatpakApp("org.example.Admin").admin)
    }
}
