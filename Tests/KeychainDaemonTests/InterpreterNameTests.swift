import Testing

@testable import KeychainDaemon

/// `status` warns about registrations whose executable is an interpreter, judged by the name of
/// the file the path resolves to, with or without a version after it.
@Suite("Interpreter names")
struct InterpreterNameTests {
    @Test func interpretersWithAndWithoutVersionsAreRecognised() {
        for name in [
            "python3", "python3.11", "python", "perl", "perl5.36.0", "ruby3.1", "node", "bash", "sh", "dash",
            "zsh", "java", "php8.2", "lua5.4", "tclsh8.6", "pypy3", "busybox", "Rscript",
        ] {
            #expect(Isolation.isInterpreter(name), "\(name)")
        }
    }

    @Test func otherProgramsAreNot() {
        for name in [
            "app1", "keychainctl", "device-id-example", "python-app", "shell-tool", "nodeapp", "3", "", "sha256sum",
        ] {
            #expect(!Isolation.isInterpreter(name), "\(name)")
        }
    }

    @Test func aSymbolicLinkIsJudgedByWhatItResolvesTo() {
        // /bin/sh is a link to dash on Debian; either way its target is an interpreter.
        #expect(!Isolation.interpreters(in: ["/bin/sh"]).isEmpty)
        #expect(Isolation.interpreters(in: ["/usr/bin/true"]).isEmpty)
    }
}
