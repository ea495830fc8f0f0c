import KeychainCore
import KeychainCrypto
import KeychainItems
import KeychainRequests
import KeychainSystem
import KeychainWire
import Synchronization

/// Registration approvals, beside the registry they decide about (AppRegistry, Registrar): what
/// `approve` reads from apps.d, how a registration is shown and compared. The approved list itself
/// is stored sealed in the keychain (ItemService+Registrations.swift), because it is written in one
/// transaction with the passphrase check that authorises it.
extension RequestHandler {
    /// The registration file `name` of the user's apps.d as it is now, refused when it cannot be
    /// approved (not a plain *.json name, unreadable, or an executable the user can modify).
    func readForApproval(_ name: String) throws(KeychainError) -> AppEntry {
        guard !name.isEmpty, !name.contains("/"), name.hasSuffix(".json"), !name.hasPrefix(".") else {
            throw .param(
                "cannot approve \"\(Arguments.printable(name))\": not the name of a *.json file in \(registrar.userAppsDirectory)"
            )
        }
        let entry: AppEntry
        do { entry = try AppFiles.parse(file: registrar.userAppsDirectory + "/" + name) } catch {
            throw KeychainError(.param, "cannot approve: \(error)")
        }
        let principal = TrustedPaths.Principal.current()
        if principal.uid != 0 {
            for exe in entry.executables {
                if let problem = TrustedPaths.modifiableProblem(exe, by: principal) {
                    throw KeychainError(
                        .param,
                        "cannot approve \(name): executable \(exe) can be modified by this user (\(problem)); install it root-owned (for example under /usr/local/bin) and register that path"
                    )
                }
            }
        }
        return entry
    }

    /// `passwd`'s "approve": a list of {"file": name in the user's apps.d, "expect": the registration
    /// as the admin was shown it}. Each file must say exactly what was shown (as for `approve`), or
    /// nothing is changed. Later entries for one application-identifier replace earlier ones.
    func registrationsToApprove(_ value: Value?) throws(KeychainError) -> [ApprovedRegistration] {
        guard let value else { return [] }
        let usage =
            "\"approve\" must be a list of maps {\"file\": a *.json name in \(registrar.userAppsDirectory), \"expect\": the registration as shown}"
        guard case .array(let requested) = value else { throw .param(usage) }
        var list: [ApprovedRegistration] = []
        for item in requested {
            guard case .map(let m) = item, m.count == 2, case .text(let name)? = m["file"], let expected = m["expect"]
            else { throw .param(usage) }
            let entry = try readForApproval(name)
            guard Self.matches(expected, entry) else {
                throw KeychainError(
                    .param,
                    "cannot approve \(name): it changed since it was shown (it now says \(Self.describe(entry))); nothing was changed — look at the file and try again"
                )
            }
            list.removeAll { $0.applicationIdentifier.utf8.elementsEqual(entry.applicationIdentifier.utf8) }
            list.append(Registrar.approval(entry))
        }
        return list
    }

    func approvals() throws(KeychainError) -> [ApprovedRegistration] {
        guard let list = try items.approvedRegistrations() else {
            throw KeychainError(
                .interactionNotAllowed, "the keychain has not been unlocked since keychaind started: unlock it first")
        }
        return list
    }

    /// A registration as `approve` shows it and compares it: the four keys of an apps.d file.
    static func registrationValue(_ entry: AppEntry) -> Value {
        .map([
            "application-identifier": .text(entry.applicationIdentifier),
            "keychain-access-groups": .array(entry.accessGroups.map(Value.text)),
            "executables": .array(entry.executables.map(Value.text)),
            "admin": .bool(entry.admin),
        ])
    }

    /// Whether `expected` is `registrationValue(entry)`, its text compared byte for byte (as
    /// approvals are): two spellings of one path that Unicode calls equal may be two files.
    static func matches(_ expected: Value, _ entry: AppEntry) -> Bool {
        guard case .map(let m) = expected, m.count == 4, case .bool(let admin)? = m["admin"], admin == entry.admin,
            case .text(let id)? = m["application-identifier"], id.utf8.elementsEqual(entry.applicationIdentifier.utf8)
        else { return false }
        func same(_ key: String, _ list: [String]) -> Bool {
            guard case .array(let values)? = m[key], values.count == list.count else { return false }
            return zip(values, list).allSatisfy { v, s in
                if case .text(let t) = v { return t.utf8.elementsEqual(s.utf8) }
                return false
            }
        }
        return same("keychain-access-groups", entry.accessGroups) && same("executables", entry.executables)
    }

    /// The same registration in one line, for a refusal's message.
    static func describe(_ entry: AppEntry) -> String {
        "application-identifier \(entry.applicationIdentifier), groups \(entry.accessGroups.joined(separator: ", ")), executables \(entry.executables.joined(separator: ", ")), admin \(entry.admin ? "yes" : "no")"
    }
}
