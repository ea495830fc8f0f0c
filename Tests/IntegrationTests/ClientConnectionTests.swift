import Foundation
import KeychainClient
import KeychainCore
import KeychainServices
import KeychainSystem
import KeychainWire
import XCTest

/// A scripted stand-in for keychaind, to put the shared connection through what the real daemon
/// rarely does on cue: dying mid-request, answering out of order, answering slowly.
final class FakeDaemon: @unchecked Sendable {
    let path: String
    private let listener: Int32
    private let lock = NSLock()
    private var _requests: [(connection: Int, request: Request)] = []
    /// Called for each connection (numbered from 0) on its own thread.
    private let serve: @Sendable (FakeDaemon, UnixSocket, Int) -> Void

    init(serve: @escaping @Sendable (FakeDaemon, UnixSocket, Int) -> Void) throws {
        path = NSTemporaryDirectory() + "fake-keychaind-\(UUID().uuidString.prefix(8)).sock"
        self.serve = serve
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let bound = Socket(adopting: dup(listener))
        defer { bound.close() }
        do {
            try bound.bind(to: try SocketAddress(path: path))
            try bound.listen(backlog: 64)
        } catch {
            throw HarnessError("cannot listen on \(path)")
        }
        // The accept loop holds the fake until `stop` shuts the listener down (tests stop their fakes
        // in a teardown block): accept fails from then on, and the loop closes it and lets go.
        // (Not a weak reference: LeakSanitizer reports its side table as leaked when a serving
        // thread still holds the fake at exit.)
        let listener = self.listener
        Thread.detachNewThread { [self] in
            defer { close(listener) }
            var n = 0
            while true {
                let fd = accept(listener, nil, nil)
                if fd < 0 { return }
                let conn = UnixSocket(adopting: fd)
                let index = n
                n += 1
                Thread.detachNewThread { self.serve(self, conn, index) }
            }
        }
    }

    /// Stops listening and removes the socket file (twice is harmless); the accept loop then lets
    /// go of the fake. Tests stop their fakes in a teardown block (`fakeDaemon`).
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        unlink(path)
    }

    var requests: [(connection: Int, request: Request)] { lock.withLock { _requests } }

    func receive(_ socket: UnixSocket, _ frames: inout FrameBuffer, connection: Int) -> Request? {
        guard let body = try? socket.readFrame(&frames), let value = try? CBOR.decode(body),
            let request = try? Request(value)
        else { return nil }
        lock.withLock { _requests.append((connection, request)) }
        return request
    }

    func answer(_ socket: UnixSocket, _ response: Response) {
        try? socket.writeAll(Frame.encode(response.value))
    }
}

final class ClientConnectionTests: XCTestCase {
    /// A fake stopped (its socket file removed) when the test ends.
    func fakeDaemon(serve: @escaping @Sendable (FakeDaemon, UnixSocket, Int) -> Void) throws -> FakeDaemon {
        let fake = try FakeDaemon(serve: serve)
        addTeardownBlock { fake.stop() }
        return fake
    }

    /// Answers every request with success and, for copy, the request id as bytes.
    static func echo(_ d: FakeDaemon, _ s: UnixSocket, _ c: Int) {
        var frames = FrameBuffer()
        while let r = d.receive(s, &frames, connection: c) {
            d.answer(s, Response(id: r.id, result: r.op == "copy" ? .int(r.id) : nil))
        }
    }

    /// The first connection reads one request and dies without answering; later ones answer.
    static func dropFirstRequest(_ d: FakeDaemon, _ s: UnixSocket, _ c: Int) {
        if c == 0 {
            var frames = FrameBuffer()
            _ = d.receive(s, &frames, connection: c)
            s.close()
            return
        }
        echo(d, s, c)
    }

    func testARequestLostWithTheConnectionIsReplayedOnlyWhenHarmless() throws {
        let fake = try fakeDaemon(serve: ClientConnectionTests.dropFirstRequest)
        let copyConnection = KeychainConnection(socketPath: fake.path)
        XCTAssertNotNil(try copyConnection.call(.copy, query: ["class": .text("genp")]), "copy is replayed")
        XCTAssertEqual(fake.requests.map(\.connection), [0, 1])

        let fake2 = try fakeDaemon(serve: ClientConnectionTests.dropFirstRequest)
        let addConnection = KeychainConnection(socketPath: fake2.path)
        XCTAssertThrowsError(try addConnection.call(.add, query: ["class": .text("genp")])) { error in
            let e = error as? KeychainError
            XCTAssertEqual(e?.status, .notAvailable)
            XCTAssertTrue(e?.message.contains("may or may not have been carried out") ?? false, e?.message ?? "")
            XCTAssertTrue(e?.message.contains(fake2.path) ?? false)
        }
        XCTAssertEqual(fake2.requests.count, 1, "an add is never sent twice")
        XCTAssertNoThrow(try addConnection.call(.add, query: ["class": .text("genp")]), "the next call reconnects")
    }

