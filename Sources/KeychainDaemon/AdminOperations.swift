import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainRequests
import KeychainSystem
import KeychainWire
import Synchronization

/// The administrator verbs on the socket (docs/protocol.md §11): lock, unlock, passwd, backup,
/// restore, approve, revoke — decided by AccessPolicy before they get here (RequestHandler.serve),
/// and the arguments every verb reads.
extension RequestHandler {
    /// Unlocks with `passphrase` (a request's, or one typed at a passphrase prompt): a right one
    /// starts `maxUnlockedSeconds` again and makes the approved registrations readable.
    func unlock(passphrase: SecureBytes, by: String) throws(KeychainError) {
        let wasLocked = items.isLocked
        do {
            // A right passphrase starts `maxUnlockedSeconds` again (Daemon+AutoLock.swift).
            try core.unlockGate.withLock { () throws(KeychainError) in
                try items.unlock(passphrase: passphrase)
                unlockedAt.store(MonotonicClock.milliseconds(), ordering: .relaxed)
                touch()
            }
        } catch {
            Log.warning("unlock refused", [("by", by), ("failures", String(items.protectionStatus.failedUnlocks))])
            throw error
        }
        Log.info("keychain unlocked", [("by", by)])
        // The approved registrations are sealed under the passphrase: readable from now on.
        if wasLocked { registrar.reload("unlock") }
    }

