import Foundation
import KeychainSystem
import Testing

@testable import KeychainDaemon

/// What a user can modify, as keychaind judges it for registered executables: owners, mode bits and
/// ACLs on the file and every directory above it, again at identification.
@Suite struct TrustedPathsTests {
    /// A user that owns nothing here (the judgement is made for it, whoever runs the test).
    static let user = TrustedPaths.Principal(uid: 64_999, groups: [64_999])

    /// A directory `<tmp>/…/bin` with an executable `app`, both 0755.
    static func makeApp() throws -> (directory: String, app: String) {
        let directory = NSTemporaryDirectory() + "kc-trusted-" + UUID().uuidString.prefix(8) + "/bin"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        chmod(FileSystem.parentDirectory(of: directory), 0o755)
        chmod(directory, 0o755)
        let app = directory + "/app"
        #expect(FileManager.default.createFile(atPath: app, contents: Data("#!/bin/sh\n".utf8)))
        chmod(app, 0o755)
        return (directory, app)
    }

    /// Writes an ACL granting rwx to the named user or group (what `setfacl -m u:UID:rwx` writes).
    static func grant(_ path: String, user: UInt32? = nil, group: UInt32? = nil) throws {
        typealias E = AccessControlList.Entry
        var entries = [E(tag: .owner, permissions: 7)]
        if let user { entries.append(E(tag: .user, permissions: 7, id: user)) }
        entries.append(E(tag: .owningGroup, permissions: 5))
        if let group { entries.append(E(tag: .group, permissions: 7, id: group)) }
        entries += [E(tag: .mask, permissions: 7), E(tag: .other, permissions: 5)]
        let hex = AccessControlList(entries: entries).attribute.map { String(format: "%02x", $0) }.joined()
        let set = Process()
        set.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        set.arguments = [
            "-c", "import os, sys; os.setxattr(sys.argv[1], 'system.posix_acl_access', bytes.fromhex(sys.argv[2]))",
            path, hex,
        ]
        try set.run()
        set.waitUntilExit()
        #expect(set.terminationStatus == 0)
    }

    @Test func anACLGrantingTheUserOrItsGroupWriteMakesAPathModifiable() throws {
        let (directory, app) = try Self.makeApp()
        defer { try? FileManager.default.removeItem(atPath: FileSystem.parentDirectory(of: directory)) }
        #expect(TrustedPaths.modifiableProblem(app, by: Self.user) == nil)
        try Self.grant(directory, user: 64_998, group: 64_997)
        #expect(TrustedPaths.modifiableProblem(app, by: Self.user) == nil, "others' entries do not count")
        try Self.grant(directory, group: 64_999)
        #expect(
            TrustedPaths.modifiableProblem(app, by: Self.user)
                == "\(directory) is writable by uid 64999 through its ACL")
        try Self.grant(directory)
        try Self.grant(app, user: 64_999)
        #expect(TrustedPaths.modifiableProblem(app, by: Self.user) == "\(app) is writable by uid 64999 through its ACL")
    }

    @Test func aCachedJudgementEndsWhenAnACLChanges() throws {
        let (directory, app) = try Self.makeApp()
        defer { try? FileManager.default.removeItem(atPath: FileSystem.parentDirectory(of: directory)) }
        let cache = TrustedPaths.UnmodifiableCache()
        // Cached at once here (a settling time in the past); keychaind waits a second.
        #expect(TrustedPaths.modifiableProblemNow(app, by: Self.user, cache: cache, settled: -10_000_000_000) == nil)
        #expect(cache.count == 1)
        try Self.grant(directory, user: 64_999)
        #expect(
            TrustedPaths.modifiableProblemNow(app, by: Self.user, cache: cache, settled: -10_000_000_000)
                == "\(directory) is writable by uid 64999 through its ACL")
    }

    @Test func aJustChangedPathIsJudgedButNotCached() throws {
        let (directory, app) = try Self.makeApp()
        defer { try? FileManager.default.removeItem(atPath: FileSystem.parentDirectory(of: directory)) }
        let cache = TrustedPaths.UnmodifiableCache()
        #expect(TrustedPaths.modifiableProblemNow(app, by: Self.user, cache: cache) == nil)
        #expect(cache.count == 0, "its directory changed less than a second ago")
    }

    @Test func aRootOwnedProblemNamesWhomTheACLLetsWrite() throws {
        let (directory, app) = try Self.makeApp()
        defer { try? FileManager.default.removeItem(atPath: FileSystem.parentDirectory(of: directory)) }
        try Self.grant(directory, user: 64_999)
        let problem = try #require(TrustedPaths.rootOwnedProblem(app))
        // As root: the ACL is what makes the directory writable; as another user, the owner is.
        #expect(
            problem == "\(directory) is writable by others: its ACL grants write to uid 64999"
                || problem.contains("not by root"), "\(problem)")
    }
}