    func testResponsesAreRoutedByIDWhenAnsweredOutOfOrder() throws {
        // Collects 16 requests, then answers them last to first.
        let fake = try fakeDaemon { d, s, c in
            var frames = FrameBuffer()
            var batch: [Request] = []
            while let r = d.receive(s, &frames, connection: c) {
                batch.append(r)
                if batch.count == 16 {
                    for r in batch.reversed() { d.answer(s, Response(id: r.id, result: r.query?["n"])) }
                    batch = []
                }
            }
        }
        let connection = KeychainConnection(socketPath: fake.path)
        let wrong = LockedCounter()
        let done = DispatchGroup()
        for i in 0..<16 {  // 16 threads blocked at once (concurrentPerform would run only one per core)
            done.enter()
            Thread.detachNewThread {
                let result = try? connection.call(.copy, query: ["n": .int(Int64(i))])
                if result != .int(Int64(i)) { wrong.increment() }
                done.leave()
            }
        }
        XCTAssertEqual(done.wait(timeout: .now() + DaemonHarness.eventTimeout), .success)
        XCTAssertEqual(wrong.value, 0)
        XCTAssertEqual(Set(fake.requests.map(\.connection)), [0], "one connection, pipelined")
    }

    func testAsyncCallsDoNotOccupyTheCooperativePool() async throws {
        // The fake answers nothing until all 64 requests are in: only calls that wait without
        // holding a cooperative thread (2 here) can all be in flight at once. If they blocked the
        // pool, the fake would give up after DaemonHarness.eventTimeout and record that it had to.
        let calls = 64
        let allInFlight = LockedCounter()
        let fake = try fakeDaemon { d, s, c in
            var tv = timeval(tv_sec: Int(DaemonHarness.eventTimeout), tv_usec: 0)
            setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var frames = FrameBuffer()
            var held: [Request] = []
            while held.count < calls, let r = d.receive(s, &frames, connection: c) { held.append(r) }
            if held.count == calls { allInFlight.increment() }
            for r in held.reversed() { d.answer(s, Response(id: r.id, result: .int(r.id))) }
            while let r = d.receive(s, &frames, connection: c) { d.answer(s, Response(id: r.id, result: .int(r.id))) }
        }
        let connection = KeychainConnection(socketPath: fake.path)
        let answered = try await withThrowingTaskGroup(of: Value?.self) { group in
            for _ in 0..<calls {
                group.addTask { try await connection.call(.copy, query: [:]) }
            }
            var results: [Value?] = []
            for try await r in group { results.append(r) }
            return results
        }
        XCTAssertEqual(allInFlight.value, 1, "all \(calls) calls were waiting for their answers at the same time")
        XCTAssertEqual(Set(answered.compactMap { $0?.int }).count, calls, "each call got its own answer")
    }

    func testOversizedRequestsAreRefusedBeforeSending() throws {
        let fake = try fakeDaemon(serve: ClientConnectionTests.echo)
        let connection = KeychainConnection(socketPath: fake.path)
        XCTAssertThrowsError(
            try connection.call(.add, query: ["v_Data": .bytes([UInt8](repeating: 0, count: 65 << 20))])
        ) {
            XCTAssertEqual(($0 as? KeychainError)?.status, .param)
        }
        XCTAssertNoThrow(try connection.call(.copy))
        XCTAssertEqual(fake.requests.count, 1)
    }

    /// After `fork()` the child must not speak on the parent's connection (the daemon identified the
    /// parent when it connected): it opens its own, and nothing it does cuts the parent's.
    func testAForkedChildOpensItsOwnConnectionAndLeavesTheParentsAlone() throws {
        // ThreadSanitizer kills a child that starts a thread after a multi-threaded fork (its own
        // limitation; the test runs in the plain and the AddressSanitizer suites).
        if dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_init") != nil {
            throw XCTSkip("ThreadSanitizer does not support threads in a child of a multi-threaded fork")
        }
        let daemon = try DaemonHarness()
        let connection = KeychainConnection(socketPath: daemon.socketPath)
        let keychain = Keychain(service: "com.example.fork", connection: connection)
        try keychain.set("parent", forKey: "k")
        XCTAssertTrue(connection.isConnected)
        let generation = connection.linkGeneration

        let pid = fork()
        if pid == 0 {
            // The child: no XCTest here; the exit status says what went wrong.
            var code: Int32 = 0
            let inherited = connection.isConnected
            connection.disconnect()  // drops the inherited link: must not shut it down
            if inherited {
                code = 10  // the parent's link counted as the child's
            } else if (try? keychain.string(forKey: "k")) != "parent" {
                code = 11
            } else if (try? keychain.set("child", forKey: "k")) == nil {
                code = 12
            } else if connection.linkGeneration != generation + 1 {
                code = 13  // not exactly one new connection of its own
            }
            connection.disconnect()
            _exit(code)
        }
        XCTAssertGreaterThan(pid, 0, "fork failed: \(String(cString: strerror(errno)))")
        XCTAssertEqual(try waitForExit(pid), 0, "the child's check failed (see the codes above)")
        XCTAssertEqual(try keychain.string(forKey: "k"), "child")
        XCTAssertEqual(connection.linkGeneration, generation, "the parent kept its own connection")
        XCTAssertTrue(connection.isConnected)
    }

    /// The exit status of child `pid`, waiting up to 60 s (then it is killed and the test fails).
    private func waitForExit(_ pid: pid_t) throws -> Int32 {
        let deadline = Date().addingTimeInterval(60)
        var status: Int32 = 0
        while Date() < deadline {
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F) }
            if r < 0 && errno != EINTR { throw HarnessError("waitpid: \(String(cString: strerror(errno)))") }
            usleep(10_000)
        }
        kill(pid, SIGKILL)
        _ = waitpid(pid, &status, 0)
        throw HarnessError("the forked child did not finish within 60 s")
    }
}