    func admin(_ action: Operation, _ args: Arguments, caller: Caller) throws(KeychainError) -> Value? {
        switch action {
        case .lock:
            try args.expect([])
            try items.lock()
            Log.info("keychain locked", [("by", "request")])
            return nil
        case .unlock:
            try args.expect(["passphrase"])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                if !items.hasPassphrase { return nil }
                throw KeychainError(.authFailed, "the passphrase is empty")
            }
            try unlock(passphrase: passphrase, by: "request")
            return nil
        case .passwd:
            try args.expect(["old", "new", "approve"])
            let old = try args.secret("old", required: false)
            let new = try args.secret("new", required: true)
            let hadPassphrase = items.hasPassphrase
            // Setting the first passphrase approves exactly the registrations the request names, each
            // as the admin was shown it, and nothing else: until now any process of the user could
            // write (and, through the admin tool, approve) a registration. [] replaces any list stored
            // without a passphrase.
            let named = try registrationsToApprove(args.values["approve"])
            if hadPassphrase && !named.isEmpty {
                throw .param(
                    "\"approve\" goes with setting the first passphrase only; a passphrase is set: approve registrations with op \"approve\""
                )
            }
            let approving = hadPassphrase || new == nil ? nil : named
            let removed: Int
            do { removed = try items.changePassphrase(old: old, new: new, approving: approving) } catch {
                if error.status == .authFailed { Log.warning("passphrase change refused") }
                throw error
            }
            registrar.reload("passwd")
            // The first passphrase makes an open keychain lockable: `maxUnlockedSeconds` counts from here.
            if !hadPassphrase { unlockedAt.store(MonotonicClock.milliseconds(), ordering: .relaxed) }
            if new == nil {
                if hadPassphrase {
                    Log.write(.notice, "passphrase removed: akpu items destroyed", [("items", String(removed))])
                }
                return nil
            }
            Log.write(.notice, hadPassphrase ? "passphrase changed" : "passphrase set")
            guard !hadPassphrase else { return nil }
            return .map(["approved": .array((approving ?? []).map { .text($0.applicationIdentifier) })])
        case .backup:
            try args.expect(["passphrase", Arguments.presenceKey])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                throw KeychainError(.param, "the backup passphrase must not be empty")
            }
            let file = try items.backup(passphrase: passphrase)
            // A backup that no restore request could carry would look like a backup and be useless.
            guard file.count + 1024 <= maxFrameBytes else {
                throw KeychainError(
                    .allocate,
                    "the backup would be \(file.count) bytes, more than a restore request may carry (maxFrameBytes \(maxFrameBytes)); raise maxFrameBytes in keychaind.json (up to 67108864) here and where you restore"
                )
            }
            Log.info("backup made", [("bytes", String(file.count)), ("by", caller.applicationIdentifier)])
            return .bytes(file)
        case .restore:
            try args.expect(["passphrase", "data", Arguments.presenceKey])
            guard let passphrase = try args.secret("passphrase", required: true) else {
                throw KeychainError(.authFailed, "the backup passphrase is empty")
            }
            guard case .bytes(let data)? = args.values["data"] else {
                throw .param("op \"restore\" needs \"data\" (bytes: the backup file's content)")
            }
            let counts = try items.restore(passphrase: passphrase, data: data)
            Log.info("backup restored", [("restored", String(counts.restored)), ("skipped", String(counts.skipped))])
            return .map(["restored": .int(Int64(counts.restored)), "skipped": .int(Int64(counts.skipped))])
        case .approve:
            try args.expect(["file", "expect", "preview", Arguments.presenceKey])
            guard case .text(let name)? = args.values["file"] else {
                throw .param(
                    "op \"approve\" needs \"file\": the name of a *.json file in \(registrar.userAppsDirectory)")
            }
            let entry = try readForApproval(name)
            // What the file says now, shown before the passphrase is asked for (`preview`) and
            // compared with what the admin saw (`expect`): the file is the user's, so any process of
            // the user may rewrite it between the admin's look and this read.
            let registration = Self.registrationValue(entry)
            if case .bool(true)? = args.values["preview"] {
                return .map(["file": .text(entry.file), "registration": registration])
            }
            if let expected = args.values["expect"], !Self.matches(expected, entry) {
                throw KeychainError(
                    .param,
                    "cannot approve \(name): it changed since it was read for approval (it now says \(Self.describe(entry))); nothing was approved — look at the file and approve it again"
                )
            }
            let presence = items.hasPassphrase ? try requiredPresence(args, action) : nil
            var list = try approvals()
            list.removeAll { $0.applicationIdentifier.utf8.elementsEqual(entry.applicationIdentifier.utf8) }
            list.append(Registrar.approval(entry))
            try items.setApprovedRegistrations(list, passphrase: presence)
            registrar.reload("approve")
            Log.write(
                .notice, "registration approved",
                [
                    ("file", entry.file), ("app", entry.applicationIdentifier),
                    ("admin", String(entry.admin)), ("by", caller.applicationIdentifier),
                ])
            return .map([
                "approved": .text(entry.applicationIdentifier), "file": .text(entry.file), "registration": registration,
            ])
        case .revoke:
            try args.expect(["application-identifier", Arguments.presenceKey])
            guard case .text(let id)? = args.values["application-identifier"], !id.isEmpty else {
                throw .param("op \"revoke\" needs \"application-identifier\" (text)")
            }
            let presence = items.hasPassphrase ? try requiredPresence(args, action) : nil
            var list = try approvals()
            let before = list.count
            list.removeAll { $0.applicationIdentifier.utf8.elementsEqual(id.utf8) }
            guard list.count < before else {
                throw KeychainError(.itemNotFound, "no approved registration has that application-identifier")
            }
            try items.setApprovedRegistrations(list, passphrase: presence)
            registrar.reload("revoke")
            Log.write(.notice, "approval revoked", [("app", id), ("by", caller.applicationIdentifier)])
            return nil
        default:
            throw .param("op \"\(action.rawValue)\" is not an admin operation")
        }
    }

    /// The top-level keys of a request besides the envelope.
    struct Arguments {
        /// The keychain passphrase an administrator sends to prove the user's presence.
        static let presenceKey = "keychainPassphrase"

        let values: [String: Value]
        init(_ values: [String: Value]) { self.values = values }

        func expect(_ known: [String]) throws(KeychainError) {
            for key in values.keys where !known.contains(key) {
                throw .param(
                    "unknown request key \"\(Self.printable(key))\" for this op (known: \(known.isEmpty ? "none" : known.joined(separator: ", ")))"
                )
            }
        }

        /// A passphrase argument in guarded memory; nil when absent (and not required) or empty.
        func secret(_ key: String, required: Bool) throws(KeychainError) -> SecureBytes? {
            switch values[key] {
            case nil:
                if required { throw .param("this op needs \"\(key)\" (bytes)") }
                return nil
            case .bytes(let b)?:
                return try PasswordHash.passphrase(b)
            case .secret(let s)?:
                return try s.withUnsafeBytes { (b) throws(KeychainError) in try PasswordHash.passphrase(b) }
            case let other?:
                throw .param("\"\(key)\" must be bytes, not \(other.kindName)")
            }
        }

        /// Zeroes the passphrase bytes of the decoded request in place (shared storage included).
        func wipe() {
            for key in ["passphrase", "old", "new", Self.presenceKey] {
                if case .bytes(let b)? = values[key] { Sodium.wipeShared(b) }
            }
        }

        static func printable(_ key: String) -> String {
            String(
                key.unicodeScalars.prefix(32).map {
                    $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?"
                })
        }
    }
}
