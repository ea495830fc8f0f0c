// swift-tools-version:6.0
// keychaind — Apple's Keychain Services for Linux.
// Layering (bottom to top): C shims → KeychainCore → KeychainCrypto / KeychainWire → KeychainStore
// → KeychainItems → KeychainDaemon → KeychainSecretService → executables. KeychainServices (client) sits on KeychainWire only.
import PackageDescription

let package = Package(
    name: "keychaind",
    products: [
        // One product, two modules: `import KeychainServices`, or `import Security` so that code written
        // for Apple platforms compiles unchanged.
        .library(name: "KeychainServices", targets: ["KeychainServices", "Security"]),
        .executable(name: "keychaind", targets: ["keychaind"]),
        .executable(name: "keychainctl", targets: ["keychainctl"]),
    ],
    targets: [
        // C libraries from Debian, and the few Linux calls Swift cannot reach.
        .systemLibrary(name: "CSodium", path: "Sources/CSodium",
                       pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", path: "Sources/CSQLite",
                       pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(name: "CSupport"),
        // The Secret Service's D-Bus library (sd-bus) and its DH/AES-CBC arithmetic (libgcrypt).
        .systemLibrary(name: "CSystemd", path: "Sources/CSystemd",
                       pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        .systemLibrary(name: "CGcrypt", path: "Sources/CGcrypt",
                       pkgConfig: "libgcrypt", providers: [.apt(["libgcrypt20-dev"])]),

        // Status codes, the value model and its CBOR encoding: shared by everything above.
        .target(name: "KeychainCore"),
        // Frames and request/response messages of the wire protocol.
        .target(name: "KeychainWire", dependencies: ["KeychainCore"]),
        // Keys, key hierarchy, sealing, blind indexes, guarded memory.
        .target(name: "KeychainCrypto", dependencies: ["KeychainCore", "CSodium", "CSupport"]),
        // SQLite schema, migrations, rows of sealed items, transactions.
        .target(name: "KeychainStore", dependencies: ["KeychainCore", "KeychainCrypto", "CSQLite"]),
        // The item model and Apple's SecItem semantics on top of the store.
        .target(name: "KeychainItems", dependencies: ["KeychainCore", "KeychainStore", "KeychainCrypto"]),
        // Sockets, connections, caller identity, configuration, policy, lifecycle.
        .target(name: "KeychainDaemon", dependencies: ["KeychainCore", "KeychainWire", "KeychainItems", "CSupport"]),
        // The freedesktop Secret Service on the session bus, served inside keychaind (`--secret-service`).
        .target(name: "KeychainSecretService", dependencies: ["KeychainCore", "KeychainCrypto", "KeychainItems", "KeychainDaemon",
                                                              "CSystemd", "CGcrypt", "CSodium", "CSupport"]),
        // The client core without Foundation (so keychainctl starts fast): the shared pipelined
        // connection, value-level calls, admin calls, the device-identifier convention.
        .target(name: "KeychainClient", dependencies: ["KeychainCore", "KeychainWire"]),
        // The client library: Apple's SecItem API, a Swift-native API, DeviceIdentifier.
        .target(name: "KeychainServices", dependencies: ["KeychainCore", "KeychainWire", "KeychainClient"]),
        // `import Security` on Linux: a thin re-export of KeychainServices.
        .target(name: "Security", dependencies: ["KeychainServices"]),

        .executableTarget(name: "keychaind", dependencies: ["KeychainDaemon", "KeychainSecretService"]),
        .executableTarget(name: "keychainctl", dependencies: ["KeychainClient"]),
        // Release-built benchmark: daemon figures beside a bare socket-echo floor (scripts/bench), and
        // the cost of a passphrase change on an in-process keychain (--rotation).
        .executableTarget(name: "keychaind-bench", dependencies: ["KeychainCore", "KeychainWire", "KeychainCrypto", "KeychainItems"]),
        // libFuzzer target for the CBOR decoder and request validation (see docs/reliability.md).
        .executableTarget(name: "keychaind-fuzz", dependencies: ["KeychainDaemon", "KeychainCore", "KeychainItems", "CSupport"]),
        .executableTarget(name: "device-id-example", dependencies: ["KeychainServices"],
                          path: "Examples/device-id-example"),

        .testTarget(name: "KeychainCoreTests", dependencies: ["KeychainCore", "KeychainWire"]),
        .testTarget(name: "KeychainItemsTests", dependencies: ["KeychainItems", "KeychainStore", "KeychainCrypto", "KeychainCore"]),
        .testTarget(name: "KeychainDaemonTests", dependencies: ["KeychainDaemon", "KeychainItems", "KeychainCore"]),
        .testTarget(name: "SecretServiceTests", dependencies: ["KeychainSecretService", "KeychainItems", "KeychainCrypto", "KeychainCore", "CGcrypt"]),
        .testTarget(name: "IntegrationTests", dependencies: ["KeychainServices", "Security", "KeychainClient", "KeychainCore", "KeychainWire"]),
    ],
    swiftLanguageModes: [.v6]
)
