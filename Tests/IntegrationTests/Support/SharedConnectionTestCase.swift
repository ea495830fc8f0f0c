import KeychainClient
import XCTest

/// A test case with a daemon of its own for each test, which the process's shared connection (what
/// `SecItem…`, `Keychain` and `DeviceIdentifier` use) is pointed at, and pointed away from after.
class SharedConnectionTestCase: XCTestCase {
    var daemon: DaemonHarness!

    override func setUpWithError() throws {
        daemon = try DaemonHarness()
        KeychainConnection.shared.retarget(socketPath: daemon.socketPath)
    }

    override func tearDown() {
        KeychainConnection.shared.retarget(socketPath: nil)
        daemon = nil
    }
}
