// `import Security` for Linux: Apple's SecItem API as Apple declares it, and nothing else — the
// `SecItem…` functions, the `kSec…` constants with Apple's values, `OSStatus` and the `errSec…` codes,
// `SecCopyErrorMessageString`, `SecAccessControlCreateWithFlags`, and the CF type names. Keychain
// code written for Apple platforms compiles with its imports unchanged, also beside a wrapper that
// declares its own `Keychain`, `KeychainError` or `Status` (KeychainAccess, Valet): the Swift-native
// API of this package (`Keychain`, `DeviceIdentifier`, `KeychainError`, `Status`) comes with
// `import KeychainServices`, which brings this module too.
