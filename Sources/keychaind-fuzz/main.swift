import KeychainSystem

// keychaind-fuzz: libFuzzer target for CBOR decoding and request validation down to the store.
//
// Fuzzing build (see docs/reliability.md):
//   swift build -c release --product keychaind-fuzz --build-path .build-fuzz \
//     -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING
//   SWIFT_BACKTRACE=enable=no .build-fuzz/release/keychaind-fuzz Tests/FuzzCorpus -max_total_time=60
// Plain builds replay the files given as arguments (crash regressions and the seed corpus).
#if FUZZING
    import CSupport
#endif

FuzzHarness.setUp()
#if FUZZING
    var argc = CommandLine.argc
    var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
    CurrentProcess.exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOne(data, size) })
#else
    var replayed = 0
    for path in CommandLine.arguments.dropFirst() {
        var paths = [path]
        if let names = FileSystem.contentsOfDirectory(path) {
            paths = names.filter { !$0.hasPrefix(".") }.map { path + "/" + $0 }
        }
        for file in paths.sorted() {
            guard let bytes = FileSystem.contents(of: file) else { continue }
            _ = bytes.withUnsafeBufferPointer { fuzzOne($0.baseAddress, $0.count) }
            replayed += 1
        }
    }
    print("keychaind-fuzz: replayed \(replayed) inputs without a crash")
#endif
