// device-id-example: prints this device's identifier for an access group.
//
//     device-id-example [ACCESS-GROUP]
//
// Without an argument it uses the app's default (first) access group. The binary must be registered
// with keychaind as an app. Two copies registered as two apps of one vendor that share a group print
// the same UUID, also when started at the same moment:
//
//     install -m 755 device-id-example /usr/local/bin/app1
//     install -m 755 device-id-example /usr/local/bin/app2
//     # ~/.config/keychaind/apps.d/app1.json
//     {"application-identifier": "ABCDE12345.com.example.app1",
//      "keychain-access-groups": ["ABCDE12345.com.example.shared", "ABCDE12345.com.example.app1"],
//      "executables": ["/usr/local/bin/app1"]}
//     # app2.json: the same with app2
//     kill -HUP $(pidof keychaind)            # reload apps.d
//     app1 & app2 & wait                      # the same UUID twice
//     app1 ABCDE12345.com.example.shared      # naming the group: the same UUID again
import Foundation
import KeychainServices

let arguments = CommandLine.arguments.dropFirst()
if arguments.first == "-h" || arguments.first == "--help" {
    print("usage: device-id-example [ACCESS-GROUP]")
    exit(0)
}
do {
    let id = try DeviceIdentifier.current(accessGroup: arguments.first)
    print(id.uuidString)
} catch {
    FileHandle.standardError.write(Data("device-id-example: \(error)\n".utf8))
    let code = Int32(truncatingIfNeeded: UInt8(truncatingIfNeeded: error.osStatus))
    exit(code == 0 ? 1 : code)
}
