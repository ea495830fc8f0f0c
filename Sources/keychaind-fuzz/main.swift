// keychaind-fuzz: libFuzzer target for CBOR decoding and request validation down to the store.
//
// Fuzzing build (see docs/reliability.md):
//   swift build -c release --product keychaind-fuzz --build-path .build-fuzz \
//     -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING
//   SWIFT_BACKTRACE=enable=no .build-fuzz/release/keychaind-fuzz Tests/FuzzCorpus -max_total_time=60
// Plain builds replay the files given as arguments (crash regressions and the seed corpus).
#if canImport(Glibc)
import Glibc
#endif
import CSupport

FuzzHarness.setUp()
#if FUZZING
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzOne(data, size) })
#else
var replayed = 0
for path in CommandLine.arguments.dropFirst() {
    var paths = [path]
    if let dir = opendir(path) {
        paths = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if !name.hasPrefix(".") { paths.append(path + "/" + name) }
        }
        closedir(dir)
    }
    for file in paths.sorted() {
        guard let f = fopen(file, "rb") else { continue }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&buffer, 1, buffer.count, f)
            if n <= 0 { break }
            bytes += buffer[0..<n]
        }
        fclose(f)
        _ = bytes.withUnsafeBufferPointer { fuzzOne($0.baseAddress, $0.count) }
        replayed += 1
    }
}
print("keychaind-fuzz: replayed \(replayed) inputs without a crash")
#endif
