#if canImport(Glibc)
import Glibc
#endif
import KeychainCore
import KeychainWire

/// One client connection, served on its own thread with blocking I/O.
///
/// Reads whatever has arrived, answers every complete frame in order, and writes the answers in one
/// go (pipelined requests cost one write). A client that sends half a frame, nothing, or stops
/// reading holds only this thread; the idle and send timeouts end it.
final class Connection: @unchecked Sendable {
    let socket: UnixSocket
    let peer: PeerIdentity
    let handler: RequestHandler
    let maxFrameBytes: Int

    init(socket: UnixSocket, peer: PeerIdentity, handler: RequestHandler, maxFrameBytes: Int) {
        self.socket = socket
        self.peer = peer
        self.handler = handler
        self.maxFrameBytes = maxFrameBytes
    }

    static let flushBytes = 256 * 1024

    static func setTimeouts(fd: Int32, idleSeconds: Int, sendSeconds: Int) {
        var idle = timeval(tv_sec: idleSeconds, tv_usec: 0)
        var send = timeval(tv_sec: sendSeconds, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Serves until the peer closes, misbehaves, idles out, or the daemon stops reading (SHUT_RD).
    /// The caller closes the socket afterwards.
    func run() {
        var frames = FrameBuffer(maxBytes: maxFrameBytes)
        var input = [UInt8](repeating: 0, count: 64 * 1024)
        var output: [UInt8] = []
        output.reserveCapacity(4096)
        defer { zero(&input) }
        while true {
            let n = input.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, $0.count, 0) }
            if n == 0 {
                if frames.pendingCount > 0 {
                    Log.info("connection closed: truncated frame", [("pid", String(peer.pid))])
                    let r = Response(id: 0, error: .param("connection closed in the middle of a frame (\(frames.pendingCount) bytes pending)"))
                    try? socket.writeAll(r.frame())
                }
                return
            }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK {
                    Log.debug("connection idle timeout", [("pid", String(peer.pid))])
                }
                return
            }
            input.withUnsafeBytes { frames.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            var close = false
            while !close {
                let body: [UInt8]?
                do { body = try frames.next() } catch {
                    Log.info("connection closed: oversized frame", [("pid", String(peer.pid))])
                    output.append(contentsOf: Response(id: 0, error: error).frame())
                    close = true
                    break
                }
                guard var body else { break }
                let outcome = handler.handle(frame: body, peer: peer)
                zero(&body)
                output.append(contentsOf: outcome.response.frame())
                // Answers to a long pipeline go out as they pile up, so one client cannot make the
                // daemon buffer a gigabyte of responses to a single read.
                if output.count >= Self.flushBytes {
                    let ok = (try? socket.writeAll(output)) != nil
                    zero(&output)
                    output.removeAll(keepingCapacity: true)
                    if !ok { return }
                }
                if outcome.closeAfter {
                    Log.info("connection closed: malformed request", [("pid", String(peer.pid))])
                    close = true
                }
            }
            if !output.isEmpty {
                let ok = (try? socket.writeAll(output)) != nil
                zero(&output)
                output.removeAll(keepingCapacity: true)
                if !ok { return }
            }
            if close {
                socket.drainForClose()
                return
            }
        }
    }

    /// Request and response bytes may hold secrets: wipe buffers before they are reused or freed.
    private func zero(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { raw in
            if let base = raw.baseAddress { memset(base, 0, raw.count) }
        }
    }

}
