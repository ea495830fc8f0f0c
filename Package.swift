// swift-tools-version:6.0
// keychaind — Apple's Keychain Services for Linux.
// Layering (bottom to top): C shims → KeychainSystem → KeychainCore → KeychainCrypto / KeychainWire
// → KeychainStore → KeychainItems → KeychainRequests (the request core) → the transports beside each
// other: KeychainDaemon (the socket) and KeychainSecretService (the session bus) → keychaind, whose
// main wires the Secret Service onto the daemon's core;
// KeychainPrompt (pinentry over libassuan) sits beside KeychainCrypto, used by the daemon, the bus
// and keychainctl; KeychainSync (synchronizable items through a shared folder) beside
// KeychainRequests, on KeychainItems and KeychainCrypto, used by the daemon.
// The client: KeychainClient (on KeychainWire) → Security (Apple's API) → KeychainServices (the
// Swift-native API). Only KeychainSystem (and the C shims) call libc for files, sockets, clocks,
// processes and locks.
import PackageDescription

let package = Package(
    name: "keychaind",
    products: [
        // One product, two modules: `import Security` (Apple's API alone) so that code written for
        // Apple platforms compiles unchanged, or `import KeychainServices` (that and the native API).
        .library(name: "KeychainServices", targets: ["KeychainServices", "Security"]),
        .executable(name: "keychaind", targets: ["keychaind"]),
        .executable(name: "keychainctl", targets: ["keychainctl"]),
    ],
    targets: [
        // C libraries from Debian, and the few Linux calls Swift cannot reach.
        .systemLibrary(
            name: "CSodium", path: "Sources/CSodium",
            pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(
            name: "CSQLite", path: "Sources/CSQLite",
            pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(name: "CSupport"),
        // pinentry's Assuan protocol, spoken through GnuPG's own client library.
        .systemLibrary(
            name: "CAssuan", path: "Sources/CAssuan",
            pkgConfig: "libassuan", providers: [.apt(["libassuan-dev"])]),
        // A libassuan context whose buffers are zeroed when freed (C, apart from the module map).
        .target(name: "CAssuanHooks", dependencies: ["CAssuan"]),
        // The Secret Service's D-Bus library (sd-bus) and its DH/AES-CBC arithmetic (libgcrypt).
        .systemLibrary(
            name: "CSystemd", path: "Sources/CSystemd",
            pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        .systemLibrary(
            name: "CGcrypt", path: "Sources/CGcrypt",
            pkgConfig: "libgcrypt", providers: [.apt(["libgcrypt20-dev"])]),

        // The one system layer: owned descriptors, typed errno with the EINTR loop, files, sockets,
        // peer credentials, clocks, locks, threads, zeroing.
        .target(name: "KeychainSystem", dependencies: ["CSupport"]),
        // Status codes, the value model and its CBOR encoding: shared by everything above.
        .target(name: "KeychainCore", dependencies: ["KeychainSystem"]),
        // Frames and request/response messages of the wire protocol.
        .target(name: "KeychainWire", dependencies: ["KeychainSystem", "KeychainCore"]),
        // Keys, key hierarchy, sealing, blind indexes, guarded memory (libsodium; libgcrypt for
        // AES-256-GCM where libsodium cannot run it).
        .target(name: "KeychainCrypto", dependencies: ["KeychainSystem", "KeychainCore", "CSodium", "CGcrypt"]),
        // Asking a person for the keychain passphrase: pinentry over Assuan (libassuan).
        .target(name: "KeychainPrompt", dependencies: ["KeychainSystem", "KeychainCore", "CAssuan", "CAssuanHooks"]),
        // SQLite schema, migrations, rows of sealed items, transactions.
        .target(name: "KeychainStore", dependencies: ["KeychainSystem", "KeychainCore", "KeychainCrypto", "CSQLite"]),
        // The item model and Apple's SecItem semantics on top of the store.
        .target(
            name: "KeychainItems", dependencies: ["KeychainSystem", "KeychainCore", "KeychainStore", "KeychainCrypto"]),
        // The request core under every transport: peer identity, the registered app and its caller,
        // activity, the unlock gate, the log (RequestCore.swift says how a transport plugs in).
        .target(name: "KeychainRequests", dependencies: ["KeychainSystem", "KeychainCore", "KeychainItems"]),
        // Synchronizable items through a folder another engine replicates (docs/sync.md): the file
        // format, the merge rule, pairing, and the bridge to the item service.
        .target(
            name: "KeychainSync", dependencies: ["KeychainSystem", "KeychainCore", "KeychainCrypto", "KeychainItems"]),
        // The socket transport and the daemon: sockets, connections, the app registry,
        // configuration, admin verbs, status, lifecycle.
        .target(
            name: "KeychainDaemon",
            dependencies: [
                "KeychainSystem", "KeychainCore", "KeychainWire", "KeychainItems", "KeychainStore", "KeychainCrypto",
                "KeychainRequests", "KeychainPrompt", "KeychainSync",
            ]),
        // The freedesktop Secret Service on the session bus, served inside keychaind (`--secret-service`).
        .target(
            name: "KeychainSecretService",
            dependencies: [
                "KeychainSystem", "KeychainCore", "KeychainCrypto", "KeychainItems", "KeychainStore",
                "KeychainRequests", "KeychainPrompt", "CSystemd",
            ]),
        // The client core without Foundation (so keychainctl starts fast): the shared pipelined
        // connection, value-level calls, admin calls, the device-identifier convention.
        .target(name: "KeychainClient", dependencies: ["KeychainSystem", "KeychainCore", "KeychainWire"]),
        // The client library: Apple's SecItem API, a Swift-native API, DeviceIdentifier.
        .target(
            name: "KeychainServices",
            dependencies: ["Security", "KeychainSystem", "KeychainCore", "KeychainClient"]),
        // `import Security` on Linux: Apple's SecItem API, its constants and CF type names, alone.
        .target(name: "Security", dependencies: ["KeychainSystem", "KeychainCore", "KeychainClient"]),

        .executableTarget(
            name: "keychaind",
            dependencies: [
                "KeychainSystem", "KeychainCore", "KeychainDaemon", "KeychainItems", "KeychainStore",
                "KeychainSecretService", "KeychainRequests",
            ]),
        .executableTarget(
            name: "keychainctl", dependencies: ["KeychainSystem", "KeychainCore", "KeychainClient", "KeychainPrompt"]),
        // Release-built benchmark: daemon figures beside a bare socket-echo floor (scripts/bench), and
        // the cost of a passphrase change on an in-process keychain (--rotation).
        .executableTarget(
            name: "keychaind-bench",
            dependencies: ["KeychainSystem", "KeychainCore", "KeychainWire", "KeychainCrypto", "KeychainItems"]),
        // libFuzzer target for the CBOR decoder and request validation (see docs/reliability.md).
        .executableTarget(
            name: "keychaind-fuzz",
            dependencies: [
                "KeychainSystem", "KeychainDaemon", "KeychainCore", "KeychainWire", "KeychainItems", "CSupport",
                "KeychainRequests",
            ]),
        .executableTarget(
            name: "device-id-example", dependencies: ["KeychainServices"],
            path: "Examples/device-id-example"),
        // A login screen ported from iOS: an internet password saved and read back through SecItem.
        .executableTarget(name: "login-example", dependencies: ["Security"], path: "Examples/login-example"),

        // Tests, one target per module with logic, on a shared support target (temporary
        // directories, the known-answer files in Tests/Golden).
        .target(name: "KeychainTestSupport", dependencies: [], path: "Tests/KeychainTestSupport"),
        // A keychain in a temporary directory with item shorthands, for the item and bus tests.
        .target(
            name: "KeychainItemsTestSupport",
            dependencies: ["KeychainCore", "KeychainCrypto", "KeychainItems", "KeychainSystem", "KeychainTestSupport"],
            path: "Tests/KeychainItemsTestSupport"),
        .testTarget(name: "KeychainSystemTests", dependencies: ["KeychainSystem", "KeychainTestSupport"]),
        .testTarget(name: "KeychainCoreTests", dependencies: ["KeychainSystem", "KeychainCore", "KeychainWire"]),
        .testTarget(
            name: "KeychainCryptoTests",
            dependencies: ["KeychainSystem", "KeychainCore", "KeychainCrypto", "KeychainTestSupport", "CGcrypt"]),
        .testTarget(
            name: "KeychainStoreTests",
            dependencies: ["KeychainSystem", "KeychainCore", "KeychainCrypto", "KeychainStore", "KeychainTestSupport"]),
        .testTarget(
            name: "KeychainClientTests",
            dependencies: ["KeychainServices", "Security", "KeychainClient", "KeychainCore", "KeychainWire"]),
        .testTarget(
            name: "KeychainItemsTests",
            dependencies: [
                "KeychainSystem", "KeychainItems", "KeychainStore", "KeychainCrypto", "KeychainCore",
                "KeychainTestSupport", "KeychainItemsTestSupport", "KeychainSecretService",
            ]),
        .testTarget(
            name: "KeychainSyncTests",
            dependencies: [
                "KeychainSystem", "KeychainSync", "KeychainItems", "KeychainCrypto", "KeychainCore",
                "KeychainTestSupport",
            ]),
        .testTarget(
            name: "KeychainDaemonTests",
            dependencies: [
                "KeychainSystem", "KeychainDaemon", "KeychainItems", "KeychainCrypto", "KeychainCore", "KeychainWire",
                "KeychainRequests",
            ]),
        .testTarget(
            name: "SecretServiceTests",
            dependencies: [
                "KeychainSecretService", "KeychainItems", "KeychainStore", "KeychainCrypto", "KeychainCore",
                "KeychainSystem", "KeychainItemsTestSupport",
            ]),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "KeychainSystem", "KeychainServices", "Security", "KeychainClient", "KeychainCore", "KeychainWire",
            ]),
    ],
    swiftLanguageModes: [.v6]
)

// Every Swift target imports what it uses, declares it, and exposes a dependency only where its own
// public API needs it (`public import`): the compiler enforces the layering above.
for target in package.targets where target.type != .system && target.type != .binary {
    var settings = target.swiftSettings ?? []
    settings.append(.enableUpcomingFeature("InternalImportsByDefault"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    target.swiftSettings = settings
}
