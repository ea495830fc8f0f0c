import KeychainCore
import Testing

@testable import KeychainDaemon
@testable import KeychainRequests

/// `approve` with `expect` approves a file only when it says exactly what the admin saw: every field,
/// text compared byte for byte (two spellings Unicode calls equal may be two different files).
@Suite("Approval expectations")
struct ApprovalExpectTests {
    static let entry = AppEntry(
        applicationIdentifier: "TEAM.caf\u{E9}", accessGroups: ["TEAM.a", "TEAM.b"],
        executables: ["/usr/local/bin/caf\u{E9}"], admin: false, file: "/x/apps.d/a.json")

    @Test func whatTheFileSaysMatchesItself() {
        #expect(RequestHandler.matches(RequestHandler.registrationValue(Self.entry), Self.entry))
    }

    @Test func anyDifferenceIsRefused() {
        guard case .map(let seen) = RequestHandler.registrationValue(Self.entry) else {
            Issue.record("not a map")
            return
        }
        var changes: [(String, [String: Value])] = []
        func with(_ key: String, _ value: Value?) -> [String: Value] {
            var m = seen
            m[key] = value
            return m
        }
        changes.append(("admin", with("admin", .bool(true))))
        changes.append(
            ("a group more", with("keychain-access-groups", .array([.text("TEAM.a"), .text("TEAM.b"), .text("X")]))))
        changes.append(
            ("groups reordered", with("keychain-access-groups", .array([.text("TEAM.b"), .text("TEAM.a")]))))
        // The same name, decomposed: equal as Swift strings, other bytes, possibly another file.
        changes.append(("executable decomposed", with("executables", .array([.text("/usr/local/bin/cafe\u{301}")]))))
        changes.append(("identifier decomposed", with("application-identifier", .text("TEAM.cafe\u{301}"))))
        changes.append(("a key more", with("note", .text("x"))))
        changes.append(("admin missing", with("admin", nil)))
        changes.append(
            ("executable as bytes", with("executables", .array([.bytes(Array("/usr/local/bin/caf\u{E9}".utf8))]))))
        for (what, m) in changes {
            #expect(!RequestHandler.matches(.map(m), Self.entry), "\(what)")
        }
        #expect(!RequestHandler.matches(.text("TEAM.caf\u{E9}"), Self.entry), "not a map")
    }
}
