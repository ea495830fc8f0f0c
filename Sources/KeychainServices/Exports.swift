@_exported public import Security

@_exported public import class KeychainClient.KeychainConnection
// What `import KeychainServices` brings, and nothing more: Apple's SecItem API with its `kSec…`
// constants, `OSStatus` codes and CF type names (the Security module, which `import Security` brings
// alone), the Swift-native `Keychain` and `DeviceIdentifier` (declared in this module), the error they
// throw (`KeychainError`, whose `status` is a `Status`), and `KeychainConnection` (to point a
// `Keychain` at another socket).
//
// The modules underneath are imported `internal`ly everywhere else: their `Operation`, `Value`,
// `Frame`, `UnixSocket`, `Lock` … would otherwise collide with Foundation's names (`Operation`) or the
// app's own.
@_exported public import struct KeychainCore.KeychainError
@_exported public import struct KeychainCore.Status
