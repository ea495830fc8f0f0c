import KeychainClient
import KeychainCore
import KeychainSystem

// keychainctl: the administrator's CLI for keychaind (man/keychainctl.1.scd).
// Exit status: 0, or the low byte of the OSStatus (44 not found, 45 duplicate, 206 errSecParam, …).

/// The exit status for a failure: the OSStatus's low byte, never 0.
func exitStatus(_ status: Status) -> Int32 {
    let low = Int32(UInt8(truncatingIfNeeded: status.rawValue))
    return low == 0 ? 1 : low
}

func main() -> Int32 {
    DescriptorPassphrases.protectIfGiven(CommandLine.arguments.dropFirst())
    var json = CommandLine.arguments.contains("--json")
    if CommandLine.arguments.count <= 1 {
        IO.writeAll(1, Array(toolHelp.utf8))
        return 0
    }
    do throws(KeychainError) {
        let inv = try Invocation.parse(Array(CommandLine.arguments.dropFirst()))
        DescriptorPassphrases.expect([inv.value(.passphraseFD), inv.value(.newPassphraseFD)].count { $0 != nil })
        json = inv.json
        if inv.help || inv.verb == nil {
            IO.writeAll(1, Array((inv.verb?.helpText ?? toolHelp).utf8))
            return 0
        }
        var command = Command(inv)
        try command.run()
        command.out.flush()
        return 0
    } catch {
        IO.stderrLine("keychainctl: \(error.status.name) (\(error.status.rawValue)): \(error.message)")
        if json {
            IO.writeAll(
                1,
                Array(
                    ("{\"error\":\(JSON.string(error.status.name)),\"status\":\(error.status.rawValue),\"message\":\(JSON.string(error.message))}\n")
                        .utf8))
        }
        return exitStatus(error.status)
    }
}

CurrentProcess.exit(main())
