// The item-store fixture shared by the tests of KeychainItems and of the Secret Service: a keychain in
// a temporary directory and shorthands for items and queries.

public import Foundation
public import KeychainCore
public import KeychainCrypto
public import KeychainItems
import KeychainSystem
public import KeychainTestSupport

/// A keychain in a fresh temporary directory, removed by `cleanup()`.
public final class Fixture {
    /// The temporary directory the keychain lives in.
    public let temporary: TemporaryDirectory
    /// The temporary directory's path.
    public var root: String { temporary.path }
    /// The keychain's data directory.
    public let directory: String
    /// The item service over that directory (replaced by `reopen`).
    public var service: ItemService

    /// A caller with two groups.
    public static let app = Caller(accessGroups: ["TEAM.app", "TEAM.shared"])
    /// A caller of another app.
    public static let other = Caller(accessGroups: ["TEAM.other"])
    /// keychainctl.
    public static let admin = Caller(accessGroups: ["keychainctl"], isAdmin: true)

    /// A fresh keychain.
    public init() throws {
        temporary = try TemporaryDirectory(prefix: "kc-items")
        directory = temporary.appending("data")
        service = try ItemService(directory: directory)
    }

    /// Closes the item service and opens the directory again.
    public func reopen(acceptCurrentRows: Bool = false) throws {
        service.close()
        service = try ItemService(directory: directory, acceptCurrentRows: acceptCurrentRows)
    }

    /// Closes and removes everything.
    public func cleanup() {
        service.close()
        temporary.remove()
    }

    /// Items in the store, whoever may see them.
    public func count() throws -> Int { try service.itemCount() }

    /// The SQLite file.
    public var databasePath: String { directory + "/" + ItemService.databaseName }
    /// The device key file.
    public var keyPath: String { directory + "/" + ItemService.deviceKeyName }

    // Shorthands

    /// Adds a generic password.
    @discardableResult
    public func add(
        _ svce: String, _ acct: String, secret: String = "pw", _ extra: [String: Value] = [:],
        caller: Caller = Fixture.app
    ) throws -> Value? {
        try service.add(item(svce, acct, secret: secret, extra), caller: caller)
    }

    /// SecItemCopyMatching.
    public func copy(_ query: [String: Value], caller: Caller = Fixture.app) throws -> Value? {
        try service.copyMatching(query, caller: caller)
    }

    /// The data of one generic password, as text.
    public func secret(_ svce: String, _ acct: String, _ extra: [String: Value] = [:], caller: Caller = Fixture.app)
        throws
        -> String?
    {
        var q = query(svce, acct, extra)
        q["r_Data"] = .bool(true)
        guard let b = try copy(q, caller: caller)?.secretBytes else { return nil }
        return String(decoding: b.unprotectedArray, as: UTF8.self)
    }

    /// The attributes of one generic password.
    public func attributes(_ svce: String, _ acct: String, _ extra: [String: Value] = [:], caller: Caller = Fixture.app)
        throws
        -> [String: Value]
    {
        var q = query(svce, acct, extra)
        q["r_Attributes"] = .bool(true)
        return try copy(q, caller: caller)?.map ?? [:]
    }
}

/// Runs `body` on a fresh keychain, removed afterwards.
public func withKeychain(_ body: (Fixture) throws -> Void) throws {
    let fx = try Fixture()
    defer { fx.cleanup() }
    try body(fx)
}

/// An add request for a generic password.
public func item(_ svce: String, _ acct: String, secret: String = "pw", _ extra: [String: Value] = [:]) -> [String:
    Value]
{
    var q: [String: Value] = [
        "class": .text("genp"), "svce": .text(svce), "acct": .text(acct),
        "v_Data": .bytes(Array(secret.utf8)),
    ]
    for (k, v) in extra { q[k] = v }
    return q
}

/// A query for one generic password.
public func query(_ svce: String, _ acct: String, _ extra: [String: Value] = [:]) -> [String: Value] {
    var q: [String: Value] = ["class": .text("genp"), "svce": .text(svce), "acct": .text(acct)]
    for (k, v) in extra { q[k] = v }
    return q
}

/// The status a call ends with (.success when it returns).
public func status(_ body: () throws -> Any?) -> Status {
    failure(body)?.status ?? .success
}

/// The error a call throws (nil when it returns).
public func failure(_ body: () throws -> Any?) -> KeychainError? {
    do {
        _ = try body()
        return nil
    } catch let error as KeychainError { return error } catch {
        return KeychainError(.internal, "unexpected error type \(type(of: error))")
    }
}

/// Text as a bytes value.
public func bytes(_ s: String) -> Value { .bytes(Array(s.utf8)) }

/// Runs `body(threadIndex)` on `count` new threads at once and waits for all of them.
public func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    startThreads(count, body).wait()
}

/// Starts `count` threads running `body(index)`; the returned group is left when all have finished.
public func startThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) -> DispatchGroup {
    let group = DispatchGroup()
    for t in 0..<count {
        group.enter()
        Thread.detachNewThread {
            body(t)
            group.leave()
        }
    }
    return group
}

/// A passphrase as the item service takes it.
public func pass(_ s: String) -> SecureBytes { try! PasswordHash.passphrase(Array(s.utf8))! }
