import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// A connection's memo of compiled copy queries gives what the full path gives after a passphrase is
/// set, a lock, a revocation, and changes to an item's group and accessibility (all made elsewhere).
final class CopyMemoTests: XCTestCase {
    func item(_ service: String, group: String? = nil) -> [String: Value] {
        var q: [String: Value] = ["class": .text("genp"), "svce": .text(service), "acct": .text("a")]
        if let group { q["agrp"] = .text(group) }
        return q
    }

    /// On one connection, copies of both classes with the same server/service and accounts, asked in
    /// turn many times: the memo and the generic passwords' templates never answer one class's query
    /// with the other's item.
    func testTheMemoKeepsTheClassesApart() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        for account in ["a", "b"] {
            for itemClass in ["genp", "inet"] {
                let key = itemClass == "genp" ? "svce" : "srvr"
                let add: [String: Value] = [
                    "class": .text(itemClass), key: .text("example.com"), "acct": .text(account),
                    "v_Data": .bytes(Array("\(itemClass)-\(account)".utf8)),
                ]
                XCTAssertEqual(try c.call("add", query: add).status, .success)
            }
        }
        for _ in 0..<3 {
            for account in ["a", "b"] {
                for itemClass in ["genp", "inet"] {
                    let key = itemClass == "genp" ? "svce" : "srvr"
                    let copy: [String: Value] = [
                        "class": .text(itemClass), key: .text("example.com"), "acct": .text(account),
                        "r_Data": .bool(true),
                    ]
                    XCTAssertEqual(
                        try c.call("copy", query: copy).result, .bytes(Array("\(itemClass)-\(account)".utf8)))
                }
            }
        }
    }

    func testMemoFollowsPassphraseLockAndRevoke() throws {
        let admin = DaemonHarness.App(
            id: "TEAM.admin", groups: ["TEAM.tests"], executables: [DaemonHarness.runnerExecutable], admin: true)
        let d = try DaemonHarness(apps: [admin], config: #"{"kdfProfile": "interactive"}"#)
        let c = try d.connect()
        let other = try d.connect()
        var add = item("com.example.other", group: "TEAM.other")
        add["v_Data"] = .bytes(Array("x".utf8))
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        // A second item of the same shape: asked after each change, it can only come from the
        // template of the first (another account), which must go stale as the exact entries do.
        add["acct"] = .text("b")
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        var mine = item("com.example.mine", group: "TEAM.tests")
        mine["v_Data"] = .bytes(Array("m".utf8))
        XCTAssertEqual(try c.call("add", query: mine).status, .success)

        var copyOther = item("com.example.other", group: "TEAM.other")
        copyOther["r_Data"] = .bool(true)
        var copyMine = item("com.example.mine", group: "TEAM.tests")
        copyMine["r_Data"] = .bool(true)
        for _ in 0..<3 {
            XCTAssertEqual(try c.call("copy", query: copyOther).result, .bytes(Array("x".utf8)))
            XCTAssertEqual(try c.call("copy", query: copyMine).result, .bytes(Array("m".utf8)))
        }
        // A passphrase set from another connection: the admin now needs presence outside its groups.
        let set = try other.call("passwd", arguments: ["new": .bytes(Array("pw".utf8))])
        XCTAssertEqual(set.status, .success, set.message ?? "")
        let after = try c.call("copy", query: copyOther)
        XCTAssertEqual(after.status, .authFailed, "memo served an admin read that now needs presence")
        var otherAccount = copyOther
        otherAccount["acct"] = .text("b")
        XCTAssertEqual(
            try c.call("copy", query: otherAccount).status, .authFailed,
            "a template compiled before the passphrase served an admin read that now needs presence")
        XCTAssertEqual(try c.call("copy", query: copyMine).result, .bytes(Array("m".utf8)))
        // Lock from another connection: the default class is locked away.
        XCTAssertEqual(try other.call("lock").status, .success)
        XCTAssertEqual(try c.call("copy", query: copyMine).status, .interactionNotAllowed)
        XCTAssertEqual(
            try other.call("unlock", arguments: ["passphrase": .bytes(Array("pw".utf8))]).status, .success)
        XCTAssertEqual(try c.call("copy", query: copyMine).result, .bytes(Array("m".utf8)))
        // Revocation: the registration removed and the apps reloaded.
        try FileManager.default.removeItem(atPath: d.systemAppsDirectory + "/app0.json")
        d.reloadApps()
        let revoked = try c.call("copy", query: copyMine)
        XCTAssertEqual(revoked.status, .missingEntitlement, "memo served a revoked app")
        var mineOtherAccount = copyMine
        mineOtherAccount["acct"] = .text("b")
        XCTAssertEqual(
            try c.call("copy", query: mineOtherAccount).status, .missingEntitlement, "a template served a revoked app")
    }

    func testMemoFollowsGroupAndAccessibilityChanges() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var add = item("com.example.moves", group: "TEAM.tests")
        add["v_Data"] = .bytes(Array("s".utf8))
        add["pdmn"] = .text("ak")
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        var byClass = item("com.example.moves", group: "TEAM.tests")
        byClass["pdmn"] = .text("ak")
        byClass["r_Data"] = .bool(true)
        var byGroup = item("com.example.moves", group: "TEAM.tests")
        byGroup["r_Data"] = .bool(true)
        for _ in 0..<3 {
            XCTAssertEqual(try c.call("copy", query: byClass).result, .bytes(Array("s".utf8)))
            XCTAssertEqual(try c.call("copy", query: byGroup).result, .bytes(Array("s".utf8)))
        }
        XCTAssertEqual(
            try c.call(
                "update", query: item("com.example.moves", group: "TEAM.tests"), attributes: ["pdmn": .text("dk")]
            ).status,
            .success)
        XCTAssertEqual(try c.call("copy", query: byClass).status, .itemNotFound)
        XCTAssertEqual(try c.call("copy", query: byGroup).result, .bytes(Array("s".utf8)))
        XCTAssertEqual(
            try c.call(
                "update", query: item("com.example.moves", group: "TEAM.tests"),
                attributes: ["agrp": .text("TEAM.shared")]
            ).status,
            .success)
        XCTAssertEqual(try c.call("copy", query: byGroup).status, .itemNotFound)
        var moved = item("com.example.moves", group: "TEAM.shared")
        moved["r_Data"] = .bool(true)
        XCTAssertEqual(try c.call("copy", query: moved).result, .bytes(Array("s".utf8)))
    }

    /// A query with several faults gets the same error every time, on one connection (memo in play)
    /// and on another: faults are reported in key order, not in the order of a decoded dictionary.
    func testAQueryWithSeveralFaultsGetsOneErrorEveryTime() throws {
        let d = try DaemonHarness()
        let faulty: [String: Value] = [
            "class": .int(1), "svce": .text("com.example.app"), "aJ": .int(0), "r_Data": .int(-4),
        ]
        var answers: [String] = []
        for _ in 0..<2 {
            let c = try d.connect()
            for _ in 0..<8 {
                let r = try c.call("copy", query: faulty)
                answers.append("\(r.status) \(r.message ?? "")")
            }
        }
        XCTAssertEqual(Set(answers).count, 1, "different errors for the same query: \(Set(answers))")
        XCTAssertTrue(answers[0].contains("aJ"), answers[0])
    }
    /// Queries of one template (the same query but for its service and account) are compiled from
    /// the first one seen on the connection: each must answer exactly as the full path does for that
    /// query on a fresh connection — found or not, in the caller's groups or not, whatever it returns.
    func testQueriesOfOneTemplateAnswerAsTheFullPath() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        let pairs = [
            ("s0", "a0"), ("com.example.a-service-name-longer-than-a-small-string", "a1"), ("s2", "ünïcödé"),
            ("s3", String(repeating: "x", count: 300)), ("", "a4"),
        ]
        for (i, (service, account)) in pairs.enumerated() {
            var add = item(service, group: i == 4 ? "TEAM.shared" : "TEAM.tests")
            add["acct"] = .text(account)
            add["v_Data"] = .bytes(Array("d\(i)".utf8))
            if i == 2 { add["pdmn"] = .text("ak") }
            XCTAssertEqual(try c.call("add", query: add).status, .success)
        }
        // Every stored pair, pairs that mix two items (not found), and one that names nothing stored.
        var asked = pairs + [("s0", "a1"), ("s2", "a0"), ("nothing", "here")]
        asked += asked.reversed()
        let shapes: [[String: Value]] = [
            ["r_Data": .bool(true)],
            ["r_Attributes": .bool(true), "r_Data": .bool(true)],
            ["r_Data": .bool(true), "agrp": .text("TEAM.tests")],
            ["r_Data": .bool(true), "agrp": .text("TEAM.other")],
            ["r_Data": .bool(true), "pdmn": .text("ak")],
            ["r_PersistentRef": .bool(true), "m_Limit": .text("m_LimitAll")],
            ["r_Data": .bool(true), "sync": .text("syna")],
        ]
        var served = 0
        for shape in shapes {
            for (service, account) in asked {
                var q = item(service)
                q["acct"] = .text(account)
                q.merge(shape) { _, new in new }
                let remembered = try c.call("copy", query: q)
                let full = try d.connect().call("copy", query: q)
                XCTAssertEqual(remembered.status, full.status, "\(shape) \(service)/\(account)")
                XCTAssertEqual(remembered.result, full.result, "\(shape) \(service)/\(account)")
                if full.status == .success { served += 1 }
            }
        }
        XCTAssertGreaterThan(served, 20, "too few queries found an item to compare anything")
    }

    /// A value that is not valid UTF-8, in a query whose template the connection holds, is refused
    /// as the full path refuses it: the request is not valid CBOR, and the connection is closed.
    func testAnInvalidValueInAKnownTemplateIsRefusedAsTheFullPathRefusesIt() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var add = item("s")
        add["v_Data"] = .bytes(Array("x".utf8))
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        var q = item("s")
        q["r_Data"] = .bool(true)
        XCTAssertEqual(try c.call("copy", query: q).result, .bytes(Array("x".utf8)))
        // The same query with the service "~~" made two bytes that are not UTF-8.
        var bad = item("~~")
        bad["r_Data"] = .bool(true)
        var frame = Frame.encode(Request(id: 77, op: "copy", query: bad).value)
        let at = try XCTUnwrap(
            (0..<frame.count - 2).first { frame[$0] == 0x62 && frame[$0 + 1] == 0x7E && frame[$0 + 2] == 0x7E })
        frame[at + 1] = 0xFF
        frame[at + 2] = 0xFE
        for client in [c, try d.connect()] {
            try client.sendRaw(frame)
            let r = try client.receive()
            XCTAssertEqual(r.status, .param)
            XCTAssertTrue(r.message?.contains("UTF-8") ?? false, r.message ?? "")
            XCTAssertTrue(client.isClosed(), "the connection stayed open after a request that is not valid CBOR")
        }
    }
}
