// login-example: what a login screen ported from iOS does with the keychain: it saves the password
// the user typed for a web site as an internet password, and fills the form from it next time.
//
//     login-example save URL USER [--group GROUP] [--label LABEL]   (the password on standard input)
//     login-example load URL USER [--group GROUP]                   (prints the password)
//
// URL gives the server, the port and the protocol (https://mail.example.com:8443). The code below is
// iOS code: it imports Security only and calls SecItem as an app does on Apple platforms. The binary
// must be registered with keychaind as an app (README, "Registering applications"); with GROUP
// `secret-service`, the item is also what libsecret apps find under the NetworkPassword schema:
//
//     printf s3cret | login-example save https://mail.example.com alice --group secret-service
//     keychainctl find-internet-password --group secret-service -s mail.example.com -a alice -w
//     secret-tool search xdg:schema org.gnome.keyring.NetworkPassword server mail.example.com
import Foundation
import Security

/// The site a login form belongs to, as an iOS keychain wrapper keys it.
struct LoginSite {
    let server: String
    let port: Int?
    let protocolType: CFString
    let accessGroup: String?

    init?(url: String, accessGroup: String?) {
        guard let url = URL(string: url), let host = url.host else { return nil }
        switch url.scheme {
        case "https": protocolType = kSecAttrProtocolHTTPS
        case "http": protocolType = kSecAttrProtocolHTTP
        case "ftp": protocolType = kSecAttrProtocolFTP
        case "imaps": protocolType = kSecAttrProtocolIMAPS
        default: return nil
        }
        server = host
        port = url.port
        self.accessGroup = accessGroup
    }

    /// The query naming the user's password on this site.
    func query(user: String) -> [String: Any] {
        var query: [String: Any] = [
            kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: server,
            kSecAttrProtocol as String: protocolType,
            kSecAttrAuthenticationType as String: kSecAttrAuthenticationTypeHTMLForm,
            kSecAttrAccount as String: user,
        ]
        if let port { query[kSecAttrPort as String] = port }
        if let accessGroup { query[kSecAttrAccessGroup as String] = accessGroup }
        return query
    }

    /// Saves the password: adds the item, or changes its password when the user had one saved.
    func save(user: String, password: String, label: String) -> OSStatus {
        var add = query(user: user)
        add[kSecValueData as String] = Data(password.utf8)
        add[kSecAttrLabel as String] = label
        add[kSecAttrAccessible as String] = kSecAttrAccessibleWhenUnlocked
        let status = SecItemAdd(add as CFDictionary, nil)
        guard status == errSecDuplicateItem else { return status }
        let change: [String: Any] = [kSecValueData as String: Data(password.utf8)]
        return SecItemUpdate(query(user: user) as CFDictionary, change as CFDictionary)
    }

    /// The saved password, or the status saying why there is none.
    func load(user: String) -> Result<String, OSStatusError> {
        var query = query(user: user)
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        query[kSecReturnData as String] = kCFBooleanTrue
        query[kSecReturnAttributes as String] = kCFBooleanTrue
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        guard status == errSecSuccess else { return .failure(OSStatusError(status: status)) }
        guard let item = result as? [String: Any], let data = item[kSecValueData as String] as? Data,
            let password = String(data: data, encoding: .utf8)
        else { return .failure(OSStatusError(status: errSecDecode)) }
        return .success(password)
    }
}

struct OSStatusError: Error {
    let status: OSStatus
    var message: String { (SecCopyErrorMessageString(status, nil) as String?) ?? "OSStatus \(status)" }
}

func fail(_ message: String, status: OSStatus = errSecParam) -> Never {
    FileHandle.standardError.write(Data("login-example: \(message)\n".utf8))
    let code = Int32(UInt8(truncatingIfNeeded: status))  // errSecItemNotFound (-25300) exits 44, as keychainctl
    exit(code == 0 ? 1 : code)
}

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.isEmpty || arguments.first == "-h" || arguments.first == "--help" {
    print("usage: login-example save|load URL USER [--group GROUP] [--label LABEL]  (save reads the password on stdin)")
    exit(arguments.isEmpty ? 2 : 0)
}
var options: [String: String] = [:]
while let flag = arguments.firstIndex(where: { $0.hasPrefix("--") }) {
    guard flag + 1 < arguments.count else { fail("\(arguments[flag]) needs a value") }
    options[String(arguments[flag].dropFirst(2))] = arguments[flag + 1]
    arguments.removeSubrange(flag...flag + 1)
}
guard arguments.count == 3, ["save", "load"].contains(arguments[0]) else { fail("expected save|load URL USER") }
guard let site = LoginSite(url: arguments[1], accessGroup: options["group"]) else {
    fail("\(arguments[1]) is no http, https, ftp or imaps URL with a host")
}
let user = arguments[2]

if arguments[0] == "save" {
    guard let line = readLine(strippingNewline: true), !line.isEmpty else { fail("no password on standard input") }
    let status = site.save(user: user, password: line, label: options["label"] ?? "\(site.server) (\(user))")
    guard status == errSecSuccess else { fail(OSStatusError(status: status).message, status: status) }
} else {
    switch site.load(user: user) {
    case .success(let password): print(password)
    case .failure(let error): fail(error.message, status: error.status)
    }
}
