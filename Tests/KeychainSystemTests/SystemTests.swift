import KeychainSystem
import KeychainTestSupport
import Testing

/// The system layer's promises: errors name their call, descriptors close once, secrets copy on
/// write and wipe, locks guard.
@Suite struct SystemTests {
    @Test func anErrnoKeepsItsCallAndSaysWhatTheKernelSaid() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-system")
        do {
            _ = try FileDescriptor.open(temporary.appending("missing"))
            Issue.record("opened a file that does not exist")
        } catch {
            #expect(error.code == .noEntry)
            #expect(error.call.hasPrefix("open ") && error.call.hasSuffix("/missing"))
            #expect(error.description.contains("No such file or directory"))
        }
    }

    @Test func aDescriptorClosesOnceAndRefusesUseAfterwards() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-system")
        let file = try FileDescriptor.open(temporary.appending("f"), [.readWrite, .create, .exclusive])
        try file.writeAll(Array("hello".utf8))
        #expect(file.isOpen)
        file.close()
        file.close()  // a second close does nothing
        #expect(!file.isOpen && file.rawValue == -1)
        #expect(throws: Errno.self) { try file.writeAll([1]) }
        let again = try FileDescriptor.open(temporary.appending("f"))
        #expect(try again.readToEnd() == Array("hello".utf8))
        #expect(try FileSystem.status(temporary.appending("f")).permissions == 0o600)
    }

    @Test func secretBytesCopyOnWriteAndCompareWithoutShowingContent() {
        var a = SecretBytes(Array("0123456789".utf8))
        let b = a
        a.withUnsafeMutableBytes { $0[0] = UInt8(ascii: "X") }
        #expect(b.unprotectedArray == Array("0123456789".utf8))  // the copy kept its bytes
        #expect(a.unprotectedArray == Array("X123456789".utf8))
        #expect(a != b && a.count == b.count)
        #expect(a.description == "<10 secret bytes>" && !"\(a)".contains("123"))
        for _ in 0..<100 { a.append(contentsOf: Array("more".utf8)) }  // grows through new buffers
        #expect(a.count == 410 && a.extracting(0..<10).unprotectedArray == Array("X123456789".utf8))
        a.removeFirst(400)
        #expect(a.unprotectedArray == Array("remoremore".utf8))  // the last 10 bytes moved to the front
        a.removeAll(keepingCapacity: true)
        #expect(a.isEmpty)
    }

    @Test("removeLast drops the tail and zeroes it, so the room after the bytes holds nothing")
    func secretBytesRemoveLastZeroesTheTail() {
        var a = SecretBytes(capacity: 64)
        a.append(contentsOf: Array("keep-this:drop-this-secret".utf8))
        let shared = a  // a copy sharing the buffer keeps its bytes
        a.removeLast(16)
        #expect(a.unprotectedArray == Array("keep-this:".utf8))
        #expect(shared.unprotectedArray == Array("keep-this:drop-this-secret".utf8))
        var b = SecretBytes(capacity: 64)
        b.append(contentsOf: Array("keep-this:drop-this-secret".utf8))
        b.removeLast(16)
        // The room after the bytes, as the next append sees it: zeros where the dropped bytes were.
        let room = b.append(upTo: 16) { (raw) -> Int in
            #expect(raw.allSatisfy { $0 == 0 }, "the dropped bytes are still there")
            return 0
        }
        #expect(room == 0 && b.count == 10)
        b.removeLast(0)
        b.removeLast(10)
        #expect(b.isEmpty)
    }

    @Test func lockedValuesChangeOneThreadAtATime() async {
        let counter = Locked(0)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask { for _ in 0..<1000 { counter.withLock { $0 += 1 } } }
            }
        }
        #expect(counter.withLock { $0 } == 8000)
    }

    @Test func monotonicTimeNeverGoesBack() {
        let a = MonotonicClock.nanoseconds()
        let b = MonotonicClock.nanoseconds()
        #expect(b >= a && WallClock.now() > 1_700_000_000)
    }
}
