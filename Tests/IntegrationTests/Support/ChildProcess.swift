import Foundation

/// What a program run to completion by the tests printed, and how it ended.
typealias ProgramResult = (status: Int32, stdout: String, stderr: String)

/// Runs `executable` with `arguments` to completion, feeding it `stdin` (then end of file) and
/// collecting both of its outputs. Standard error is drained on a thread of its own, so a program
/// that fills one pipe while the other is being read cannot stall the test.
func runToCompletion(
    _ executable: String, _ arguments: [String], environment: [String: String],
    currentDirectory: String? = nil, stdin: String? = nil
) throws -> ProgramResult {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    p.environment = environment
    if let currentDirectory { p.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
    let out = Pipe()
    let err = Pipe()
    let input = Pipe()
    p.standardOutput = out
    p.standardError = err
    p.standardInput = input
    try p.run()
    let errors = ErrorOutput()
    let drained = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
        errors.data = err.fileHandleForReading.readDataToEndOfFile()
        drained.signal()
    }
    if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
    try? input.fileHandleForWriting.close()
    let o = out.fileHandleForReading.readDataToEndOfFile()
    drained.wait()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: errors.data, as: UTF8.self))
}

/// Standard error as read by the draining thread; read by the caller only after the semaphore.
private final class ErrorOutput: @unchecked Sendable {
    var data = Data()
}
