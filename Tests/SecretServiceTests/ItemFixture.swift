// The item-store fixture of KeychainItemsTests (Support.swift), for the Secret Service's store calls.

import Foundation
import KeychainCore
import KeychainCrypto
import KeychainSystem
import KeychainTestSupport
import Testing

@testable import KeychainItems

/// A keychain in a fresh temporary directory, removed by `cleanup()`.
final class Fixture {
    let temporary: TemporaryDirectory
    var root: String { temporary.path }
    let directory: String
    var service: ItemService

    static let app = Caller(accessGroups: ["TEAM.app", "TEAM.shared"])
    static let other = Caller(accessGroups: ["TEAM.other"])
    static let admin = Caller(accessGroups: ["keychainctl"], isAdmin: true)

    init() throws {
        temporary = try TemporaryDirectory(prefix: "kc-items")
        directory = temporary.appending("data")
        service = try ItemService(directory: directory)
    }

    func reopen(acceptCurrentRows: Bool = false) throws {
        service.close()
        service = try ItemService(directory: directory, acceptCurrentRows: acceptCurrentRows)
    }

    func cleanup() {
        service.close()
        temporary.remove()
    }

    func count() throws -> Int { try service.itemCount() }

    var databasePath: String { directory + "/" + ItemService.databaseName }
    var keyPath: String { directory + "/" + ItemService.deviceKeyName }

    // Shorthands

    @discardableResult
    func add(
        _ svce: String, _ acct: String, secret: String = "pw", _ extra: [String: Value] = [:],
        caller: Caller = Fixture.app
    ) throws -> Value? {
        try service.add(item(svce, acct, secret: secret, extra), caller: caller)
    }

    func copy(_ query: [String: Value], caller: Caller = Fixture.app) throws -> Value? {
        try service.copyMatching(query, caller: caller)
    }

    func secret(_ svce: String, _ acct: String, _ extra: [String: Value] = [:], caller: Caller = Fixture.app) throws
        -> String?
    {
        var q = query(svce, acct, extra)
        q["r_Data"] = .bool(true)
        guard let b = try copy(q, caller: caller)?.secretBytes else { return nil }
        return String(decoding: b.unprotectedArray, as: UTF8.self)
    }

    func attributes(_ svce: String, _ acct: String, _ extra: [String: Value] = [:], caller: Caller = Fixture.app) throws
        -> [String: Value]
    {
        var q = query(svce, acct, extra)
        q["r_Attributes"] = .bool(true)
        return try copy(q, caller: caller)?.map ?? [:]
    }
}

func withKeychain(_ body: (Fixture) throws -> Void) throws {
    let fx = try Fixture()
    defer { fx.cleanup() }
    try body(fx)
}

func item(_ svce: String, _ acct: String, secret: String = "pw", _ extra: [String: Value] = [:]) -> [String: Value] {
    var q: [String: Value] = [
        "class": .text("genp"), "svce": .text(svce), "acct": .text(acct),
        "v_Data": .bytes(Array(secret.utf8)),
    ]
    for (k, v) in extra { q[k] = v }
    return q
}

func query(_ svce: String, _ acct: String, _ extra: [String: Value] = [:]) -> [String: Value] {
    var q: [String: Value] = ["class": .text("genp"), "svce": .text(svce), "acct": .text(acct)]
    for (k, v) in extra { q[k] = v }
    return q
}

/// The status a call ends with (.success when it returns).
func status(_ body: () throws -> Any?) -> Status {
    failure(body)?.status ?? .success
}

/// The error a call throws (nil when it returns).
func failure(_ body: () throws -> Any?) -> KeychainError? {
    do {
        _ = try body()
        return nil
    } catch let error as KeychainError { return error } catch {
        return KeychainError(.internal, "unexpected error type \(type(of: error))")
    }
}

func bytes(_ s: String) -> Value { .bytes(Array(s.utf8)) }

/// Runs `body(threadIndex)` on `count` new threads at once and waits for all of them.
func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let group = DispatchGroup()
    for t in 0..<count {
        group.enter()
        Thread.detachNewThread {
            body(t)
            group.leave()
        }
    }
    group.wait()
}

/// A passphrase as the item service takes it (PassphraseTests.swift in KeychainItemsTests).
func pass(_ s: String) -> SecureBytes { try! PasswordHash.passphrase(Array(s.utf8))! }
