import Foundation
import KeychainCore
import KeychainWire
import XCTest

/// The real daemon over its socket, spoken to with raw frames: the four calls, pipelining, bad input.
final class DaemonProtocolTests: XCTestCase {
    func item(_ service: String, _ account: String = "alice") -> [String: Value] {
        ["class": .text("genp"), "svce": .text(service), "acct": .text(account)]
    }

    func testFourCallsOverTheSocket() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var add = item("com.example.four")
        add["v_Data"] = .bytes(Array("s3cret".utf8))
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        XCTAssertEqual(try c.call("add", query: add).status, .duplicateItem)

        var copy = item("com.example.four")
        copy["r_Data"] = .bool(true)
        let found = try c.call("copy", query: copy)
        XCTAssertEqual(found.status, .success)
        XCTAssertEqual(found.result, .bytes(Array("s3cret".utf8)))

        XCTAssertEqual(
            try c.call("update", query: item("com.example.four"), attributes: ["v_Data": .bytes(Array("new".utf8))])
                .status, .success)
        XCTAssertEqual(try c.call("copy", query: copy).result, .bytes(Array("new".utf8)))

        XCTAssertEqual(try c.call("delete", query: item("com.example.four")).status, .success)
        let gone = try c.call("copy", query: copy)
        XCTAssertEqual(gone.status, .itemNotFound)
        XCTAssertNotNil(gone.message)
    }

    /// The same `copy` again and again on one connection (answered from the connection's memo of
    /// compiled queries after the first) still sees every write, and a change of the caller's
    /// registration, at once.
    func testRepeatedCopyOnOneConnectionFollowsWritesAndRegistrationChanges() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var add = item("com.example.memo")
        add["v_Data"] = .bytes(Array("first".utf8))
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        var copy = item("com.example.memo")
        copy["r_Data"] = .bool(true)
        for _ in 0..<3 {
            let r = try c.call("copy", query: copy)  // checks the answer carries this request's id
            XCTAssertEqual(r.status, .success)
            XCTAssertEqual(r.result, .bytes(Array("first".utf8)))
        }
        // A pipeline of the same request with different ids: each answer has its own id.
        var batch: [UInt8] = []
        for i in 0..<5 { batch += Frame.encode(Request(id: Int64(500 + i), op: "copy", query: copy).value) }
        try c.sendRaw(batch)
        for i in 0..<5 {
            let r = try c.receive()
            XCTAssertEqual(r.id, Int64(500 + i))
            XCTAssertEqual(r.result, .bytes(Array("first".utf8)))
        }
        XCTAssertEqual(
            try c.call("update", query: item("com.example.memo"), attributes: ["v_Data": .bytes(Array("second".utf8))])
                .status, .success)
        XCTAssertEqual(try c.call("copy", query: copy).result, .bytes(Array("second".utf8)))

        // The runner's registration now grants another group only: the open connection's next copy
        // of the same bytes no longer reaches the item.
        try d.register(
            DaemonHarness.App(id: "TEAM.tests", groups: ["TEAM.other"], executables: [DaemonHarness.runnerExecutable]),
            name: "app0")
        d.reloadApps()
        XCTAssertEqual(try c.call("copy", query: copy).status, .itemNotFound)
        try d.register(DaemonHarness.defaultApps[0], name: "app0")
        d.reloadApps()
        XCTAssertEqual(try c.call("copy", query: copy).result, .bytes(Array("second".utf8)))

        XCTAssertEqual(try c.call("delete", query: item("com.example.memo")).status, .success)
        XCTAssertEqual(try c.call("copy", query: copy).status, .itemNotFound)
    }

    func testPipelinedRequestsAreAnsweredInOrderWithTheirIDs() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var batch: [UInt8] = []
        for i in 0..<100 {
            var q = item("com.example.pipe", "user\(i)")
            q["v_Data"] = .bytes([UInt8(i)])
            batch += Frame.encode(Request(id: Int64(1000 + i), op: "add", query: q).value)
        }
        try c.sendRaw(batch)
        for i in 0..<100 {
            let r = try c.receive()
            XCTAssertEqual(r.id, Int64(1000 + i))
            XCTAssertEqual(r.status, .success)
        }
        var all = item("com.example.pipe")
        all.removeValue(forKey: "acct")
        all["m_Limit"] = .text("m_LimitAll")
        all["r_Attributes"] = .bool(true)
        XCTAssertEqual(try c.call("copy", query: all).result?.array?.count, 100)
    }

    func testWellFramedWrongRequestsGetErrSecParamAndTheConnectionStaysUsable() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        XCTAssertEqual(try c.call("frobnicate").status, .param)
        XCTAssertEqual(try c.call("copy").status, .param)  // no query
        try c.sendRaw(Frame.encode(.map(["v": .int(1), "id": .int(9), "op": .int(3)])))
        let wrongType = try c.receive()
        XCTAssertEqual(wrongType.status, .param)
        XCTAssertEqual(wrongType.id, 9)
        try c.sendRaw(
            Frame.encode(
                .map([
                    "v": .int(1), "id": .int(10), "op": .text("copy"),
                    "query": .map(["class": .text("genp"), "svce": .int(5)]),
                ])))
        XCTAssertEqual(try c.receive().status, .param)
        var unknown = item("x")
        unknown["zzzz"] = .text("?")
        XCTAssertEqual(try c.call("copy", query: unknown).status, .noSuchAttr)
        XCTAssertEqual(try c.call("status").status, .success, "the connection is still usable")
    }

    func testBytesThatAreNotCBORCloseTheConnectionAfterAnError() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        try c.sendRaw([0, 0, 0, 3, 0xFF, 0xFF, 0xFF])
        let r = try c.receive()
        XCTAssertEqual(r.status, .param)
        XCTAssertTrue(c.isClosed())
        let other = try d.connect()
        XCTAssertEqual(try other.call("status").status, .success, "the daemon keeps serving")
    }

    func testACBORValueThatIsNotAMapClosesTheConnection() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        try c.sendRaw(Frame.encode(.array([.int(1)])))
        XCTAssertEqual(try c.receive().status, .param)
        XCTAssertTrue(c.isClosed())
    }

    func testAnOversizedFrameIsRefusedBeforeItsBodyArrives() throws {
        let d = try DaemonHarness(config: #"{"maxFrameBytes": 4096}"#)
        let c = try d.connect()
        try c.sendRaw([0, 0, 0x10, 0x01])  // 4097 bytes announced, none sent
        let r = try c.receive()
        XCTAssertEqual(r.status, .param)
        XCTAssertTrue(r.message?.contains("exceeds") ?? false)
        XCTAssertTrue(c.isClosed())
    }

    func testATruncatedFrameGetsAnErrorWhenTheClientStopsSending() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        try c.sendRaw([0, 0, 0, 100, 0xA1, 0x61])
        shutdown(c.socket.fd, Int32(SHUT_WR))
        let r = try c.receive()
        XCTAssertEqual(r.status, .param)
        XCTAssertTrue(c.isClosed())
    }

    func testAHalfFrameOrASilentClientDelaysNoOneElse() throws {
        let d = try DaemonHarness()
        let silent = try d.connect()
        let half = try d.connect()
        try half.sendRaw([0, 0, 0, 50, 0xA3])
        // Answered while both are still open: a daemon that waited on either would never answer
        // (the receive would time out after DaemonHarness.eventTimeout and fail the test).
        try withExtendedLifetime((silent, half)) {
            let other = try d.connect()
            XCTAssertEqual(try other.call("status").status, .success)
        }
    }

    func testAThousandConnectionsAreServedAtOnce() throws {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = max(limit.rlim_cur, min(limit.rlim_max, 4096))
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        let d = try DaemonHarness()
        var clients: [RawClient] = []
        for _ in 0..<1000 { clients.append(try d.connect()) }
        for c in clients { try c.send(Request(id: 1, op: "status")) }
        var ok = 0
        for c in clients where try c.receive().status == .success { ok += 1 }
        XCTAssertEqual(ok, 1000)
        let status = try clients[0].call("status")
        XCTAssertEqual(status.result?.map?["connections"]?.int, 1000)
    }

    func testStatusReportsVersionItemsAndCaller() throws {
        let d = try DaemonHarness()
        let c = try d.connect()
        var add = item("com.example.status")
        add["v_Data"] = .bytes([1])
        XCTAssertEqual(try c.call("add", query: add).status, .success)
        let s = try c.call("status").result?.map
        XCTAssertEqual(s?["items"]?.int, 1)
        XCTAssertEqual(s?["caller"]?.text, "TEAM.tests")
        XCTAssertEqual(s?["locked"]?.bool, false)
        XCTAssertNotNil(s?["version"]?.text)
    }
}
