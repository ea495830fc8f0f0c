import Glibc
import KeychainCore
import Testing

@testable import KeychainCrypto

/// Guarded memory runs out long before memory does (each region maps pages of its own, and the kernel
/// allows a process about 65 000 mappings): running out must be an error the caller can answer with,
/// never the end of the daemon.
@Suite struct SecureBytesTests {
    /// Whether this process runs under a sanitizer. Their runtimes allocate memory of their own in
    /// the child, which has no address space left: ThreadSanitizer retries for ever (CI run 61 hung),
    /// AddressSanitizer's internal allocator gives up and exits (busy CI run 64, not the quiet ones).
    static let underSanitizer = ["__tsan_init", "__asan_init"].contains { (symbol: String) in
        dlsym(UnsafeMutableRawPointer(bitPattern: 0), symbol) != nil
    }

    @Test(
        .disabled(
            if: underSanitizer,
            "a sanitizer's runtime cannot work in a child without address space; the plain suite runs it"))
    func runningOutOfGuardedMemoryIsErrSecAllocateNotACrash() throws {
        Sodium.ensureInitialized()
        _ = SecureBytes.exhausted  // made before the limit: the child must not need the heap for it
        let key = [UInt8](repeating: 7, count: AEAD.keyBytes)
        let pid = fork()
        if pid == 0 {
            // The child: no test framework here; the exit status says what happened. With its address
            // space limited below what it already uses, every new mapping fails, as when the kernel's
            // map count is used up.
            let resource = __rlimit_resource_t(RLIMIT_AS.rawValue)
            var limit = rlimit()
            guard getrlimit(resource, &limit) == 0 else { _exit(10) }
            limit.rlim_cur = 0
            guard setrlimit(resource, &limit) == 0 else { _exit(10) }
            do {
                _ = try SecureBytes(random: 32)
                _exit(11)  // allocated after all: the test proves nothing
            } catch {
                guard error.status == .allocate else { _exit(12) }
            }
            let prepared = key.withUnsafeBytes { PreparedGCMKey(key: $0) }
            _exit(prepared == nil ? 0 : 13)
        }
        try #require(pid > 0, "fork failed")
        // The child makes one allocation and exits; one that has not after a minute is stuck, and
        // fails the test rather than hanging the suite.
        var status: Int32 = 0
        let deadline = ContinuousClock.now + .seconds(60)
        while waitpid(pid, &status, WNOHANG) == 0 {
            if ContinuousClock.now > deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                Issue.record("the child did not finish within 60 s")
                return
            }
            usleep(10_000)
        }
        let signal = status & 0x7F
        #expect(signal == 0, "the child died of signal \(signal): an allocation failure crashed it")
        let code = (status >> 8) & 0xFF
        #expect(code == 0, "exit \(code): 10 setrlimit, 11 allocated anyway, 12 another status, 13 a prepared key")
    }
}
