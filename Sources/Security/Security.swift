// `import Security` for Linux: everything `import KeychainServices` brings (Apple's SecItem API, the
// kSec… constants, OSStatus codes, the CF type names, and the Swift-native Keychain / DeviceIdentifier),
// so keychain code written for Apple platforms compiles with its imports unchanged.
@_exported import KeychainServices
