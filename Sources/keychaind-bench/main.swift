import KeychainCore
import KeychainCrypto
import KeychainSystem
import KeychainWire

// keychaind-bench: measures a running keychaind side by side with a bare socket-echo floor that uses
// the same framing and message sizes, alternating the two over several rounds and reporting medians.
//
//   keychaind-bench --socket PATH [--rounds 5] [--ops 20000] [--cli PATH] [--daemon-pid PID] [--json]
//                   [--fsync-dir DIR]                (the durable-write floors beside the adds, each round)
//   keychaind-bench --fill N --socket PATH          (adds N items, pipelined, then exits)
//   keychaind-bench --echo-server PATH --reply-bytes N   (internal: the floor)
//   keychaind-bench --fsync-floor DIR [--ops N]     (the durable-write floor: append 200 B + fdatasync)
//   keychaind-bench --rotation 1000,100000 [--rounds 5] [--profile moderate] [--json]
//                                                   (passphrase-change cost in process: Rotation.swift)
#if canImport(Glibc)
    import Glibc
#endif

func now() -> Double {
    MonotonicClock.now()
}

func die(_ message: String) -> Never {
    var line = Array("keychaind-bench: \(message)\n".utf8)
    line.withUnsafeMutableBytes { _ = write(2, $0.baseAddress, $0.count) }
    exit(2)
}

func percentile(_ sorted: [Double], _ p: Double) -> Double {
    guard !sorted.isEmpty else { return .nan }
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

func median(_ xs: [Double]) -> Double { percentile(xs.sorted(), 0.5) }

func fmt(_ v: Double?) -> String {
    guard let v, v.isFinite else { return "null" }
    let scaled = (v * 100).rounded() / 100
    return "\(scaled)"
}

struct Args {
    var socket = SocketLocation.fromProcessEnvironment()
    var rounds = 5
    var ops = 20_000
    var cli: String?
    var daemonPID: Int32?
    var json = false
    var fill: Int?
    var echoServer: String?
    var replyBytes = 16
    var label = "run"
    var copiesOnly: Int?
    var randomOf: Int?
    var fillFrom = 0
    var rotation: [Int]?
    var profile = KDFProfile.moderate
    var fsyncFloor: String?
    var fsyncDirectory: String?

    init(_ argv: [String]) {
        var i = 0
        func value() -> String {
            i += 1
            guard i < argv.count else { die("\(argv[i - 1]) needs a value") }
            return argv[i]
        }
        while i < argv.count {
            switch argv[i] {
            case "--socket": socket = value()
            case "--rounds": rounds = Int(value()) ?? rounds
            case "--ops": ops = Int(value()) ?? ops
            case "--cli": cli = value()
            case "--daemon-pid": daemonPID = Int32(value())
            case "--json": json = true
            case "--fill": fill = Int(value())
            case "--echo-server": echoServer = value()
            case "--reply-bytes": replyBytes = Int(value()) ?? replyBytes
            case "--label": label = value()
            case "--copies-only": copiesOnly = Int(value())
            case "--random-of": randomOf = Int(value())
            case "--fill-from": fillFrom = Int(value()) ?? 0
            case "--fsync-floor": fsyncFloor = value()
            case "--fsync-dir": fsyncDirectory = value()
            case "--rotation":
                let sizes = value().split(separator: ",").compactMap { Int($0) }
                guard !sizes.isEmpty, sizes.allSatisfy({ $0 >= 0 }) else {
                    die("--rotation needs item counts, e.g. 1000,100000")
                }
                rotation = sizes
            case "--profile":
                guard let p = KDFProfile(rawValue: value()) else { die("--profile is moderate or interactive") }
                profile = p
            case "-h", "--help":
                print(
                    """
                    keychaind-bench — keychaind beside a bare socket-echo floor (same framing, same sizes)
                      --socket PATH       the daemon's socket (default: as clients resolve it)
                      --rounds N          alternating daemon/echo rounds (default 5); medians are reported
                      --ops N             round trips per round (default 20000)
                      --cli PATH          keychainctl to time `find -w` per process (50 runs)
                      --daemon-pid PID    read the daemon's RSS from /proc
                      --fill N            add N items (service bench.fill) pipelined, then exit
                      --fill-from K       with --fill: number the new items from K (to grow a filled store)
                      --copies-only N     N copies on one connection and nothing else (for profilers)
                      --random-of N       only copy latency, each copy a random one of N filled items (cold lookups)
                      --json              one JSON object instead of the table
                      --rotation N,M,…    no daemon: time passphrase changes on in-process keychains of N, M, …
                                          items (release build; Argon2id timed separately); --rounds changes each
                      --profile P         with --rotation: Argon2id costs, moderate (default) or interactive
                      --fsync-dir DIR     also measure the durable-write floors in DIR (on the daemon's disk) in
                                          every round, between the adds, on the same vCPUs: fsync_floor_ops_s
                                          (200 B appends + fdatasync) and fsync_overwrite_floor_ops_s (one 4 KiB
                                          block rewritten + fdatasync), and the adds' shares of both
                      --fsync-floor DIR   no daemon: appends of 200 bytes each followed by fdatasync, in a file in
                                          DIR (--ops of them, default 2000): the floor of a durable add
                    """)
                exit(0)
            default: die("unknown argument \(argv[i])")
            }
            i += 1
        }
    }
}

// MARK: The floor: an echo server with the same framing and reply size.

enum EchoServer {
    static func run(path: String, replyBytes: Int) -> Never {
        FileSystem.removeIfPresent(path)
        let listener: Socket
        do {
            listener = try Socket.stream()
            try listener.bind(to: try UnixSocket.address(path))
            try listener.listen(backlog: 128)
        } catch { die("echo server: \(error)") }
        var header = [UInt8](repeating: 0, count: 4)
        let n = UInt32(max(replyBytes - 4, 1))
        header = [
            UInt8(n >> 24), UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8),
            UInt8(truncatingIfNeeded: n),
        ]
        let reply = header + [UInt8](repeating: 0xA0, count: Int(n))
        while true {
            guard let c = try? listener.accept() else { continue }
            let conn = UnixSocket(adopting: c)
            let started: ()? = try? Threads.start {
                var frames = FrameBuffer(maxBytes: 1 << 20)
                while (try? conn.readFrame(&frames)) != nil {
                    if (try? conn.writeAll(reply)) == nil { break }
                }
                conn.close()
            }
            if started == nil { die("cannot start an echo thread") }
        }
    }
}

