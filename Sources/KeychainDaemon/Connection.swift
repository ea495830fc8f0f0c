import KeychainCore
import KeychainItems
import KeychainRequests
import KeychainSystem
import KeychainWire
import Synchronization

/// One client connection, served on its own thread with blocking I/O.
///
/// Reads whatever has arrived, answers every complete frame in order, and writes the answers in one
/// go (pipelined requests cost one write). Every read says which process wrote the bytes
/// (SCM_CREDENTIALS): they must come from the process identified at accept. A client that sends half
/// a frame, nothing, or stops reading holds only this thread; the idle and send timeouts end it.
/// Until the peer is an identified app its frames and buffers stay small.
///
/// Not Sendable: made on the thread that serves it (Daemon.admit) and used by that thread only.
final class Connection {
    let socket: UnixSocket
    let peer: ConnectionPeer
    let handler: RequestHandler
    let maxFrameBytes: Int
    let budget: BufferBudget

    /// The largest frame a peer that is not an identified app may send (a `status` request is tens of bytes).
    static let unidentifiedFrameBytes = 16 * 1024
    static let flushBytes = 256 * 1024

    init(socket: UnixSocket, peer: ConnectionPeer, handler: RequestHandler, maxFrameBytes: Int, budget: BufferBudget) {
        self.socket = socket
        self.peer = peer
        self.handler = handler
        self.maxFrameBytes = maxFrameBytes
        self.budget = budget
    }