/// A closure handed to a pthread (no Foundation in this tool): see `join`.
final class ThreadBox: Sendable {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

func join(_ bodies: [@Sendable () -> Void]) {
    var tids: [pthread_t] = []
    for b in bodies {
        var tid = pthread_t()
        let box = ThreadBox(b)
        let ctx = Unmanaged.passRetained(box).toOpaque()
        pthread_create(
            &tid, nil,
            { raw in
                let box = Unmanaged<ThreadBox>.fromOpaque(raw!).takeRetainedValue()
                box.body()
                return nil
            }, ctx)
        tids.append(tid)
    }
    for t in tids { pthread_join(t, nil) }
}

// MARK: Measurements

struct Client {
    let socket: UnixSocket
    var frames = FrameBuffer(maxBytes: 64 << 20)
    init(_ path: String) {
        do { socket = try UnixSocket.connect(to: path) } catch { die("\(error)") }
    }
    mutating func roundTrip(_ frame: [UInt8]) -> Response? {
        do {
            try socket.writeAll(frame)
            guard let body = try socket.readFrame(&frames) else { return nil }
            return try Response(CBOR.decode(body))
        } catch { return nil }
    }
    /// Round trip without decoding (both the daemon and the echo are timed the same way).
    mutating func rawRoundTrip(_ frame: [UInt8]) -> Int {
        do {
            try socket.writeAll(frame)
            return try socket.readFrame(&frames)?.count ?? -1
        } catch { return -1 }
    }
}

func request(_ id: Int64, _ op: String, _ query: [String: Value]) -> [UInt8] {
    Frame.encode(Request(id: id, op: op, query: query).value)
}

let copyQuery: [String: Value] = [
    "class": .text("genp"), "svce": .text("bench.copy"), "acct": .text("alice"), "r_Data": .bool(true),
]

/// Latencies (seconds) of `ops` round trips of `frame` on one warm connection.
func latencies(path: String, frame: [UInt8], ops: Int) -> [Double] {
    var c = Client(path)
    for _ in 0..<min(1000, ops) { _ = c.rawRoundTrip(frame) }
    var out = [Double](repeating: 0, count: ops)
    for i in 0..<ops {
        let t0 = now()
        guard c.rawRoundTrip(frame) > 0 else { die("connection to \(path) failed") }
        out[i] = now() - t0
    }
    return out.sorted()
}

/// Aggregate round trips per second with `clients` threads, each on its own connection.
func throughput(path: String, clients: Int, opsPerClient: Int, frame: @escaping @Sendable (Int, Int) -> [UInt8])
    -> Double
{
    let t0 = now()
    join(
        (0..<clients).map { k in
            { @Sendable in
                var c = Client(path)
                for i in 0..<opsPerClient { guard c.rawRoundTrip(frame(k, i)) > 0 else { die("connection failed") } }
            }
        })
    return Double(clients * opsPerClient) / (now() - t0)
}

func rssMiB(_ pid: Int32) -> Double? {
    guard let f = fopen("/proc/\(pid)/status", "r") else { return nil }
    defer { fclose(f) }
    var line = [UInt8](repeating: 0, count: 256)
    while line.withUnsafeMutableBufferPointer({ p in
        p.withMemoryRebound(to: CChar.self) { fgets($0.baseAddress, 256, f) }
    }) != nil {
        let s = String(decoding: line.prefix { $0 != 0 }, as: UTF8.self)
        if s.hasPrefix("VmRSS:") {
            let kb = s.split(separator: " ").compactMap { Double($0) }.first ?? 0
            return kb / 1024
        }
    }
    return nil
}

func spawnWait(_ argv: [String], env: [String]) -> Int32 {
    var pid = pid_t()
    var cargs = argv.map { strdup($0) } + [nil]
    var cenv = env.map { strdup($0) } + [nil]
    defer {
        for p in cargs { free(p) }
        for p in cenv { free(p) }
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    defer { posix_spawn_file_actions_destroy(&actions) }
    guard posix_spawn(&pid, argv[0], &actions, nil, &cargs, &cenv) == 0 else { return -1 }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    return status
}

// MARK: Main

let args = Args(Array(CommandLine.arguments.dropFirst()))
signal(SIGPIPE, SIG_IGN)

if let path = args.echoServer { EchoServer.run(path: path, replyBytes: args.replyBytes) }
if let directory = args.fsyncFloor { runFsyncFloor(directory: directory, count: args.ops == 20_000 ? 2000 : args.ops) }

/// The durable-write floor: what one fdatasync'ed append of a small record costs on this disk, the
/// least a durable add can cost. Prints `{"fsync_floor_ops_s": …, "fsync_floor_us_p50": …}` and exits.
func runFsyncFloor(directory: String, count: Int) -> Never {
    let (opsPerSecond, p50) = DurableFloor.measure(directory: directory, count: count, overwrite: false)
    print("{\"fsync_floor_ops_s\": \(fmt(opsPerSecond)), \"fsync_floor_us_p50\": \(fmt(p50 * 1e6))}")
    exit(0)
}

/// Durable writes with nothing else around them, on the disk of `directory`: the floors durable adds
/// are compared with, measured in the same process, so on the same vCPUs as the adds beside them.
enum DurableFloor {
    /// `count` writes of one small record, each followed by fdatasync: appends of 200 bytes (the file
    /// grows, so each fdatasync also commits the file's new size), or with `overwrite` the same 4 KiB
    /// block of an already written file rewritten in place (what a reused write-ahead log does; the
    /// cheaper of the two on ext4). Returns writes per second and the median time of one.
    static func measure(directory: String, count: Int, overwrite: Bool) -> (opsPerSecond: Double, p50: Double) {
        let path = directory + "/fsync-floor-\(CurrentProcess.pid)"
        let file: FileDescriptor
        do { file = try FileDescriptor.open(path, [.writeOnly, .create, .truncate], permissions: 0o600) } catch {
            die("fsync floor: \(error)")
        }
        defer {
            file.close()
            FileSystem.removeIfPresent(path)
        }
        let record = [UInt8](repeating: 0x5A, count: overwrite ? 4096 : 200)
        do throws(Errno) {
            if overwrite {
                try file.writeAll(record)
                try file.sync()
            }
        } catch { die("fsync floor: \(error)") }
        var times: [Double] = []
        times.reserveCapacity(count)
        let start = now()
        for _ in 0..<max(count, 1) {
            let t0 = now()
            do throws(Errno) {
                if overwrite { try file.writeAll(record, at: 0) } else { try file.writeAll(record) }
                try file.syncData()
            } catch { die("fsync floor: \(error)") }
            times.append(now() - t0)
        }
        let elapsed = now() - start
        return (Double(times.count) / elapsed, median(times))
    }
}
if let sizes = args.rotation {
    runRotationBench(sizes: sizes, rounds: args.rounds, profile: args.profile, json: args.json)
}

if let n = args.fill {
    // Eight pipelining connections, so concurrent adds share commits (group commit).
    let socketPath = args.socket
    let from = args.fillFrom
    let t0 = now()
    let writers = 8
    join(
        (0..<writers).map { w in
            { @Sendable in
                let c = Client(socketPath)
                var frames = FrameBuffer(maxBytes: 64 << 20)
                var i = w
                while i < n {
                    var out: [UInt8] = []
                    var sent = 0
                    while i < n && sent < 200 {
                        out += request(
                            Int64(i), "add",
                            [
                                "class": .text("genp"), "svce": .text("bench.fill"),
                                "acct": .text("user\(from + i)"), "v_Data": .bytes(Array(repeating: 7, count: 32)),
                            ])
                        i += writers
                        sent += 1
                    }
                    do { try c.socket.writeAll(out) } catch { die("\(error)") }
                    for _ in 0..<sent {
                        guard let body = try? c.socket.readFrame(&frames), let r = try? Response(CBOR.decode(body))
                        else { die("fill failed") }
                        if r.status != .success && r.status != .duplicateItem {
                            die("fill: \(r.status) \(r.message ?? "")")
                        }
                    }
                }
            }
        })
    let seconds = now() - t0
    print("filled \(n) items in \(Int(seconds)) s (\(Int(Double(n) / seconds)) adds/s)")
    print("{\"fill_adds_s\": \(fmt(Double(n) / seconds))}")
    exit(0)
}

// One real item to copy; the echo replies with the same number of bytes as the daemon's answer.
var setup = Client(args.socket)
_ = setup.roundTrip(
    request(
        1, "add",
        [
            "class": .text("genp"), "svce": .text("bench.copy"), "acct": .text("alice"),
            "v_Data": .bytes(Array("correct horse battery staple".utf8)),
        ]))
let copyFrame = request(2, "copy", copyQuery)
guard let first = setup.roundTrip(copyFrame), first.status == .success else { die("copy of the bench item failed") }
let replyBytes = Frame.encode(first.value).count
if let n = args.randomOf {
    // Cold lookups: every copy names a random item of the filled set, so caches rarely help.
    var rng = SystemRandomNumberGenerator()
    let frames = (0..<args.ops).map { i in
        request(
            Int64(i), "copy",
            [
                "class": .text("genp"), "svce": .text("bench.fill"),
                "acct": .text("user\(Int.random(in: 0..<n, using: &rng))"), "r_Data": .bool(true),
            ])
    }
    var p50s: [Double] = []
    for _ in 0..<args.rounds {
        var c = Client(args.socket)
        var lat: [Double] = []
        lat.reserveCapacity(frames.count)
        for f in frames {
            let t0 = now()
            guard c.rawRoundTrip(f) > 0 else { die("copy failed") }
            lat.append(now() - t0)
        }
        p50s.append(percentile(lat.sorted(), 0.5))
    }
    let rss = args.daemonPID.flatMap(rssMiB)
    print(
        "{\"label\": \"\(args.label)\", \"random_copy_p50_us\": \(fmt(median(p50s) * 1e6)), \"rss_mib\": \(fmt(rss))}")
    exit(0)
}
if let n = args.copiesOnly {
    for _ in 0..<n { _ = setup.rawRoundTrip(copyFrame) }
    exit(0)
}

let echoPath = "/tmp/keychaind-bench-echo-\(getpid()).sock"
let echoPID: pid_t = {
    var pid = pid_t()
    let argv = [CommandLine.arguments[0], "--echo-server", echoPath, "--reply-bytes", String(replyBytes)]
    var cargs = argv.map { strdup($0) } + [nil]
    defer { for p in cargs { free(p) } }
    guard posix_spawn(&pid, "/proc/self/exe", nil, nil, &cargs, environ) == 0 else {
        die("cannot start the echo server")
    }
    return pid
}()
defer {
    kill(echoPID, SIGTERM)
    unlink(echoPath)
}
for _ in 0..<200 where (try? UnixSocket.connect(to: echoPath)) == nil { usleep(10_000) }

var echoP50: [Double] = []
var echoP99: [Double] = []
var copyP50: [Double] = []
var copyP99: [Double] = []
var echoOps8: [Double] = []
var copyOps8: [Double] = []
var addOps1: [Double] = []
var addOps8: [Double] = []
var appendFloor: [Double] = []
var overwriteFloor: [Double] = []
let addOps = max(200, args.ops / 40)
let socketPath = args.socket
for round in 0..<args.rounds {
    let e = latencies(path: echoPath, frame: copyFrame, ops: args.ops)
    let d = latencies(path: socketPath, frame: copyFrame, ops: args.ops)
    echoP50.append(percentile(e, 0.5))
    echoP99.append(percentile(e, 0.99))
    copyP50.append(percentile(d, 0.5))
    copyP99.append(percentile(d, 0.99))
    echoOps8.append(throughput(path: echoPath, clients: 8, opsPerClient: args.ops / 8) { _, _ in copyFrame })
    copyOps8.append(throughput(path: socketPath, clients: 8, opsPerClient: args.ops / 8) { _, _ in copyFrame })
    let tag = "r\(round)-\(getpid())"
    addOps1.append(
        throughput(path: socketPath, clients: 1, opsPerClient: addOps) { k, i in
            request(
                Int64(i), "add",
                [
                    "class": .text("genp"), "svce": .text("bench.add"), "acct": .text("\(tag)-1-\(k)-\(i)"),
                    "v_Data": .bytes([1, 2, 3]),
                ])
        })
    addOps8.append(
        throughput(path: socketPath, clients: 8, opsPerClient: addOps / 8) { k, i in
            request(
                Int64(i), "add",
                [
                    "class": .text("genp"), "svce": .text("bench.add"), "acct": .text("\(tag)-8-\(k)-\(i)"),
                    "v_Data": .bytes([1, 2, 3]),
                ])
        })
    if let directory = args.fsyncDirectory {
        // The floors between the adds of the same round, in this process: on the vCPUs the adds use
        // (which vCPU takes the disk's completion interrupt matters on a VM: about 1.5× here).
        appendFloor.append(DurableFloor.measure(directory: directory, count: addOps, overwrite: false).opsPerSecond)
        overwriteFloor.append(DurableFloor.measure(directory: directory, count: addOps, overwrite: true).opsPerSecond)
    }
}

var cliP50: Double?
if let cli = args.cli {
    var times: [Double] = []
    let env = ["KEYCHAIND_SOCKET=\(socketPath)", "PATH=/usr/bin:/bin", "SWIFT_BACKTRACE=enable=no"]
    for _ in 0..<50 {
        let t0 = now()
        let st = spawnWait([cli, "find", "-s", "bench.copy", "-a", "alice", "-w"], env: env)
        if st != 0 { die("\(cli) find failed with status \(st)") }
        times.append(now() - t0)
    }
    cliP50 = median(times) * 1000
}
let rss = args.daemonPID.flatMap(rssMiB)

let r: [(String, Double?)] = [
    ("echo_p50_us", median(echoP50) * 1e6), ("echo_p99_us", median(echoP99) * 1e6),
    ("copy_p50_us", median(copyP50) * 1e6), ("copy_p99_us", median(copyP99) * 1e6),
    ("echo_ops_s_8", median(echoOps8)), ("copy_ops_s_8", median(copyOps8)),
    ("add_ops_s_1", median(addOps1)), ("add_ops_s_8", median(addOps8)),
    ("cli_find_ms_p50", cliP50), ("rss_mib", rss),
    ("copy_p50_ratio_to_echo", median(copyP50) / median(echoP50)),
    ("copy_ops_8_share_of_echo", median(copyOps8) / median(echoOps8)),
]
/// Median over rounds of a per-round ratio (each round's adds against the floor measured beside them).
func shares(_ adds: [Double], _ floor: [Double]) -> Double? {
    floor.isEmpty ? nil : median(zip(adds, floor).map { $0 / $1 })
}
let floors: [(String, Double?)] =
    args.fsyncDirectory == nil
    ? []
    : [
        ("fsync_floor_ops_s", median(appendFloor)), ("fsync_overwrite_floor_ops_s", median(overwriteFloor)),
        ("add_ops_1_share_of_fsync_floor", shares(addOps1, appendFloor)),
        ("add_ops_8_share_of_fsync_floor", shares(addOps8, appendFloor)),
        ("add_ops_1_share_of_fsync_overwrite_floor", shares(addOps1, overwriteFloor)),
        ("add_ops_8_share_of_fsync_overwrite_floor", shares(addOps8, overwriteFloor)),
    ]
if args.json {
    print(
        "{\"label\": \"\(args.label)\", \"rounds\": \(args.rounds), \"ops\": \(args.ops), "
            + (r + floors).map { "\"\($0.0)\": \(fmt($0.1))" }.joined(separator: ", ") + "}")
} else {
    print(
        "keychaind-bench (\(args.label)): \(args.rounds) rounds × \(args.ops) round trips, medians of per-round figures"
    )
    for (k, v) in r + floors { print(k.padding(28) + fmt(v)) }
}

extension String {
    func padding(_ n: Int) -> String { count >= n ? self + " " : self + String(repeating: " ", count: n - count) }
}