    /// Serves until the peer closes, misbehaves, idles out, or the daemon stops reading (SHUT_RD).
    /// The caller closes the socket afterwards.
    func run() {
        // Requests and responses may carry secrets: every buffer they pass through is wiping storage.
        // Reads land straight in the frame buffer, and each frame is handled where it lies there.
        var frames = FrameBuffer(maxBytes: Self.unidentifiedFrameBytes)
        var output = SecretBytes(capacity: 4 * 1024)
        var held = 0  // this connection's share of the budget for partial frames
        // Its share for answers, from when they are built until they are written.
        let answers = AnswerLedger(budget: budget)
        peer.answers = answers
        let memo = CopyMemo()
        defer {
            _ = budget.adjust(by: -held)
            answers.release()
            // Its buffers (64 KiB of frames once identified) are freed as it returns: a thousand
            // connections that close count towards giving the heap's free pages back.
            HeapMemory.freed(frames.capacity + output.capacity)
        }
        let pid = peer.identity.pid
        // Held in locals for the whole connection, so the closures below borrow them instead of
        // loading (and retaining) them from `self` on every request.
        let handler = self.handler
        let peer = self.peer
        let sock = socket.socket
        // Without SO_PEERPIDFD, bytes that were waiting when the process was pinned must come with
        // their writer's pidfd (PeerIdentity.firstWriteNeedsProof): asked of the first read only.
        var proofPending = peer.identity.firstWriteNeedsProof
        while true {
            // An identified app gets the configured frame limit and larger reads.
            let identified = peer.isIdentified(in: handler.registrar)
            frames.maxBytes = identified ? maxFrameBytes : Self.unidentifiedFrameBytes
            let n: Int
            var writer: Int32 = 0
            var passed: ProcessHandle? = nil
            do {
                n = try frames.receive(upTo: identified ? 64 * 1024 : 4 * 1024) { (b) throws(Errno) in
                    if proofPending {
                        let got = try sock.receiveWithWriterAndProcess(into: b)
                        writer = got.writer
                        passed = got.process
                        return got.count
                    }
                    let got = try sock.receiveWithWriter(into: b)
                    writer = got.writer
                    return got.count
                }
            } catch {
                if error.code.isTimeout {
                    Log.debug("connection idle timeout", [("pid", String(pid))])
                }
                return
            }
            if n == 0 {
                if frames.pendingCount > 0 {
                    Log.info("connection closed: truncated frame", [("pid", String(pid))])
                    let r = Response(
                        id: 0,
                        error: .param(
                            "connection closed in the middle of a frame (\(frames.pendingCount) bytes pending)"))
                    try? socket.writeAll(r.frame())
                }
                return
            }
            if proofPending {
                proofPending = false
                let proven = passed.map { peer.identity.process?.isSameProcess(as: $0) ?? false } ?? false
                passed = nil
                if !proven {
                    Log.warning(
                        "connection closed: first request sent before the pin, without its writer's pidfd",
                        [("pid", String(pid)), ("writer", String(writer))])
                    try? socket.writeAll(
                        Response(id: 0, error: AccessPolicy.unprovenFirstWrite(identifiedPID: pid)).frame())
                    socket.drainForClose()
                    return
                }
            }
            if let refusal = AccessPolicy.checkWriter(
                writerPID: writer, identifiedPID: pid,
                identifiedIsRunning: peer.identity.process?.isRunning ?? true)
            {
                Log.warning(
                    "connection closed: frame from another process", [("pid", String(pid)), ("writer", String(writer))])
                try? socket.writeAll(Response(id: 0, error: refusal).frame())
                socket.drainForClose()
                return
            }
            var close = false
            while !close {
                // The answer is framed while the request is still lent: nothing of it is moved out.
                let handled: Bool?  // whether to close after it
                do {
                    handled = try frames.withNextFrame { body in
                        handler.respond(frame: body, peer: peer, memo: memo, into: &output)
                    }
                } catch {
                    Log.info("connection closed: oversized frame", [("pid", String(pid))])
                    let why =
                        identified
                        ? "; a request, its secret included, must fit in maxFrameBytes (keychaind.json)"
                        : "; a program that is not a registered app may send only small requests"
                    Response(id: 0, error: KeychainError(error.status, error.message + why)).appendFrame(to: &output)
                    close = true
                    break
                }
                guard let closeAfter = handled else { break }
                // Answers to a long pipeline go out as they pile up, so one client cannot make the
                // daemon buffer a gigabyte of responses to a single read.
                if output.count >= Self.flushBytes {
                    let ok = Self.write(&output, to: socket, answers: answers)
                    if !ok { return }
                }
                if closeAfter {
                    Log.info("connection closed: malformed request", [("pid", String(pid))])
                    close = true
                }
            }
            // What is left is a partial frame: it counts against the daemon-wide budget.
            if !close {
                let pending = frames.pendingCount
                if budget.adjust(by: pending - held) {
                    held = pending
                } else {
                    Log.warning(
                        "connection closed: buffer budget exhausted",
                        [("pid", String(pid)), ("limit", String(budget.limit))])
                    Response(
                        id: 0,
                        error: KeychainError(
                            .allocate,
                            "keychaind is holding too many partial requests (\(budget.limit) bytes in all); try again")
                    ).appendFrame(to: &output)
                    close = true
                }
            }
            if close {
                // Nothing more of this peer is kept: its share goes back before it hears why.
                _ = budget.adjust(by: -held)
                held = 0
            }
            if !output.isEmpty {
                let ok = Self.write(&output, to: socket, answers: answers)
                if !ok { return }
            }
            if close {
                socket.drainForClose()
                return
            }
        }
    }

    /// Writes `output` and empties it; what answers held of the budget goes back. A buffer grown
    /// past its free bytes (`AnswerLedger.freeOutputBytes`) by large answers is freed rather than
    /// kept for the connection's life (and, mapped for itself, goes back to the system).
    /// (Inlined into `run`, the freeing of a large buffer kept out of it: a cached copy's path.)
    @inline(__always)
    private static func write(_ output: inout SecretBytes, to socket: UnixSocket, answers: AnswerLedger) -> Bool {
        let ok = (try? socket.writeAll(output)) != nil
        if output.capacity <= AnswerLedger.freeOutputBytes {
            output.removeAll(keepingCapacity: true)
        } else {
            freeLarge(&output)
        }
        answers.release()
        return ok
    }

    @inline(never)
    private static func freeLarge(_ output: inout SecretBytes) {
        HeapMemory.freed(output.capacity)
        output = SecretBytes(capacity: 4 * 1024)
    }

}
