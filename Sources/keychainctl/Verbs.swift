import KeychainClient
import KeychainCore
import KeychainPrompt
import KeychainSystem

/// Runs one parsed invocation against the daemon, writing into `out`.
struct Command {
    let inv: Invocation
    let connection: KeychainConnection
    var out = Output()

    init(_ inv: Invocation) {
        self.inv = inv
        connection = inv.socket.map { KeychainConnection(socketPath: $0) } ?? .shared
    }

    mutating func run() throws(KeychainError) {
        switch inv.verb! {
        case .help: try help()
        case .add, .addInternetPassword: try add()
        case .find, .findInternetPassword: try find()
        case .update: try update()
        case .delete, .deleteInternetPassword: try delete()
        case .list: try list()
        case .deviceID: try deviceID()
        case .status: try status()
        case .lock:
            try KeychainAdmin(connection: connection).lock()
            ok()
        case .unlock: try unlock()
        case .passwd: try passwd()
        case .backup: try backup()
        case .restore: try restore()
        case .apps: try apps()
        case .register: try register()
        case .approve: try approve(inv.positional[0])
        case .unregister: try unregister()
        case .sync: try sync()
        }
    }

    // MARK: Presence (an admin's keychain passphrase)

    static let presenceKey = "keychainPassphrase"

    /// The keychain passphrase: from --keychain-passphrase-file, else asked on the terminal.
    private func keychainPassphrase() throws(KeychainError) -> [UInt8] {
        try passphrase(file: .keychainPassphraseFile, prompt: "keychain passphrase: ")
    }

    /// The error for a passphrase that is needed and could not be asked for (no terminal), naming
    /// the options that give it: errSecAuthFailed (exit 51) for the keychain's own passphrase, as the
    /// daemon answers a request that lacks it; errSecParam (a usage error) for a new or backup one.
    private func noPassphrase(file: Opt, fd: Opt?) -> KeychainError {
        let backup = inv.verb == .backup || inv.verb == .restore
        let what: String
        switch file {
        case .keychainPassphraseFile: what = "the keychain passphrase"
        case .newPassphraseFile: what = "the new passphrase"
        default:
            what =
                backup
                ? "the backup passphrase" : inv.verb == .passwd ? "the current passphrase" : "the keychain passphrase"
        }
        let options = ([file] + (fd.map { [$0] } ?? [])).map { $0.spellings.last! }.joined(separator: " or ")
        let keychains = file == .keychainPassphraseFile || (file == .passphraseFile && !backup)
        return KeychainError(
            keychains ? .authFailed : .param,
            "\(what) is needed: give it with \(options), or run in a terminal to be asked")
    }

    /// Runs `body` with the request arguments that prove presence: the keychain passphrase when a
    /// file gives it, else none at first and — when the daemon answers that it needs it — asked on the
    /// terminal, and `body` run once more.
    func withPresence<R>(_ body: ([String: Value]) throws(KeychainError) -> R) throws(KeychainError) -> R {
        if inv.value(.keychainPassphraseFile) != nil {
            var p = try keychainPassphrase()
            defer { IO.wipe(&p) }
            return try body([Self.presenceKey: .bytes(p)])
        }
        do {
            return try body([:])
        } catch  where error.needsPassphrase {
            var p = try keychainPassphrase()
            defer { IO.wipe(&p) }
            return try body([Self.presenceKey: .bytes(p)])
        }
    }

    /// Presence for an admin op that always needs it while a passphrase is set.
    private func presenceArguments(_ admin: KeychainAdmin) throws(KeychainError) -> [UInt8]? {
        if inv.value(.keychainPassphraseFile) == nil {
            guard try admin.status().passphraseSet else { return nil }
        }
        return try keychainPassphrase()
    }

    private mutating func help() throws(KeychainError) {
        guard let name = inv.positional.first else { return out.write(toolHelp) }
        guard let v = Verb(rawValue: name) else {
            throw .param("no verb \"\(name)\" to help with; keychainctl --help lists them")
        }
        out.write(v.helpText)
    }

    private mutating func ok() {
        if inv.json { out.line("{\"ok\":true}") }
    }

    // MARK: Queries

    /// The verb's class plus the filters that were given: -s/-a/-g for a generic password; for an
    /// internet password -a/-s/-r/-P/-p/-d/-t and --group (Arguments.swift checked their values).
    private func filters() -> [String: Value] {
        let itemClass = inv.verb?.itemClass ?? .genericPassword
        var q: [String: Value] = ["class": .text(itemClass.code)]
        if itemClass == .internetPassword {
            if let s = inv.value(.server) { q["srvr"] = .text(s) }
            if let r = inv.value(.protocolCode).flatMap(Invocation.protocolCode) { q["ptcl"] = .text(r) }
            if let t = inv.value(.authenticationType).flatMap(Invocation.authenticationCode) { q["atyp"] = .text(t) }
            if let p = inv.value(.port).flatMap({ UInt16($0) }) { q["port"] = .int(Int64(p)) }
            if let p = inv.value(.path) { q["path"] = .text(p) }
            if let d = inv.value(.securityDomain) { q["sdmn"] = .text(d) }
        }
        if let s = inv.value(.service) { q["svce"] = .text(s) }
        if let a = inv.value(.account) { q["acct"] = .text(a) }
        if let g = inv.value(.group) { q["agrp"] = .text(g) }
        // Apple's default without it: local items only.
        if inv.has(.synchronizable) { q["sync"] = .bool(true) }
        return q
    }

    /// The attribute options given (-l, -j, -D, --accessible).
    private func attributeOptions() -> [String: Value] {
        var a: [String: Value] = [:]
        if let l = inv.value(.label) { a["labl"] = .text(l) }
        if let c = inv.value(.comment) { a["icmt"] = .text(c) }
        if let d = inv.value(.description) { a["desc"] = .text(d) }
        if let p = inv.value(.accessible) { a["pdmn"] = .text(p) }
        return a
    }

    /// The secret from -w, --stdin or the terminal.
    private func secret(newItem: Bool) throws(KeychainError) -> [UInt8] {
        if let w = inv.value(.secret) { return Array(w.utf8) }
        if inv.has(.stdin) {
            var b = try IO.readAll(0)
            IO.chompNewline(&b)
            return b
        }
        return newItem
            ? try Prompt.readNewSecret("password data for new item: ", "retype password for new item: ")
            : try Prompt.readNewSecret("new password data: ", "retype new password data: ")
    }

    private static func items(_ v: Value?) -> [Value] {
        switch v {
        case .array(let a)?: return a
        case let v?: return [v]
        case nil: return []
        }
    }

    // MARK: Item verbs

    private mutating func add() throws(KeychainError) {
        var data = try secret(newItem: true)
        defer { IO.wipe(&data) }
        var q = filters().merging(attributeOptions()) { _, b in b }
        q["v_Data"] = .bytes(data)
        if inv.json { q["r_Attributes"] = .bool(true) }
        var result: Value?
        do throws(KeychainError) {
            result = try withPresence { (p) throws(KeychainError) in try connection.call(.add, query: q, arguments: p) }
        } catch  where error.status == .duplicateItem && inv.has(.updateExisting) {
            var attrs = attributeOptions()
            attrs["v_Data"] = .bytes(data)
            // Update exactly the item the add collided with: the one in the group the add went to
            // (without -g an admin's query would otherwise span every group).
            var target = filters()
            if target["agrp"] == nil, let group = try KeychainAdmin(connection: connection).status().groups.first {
                target["agrp"] = .text(group)
            }
            _ = try withPresence { (p) throws(KeychainError) in
                try connection.call(.update, query: target, attributes: attrs, arguments: p)
            }
            if inv.json {
                var read = target
                read["r_Attributes"] = .bool(true)
                result = try connection.call(.copy, query: read)
            }
        }
        if inv.json { out.line(JSON.encode(result ?? .map([:]))) }
    }

    private mutating func find() throws(KeychainError) {
        var q = filters()
        q["m_Limit"] = .text(inv.has(.all) ? "m_LimitAll" : "m_LimitOne")
        let printSecret = inv.has(.printSecret)
        let showPassword = inv.has(.showPassword)
        if printSecret || showPassword { q["r_Data"] = .bool(true) }
        if !printSecret || inv.json { q["r_Attributes"] = .bool(true) }
        let result = try withPresence { (p) throws(KeychainError) in try connection.call(.copy, query: q, arguments: p)
        }
        let items = Self.items(result)
        if inv.json {
            let shaped = items.map { item -> Value in
                if item.map == nil { return .map(["v_Data": item]) }  // r_Data alone
                return item
            }
            out.line(JSON.encode(inv.has(.all) ? .array(shaped) : (shaped.first ?? .map([:]))))
        } else if printSecret {
            for item in items {
                out.raw(item.map?["v_Data"] ?? item)
                out.raw([10])
            }
        } else {
            out.write(
                items.compactMap { $0.map }.map { m in
                    var rows = Human.item(m)
                    // macOS `security find-… -g`: the password after the attributes.
                    if showPassword, let data = m["v_Data"] { rows.append(("password", Human.password(data))) }
                    return Human.aligned(rows)
                }.joined(separator: "\n\n"))
            out.line()
        }
    }

    private mutating func update() throws(KeychainError) {
        var attrs = attributeOptions()
        var data: [UInt8] = []
        defer { IO.wipe(&data) }
        if inv.value(.secret) != nil || inv.has(.stdin) || inv.promptForSecret || attrs.isEmpty {
            data = try secret(newItem: false)
            attrs["v_Data"] = .bytes(data)
        }
        let q = filters()
        _ = try withPresence { (p) throws(KeychainError) in
            try connection.call(.update, query: q, attributes: attrs, arguments: p)
        }
        ok()
    }

    private mutating func delete() throws(KeychainError) {
        let q = filters()
        var refsQuery = q
        refsQuery["r_PersistentRef"] = .bool(true)
        refsQuery["m_Limit"] = .text("m_LimitAll")
        let refs = Self.items(try connection.call(.copy, query: refsQuery))
        if inv.has(.all) {
            _ = try withPresence { (p) throws(KeychainError) in try connection.call(.delete, query: q, arguments: p) }
        } else {
            let narrowing =
                inv.verb?.itemClass == .internetPassword ? "-a, -s, -r, -P, -p, -d, -t and --group" : "-s, -a and -g"
            guard refs.count == 1, let ref = refs[0].plainBytes else {
                throw .param(
                    "\(refs.count) items match; narrow the match with \(narrowing), or pass --all to delete them all")
            }
            let one: [String: Value] = [
                "class": .text((inv.verb?.itemClass ?? .genericPassword).code), "v_PersistentRef": .bytes(ref),
            ]
            _ = try withPresence { (p) throws(KeychainError) in try connection.call(.delete, query: one, arguments: p) }
        }
        if inv.json { out.line("{\"deleted\":\(refs.count)}") }
    }

    private mutating func list() throws(KeychainError) {
        var q: [String: Value] = [
            "class": .text("genp"), "sync": .text("syna"), "r_Attributes": .bool(true),
            "m_Limit": .text("m_LimitAll"),
        ]
        if let g = inv.value(.group) { q["agrp"] = .text(g) }
        var items: [[String: Value]]
        do throws(KeychainError) {
            items = Self.items(try connection.call(.copy, query: q)).compactMap { $0.map }
        } catch  where error.status == .itemNotFound {
            items = []
        }
        func key(_ m: [String: Value]) -> [String] {
            [m["agrp"]?.text ?? "", m["svce"]?.text ?? "", m["acct"]?.text ?? ""]
        }
        items.sort { key($0).lexicographicallyPrecedes(key($1)) }
        if inv.json {
            out.line(JSON.encode(.array(items.map { .map($0) })))
            return
        }
        if items.isEmpty { return }
        var rows: [[String]] = [["GROUP", "SERVICE", "ACCOUNT", "ACCESSIBLE", "MODIFIED"]]
        for m in items {
            let modified = m["mdat"]?.date.map(Dates.local) ?? "-"
            rows.append([
                m["agrp"]?.text ?? "-", m["svce"]?.text ?? "", m["acct"]?.text ?? "",
                m["pdmn"]?.text ?? "-", modified,
            ])
        }
        var widths = [Int](repeating: 0, count: 5)
        for r in rows { for (i, c) in r.enumerated() { widths[i] = max(widths[i], c.count) } }
        for r in rows {
            var line = ""
            for (i, c) in r.enumerated() {
                line += i == r.count - 1 ? c : c + String(repeating: " ", count: widths[i] - c.count + 2)
            }
            out.line(line)
        }
    }

    private mutating func deviceID() throws(KeychainError) {
        var group = inv.value(.group)
        if group == nil { group = try KeychainAdmin(connection: connection).status().groups.first }
        let id = try DeviceIdentifierConvention.resolve(accessGroup: group, connection: connection)
        if inv.json {
            out.line("{\"accessGroup\":\(group.map(JSON.string) ?? "null"),\"deviceId\":\(JSON.string(id))}")
        } else {
            out.line(id)
        }
    }

    // MARK: Admin verbs

    private mutating func status() throws(KeychainError) {
        let s = try KeychainAdmin(connection: connection).status()
        if inv.json {
            var m = s.raw
            m["socket"] = .text(connection.socketPath)
            out.line(JSON.encode(.map(m)))
            return
        }
        let classes = s.classes.keys.sorted { a, b in
            let order = ["ak", "ck", "dk", "aku", "cku", "dku", "akpu"]
            return (order.firstIndex(of: a) ?? 99, a) < (order.firstIndex(of: b) ?? 99, b)
        }
        let available = classes.filter { s.classes[$0] == true }
        let unavailable = classes.filter { s.classes[$0] != true }
        var rows: [(String, String)] = [
            ("daemon", "keychaind " + s.version),
            ("socket", connection.socketPath),
            ("state", s.locked ? "locked" : "unlocked"),
            (
                "passphrase",
                s.passphraseSet
                    ? "set"
                    : "not set: keys are protected by the device key file alone (set one with `keychainctl passwd`)"
            ),
            ("items", String(s.items)),
        ]
        if s.passphraseSet { rows.append(("auto-lock", Self.autoLock(s.raw))) }
        rows += [
            ("uptime", Human.duration(s.uptime)),
            ("connections", String(s.connections)),
        ]
        if !classes.isEmpty {
            rows.append(("readable", available.isEmpty ? "none" : available.joined(separator: " ")))
            if !unavailable.isEmpty { rows.append(("unreadable", unavailable.joined(separator: " "))) }
        }
        rows.append(("caller", s.caller.isEmpty ? "not identified" : s.caller + (s.admin ? " (admin)" : "")))
        if !s.groups.isEmpty { rows.append(("groups", s.groups.joined(separator: " "))) }
        if case .text(let why)? = s.raw["unidentified"] { rows.append(("why", why)) }
        if let bus = s.raw["secretService"]?.map {
            let others =
                bus["unregistered"]?.text == "refuse"
                ? "refused"
                : "share one collection (access group \(bus["sharedGroup"]?.text ?? "secret-service"))"
            rows.append(
                (
                    "secret service",
                    "serving \(bus["busName"]?.text ?? "org.freedesktop.secrets") on the session bus; processes that are not registered apps: \(others)"
                ))
        }
        let isolation = s.raw["isolation"]?.map ?? [:]
        switch isolation["level"]?.text {
        case "none"?: rows.append(("isolation", "none against your own processes (no passphrase)"))
        case "apps"?: rows.append(("isolation", "apps are told apart by their executables"))
        default: break
        }
        for note in (isolation["notes"]?.array ?? []).compactMap(\.text) { rows.append(("", "- " + note)) }
        let registrations = (isolation["registrations"]?.array ?? []).compactMap(\.map)
        let ignored = registrations.filter { $0["trusted"]?.bool == false || $0["refused"] != nil }
        for r in ignored {
            rows.append(
                (
                    "not counting",
                    (r["file"]?.text ?? "?") + ": "
                        + (r["reason"]?.text
                            ?? (r["refused"]?.map ?? [:]).values.compactMap(\.text).joined(separator: "; "))
                ))
        }
        for r in registrations {
            if let warning = Self.interpreterWarning(r) { rows.append(("interpreter", warning)) }
        }
        out.line(Human.aligned(rows))
    }

    /// When the keychain locks by itself: after `autoLockSeconds` without a successful request, at
    /// most `maxUnlockedSeconds` after the unlock.
    static func autoLock(_ raw: [String: Value]) -> String {
        var parts: [String] = []
        if case .int(let idle)? = raw["autoLockSeconds"], idle > 0 {
            var part = "after \(Human.duration(Double(idle))) without a successful request"
            if case .float(let now)? = raw["idleSeconds"] { part += " (idle \(Human.duration(now)))" }
            parts.append(part)
        }
        if case .int(let bound)? = raw["maxUnlockedSeconds"], bound > 0 {
            var part = "at most \(Human.duration(Double(bound))) unlocked"
            if case .float(let open)? = raw["unlockedSeconds"] { part += " (unlocked \(Human.duration(open)) ago)" }
            parts.append(part)
        }
        return parts.isEmpty ? "off (locks only with keychainctl lock)" : parts.joined(separator: "; ")
    }

    // MARK: Registrations

    private mutating func apps() throws(KeychainError) {
        let s = try KeychainAdmin(connection: connection).status()
        let registrations = (s.raw["isolation"]?.map?["registrations"]?.array ?? []).compactMap(\.map)
        if inv.json {
            out.line(JSON.encode(.array(registrations.map(Value.map))))
            return
        }
        guard s.raw["isolation"]?.map?["registrations"] != nil else {
            throw KeychainError(
                .missingEntitlement,
                "keychaind shows registrations to identified apps only; this keychainctl is not one")
        }
        var rows: [[String]] = [["APP", "SOURCE", "ADMIN", "COUNTS", "FILE"]]
        for r in registrations {
            rows.append([
                r["application-identifier"]?.text ?? "?", r["source"]?.text ?? "?",
                r["admin"]?.bool == true ? "yes" : "no",
                r["trusted"]?.bool == true ? (r["refused"] == nil ? "yes" : "partly") : "no",
                r["file"]?.text ?? "",
            ])
        }
        var widths = [Int](repeating: 0, count: 5)
        for r in rows { for (i, c) in r.enumerated() { widths[i] = max(widths[i], c.count) } }
        for r in rows {
            out.line(
                r.enumerated().map { i, c in
                    i == r.count - 1 ? c : c + String(repeating: " ", count: widths[i] - c.count + 2)
                }.joined())
        }
        for r in registrations {
            if let why = r["reason"]?.text { out.line("  \(r["file"]?.text ?? "?"): \(why)") }
            for (_, why) in (r["refused"]?.map ?? [:]).sorted(by: { $0.key < $1.key }) {
                if let why = why.text { out.line("  \(r["file"]?.text ?? "?"): \(why)") }
            }
            if let warning = Self.interpreterWarning(r) { out.line("  " + warning) }
        }
    }

    /// For a listed registration whose executables include an interpreter: that every script it
    /// runs is that app.
    static func interpreterWarning(_ r: [String: Value]) -> String? {
        let interpreters = (r["interpreters"]?.array ?? []).compactMap(\.text)
        guard !interpreters.isEmpty else { return nil }
        let id = r["application-identifier"]?.text ?? "?"
        return
            "\(r["file"]?.text ?? "?"): \(interpreters.joined(separator: ", ")) \(interpreters.count == 1 ? "is an interpreter" : "are interpreters"): every script \(interpreters.count == 1 ? "it runs" : "they run") is \(id), whoever wrote it"
    }

    /// Writes NAME.json into the daemon's user apps.d and approves it.
    private mutating func register() throws(KeychainError) {
        let admin = KeychainAdmin(connection: connection)
        let s = try admin.status()
        guard let directory = s.raw["isolation"]?.map?["userAppsDirectory"]?.text else {
            throw KeychainError(
                .missingEntitlement,
                "keychaind tells identified apps only where registrations go; this keychainctl is not one")
        }
        let id = inv.value(.appID)!
        var name = inv.positional.first ?? id
        if !name.hasSuffix(".json") { name += ".json" }
        guard !name.contains("/"), !name.hasPrefix(".") else { throw .param("NAME must be a plain file name") }
        var object: [(String, Value)] = [
            ("application-identifier", .text(id)),
            ("keychain-access-groups", .array((inv.repeated[.group] ?? []).map(Value.text))),
            ("executables", .array((inv.repeated[.executable] ?? []).map(Value.text))),
        ]
        if inv.has(.admin) { object.append(("admin", .bool(true))) }
        let text =
            "{\n" + object.map { "  \(JSON.string($0.0)): \(JSON.encode($0.1))" }.joined(separator: ",\n") + "\n}\n"
        try IO.makeDirectories(directory)
        try IO.writeFilePrivately(directory + "/" + name, Array(text.utf8))
        if !inv.json { out.line("wrote \(directory)/\(name)") }
        let written = Value.map([
            "application-identifier": .text(id),
            "keychain-access-groups": .array((inv.repeated[.group] ?? []).map(Value.text)),
            "executables": .array((inv.repeated[.executable] ?? []).map(Value.text)),
            "admin": .bool(inv.has(.admin)),
        ])
        do throws(KeychainError) {
            try approve(name, expecting: written)
        } catch  where error.status == .missingEntitlement && !s.passphraseSet {
            // Without a passphrase the file counts as it is once keychaind has read it, which it does
            // as soon as apps.d changes (a non-admin cannot ask for the reload): say whether it counts.
            let path = directory + "/" + name
            let seen = try awaitRegistration(path, id: id)
            // Not listed: not read (keychaind could not watch apps.d, or another file there is
            // malformed, so the registrations from before stay). Listed: it counts, or why not, and
            // which of its executables cannot carry it.
            let refusedCount = seen?["refused"]?.map?.count ?? 0
            let executables = inv.repeated[.executable]?.count ?? 0
            let counts = seen.map { $0["trusted"]?.bool == true && refusedCount < executables }
            let why = seen?["reason"]?.text
            let refused = seen.flatMap(Self.refusals)
            if inv.json {
                var fields = [
                    "\"file\":\(JSON.string(name))", "\"counts\":\(counts.map(String.init) ?? "null")",
                    "\"registration\":\(JSON.encode(written))",
                ]
                if let why { fields.append("\"reason\":\(JSON.string(why))") }
                if let refused { fields.append("\"refused\":\(JSON.string(refused))") }
                out.line("{" + fields.joined(separator: ",") + "}")
            } else if seen == nil {
                out.line(
                    "keychaind has not read it (see `keychaind` in the journal: it may not watch apps.d, or another file there is malformed); it reads it on its next start or SIGHUP (pkill -HUP -u \"$(id -u)\" -x keychaind)"
                )
            } else if let why {
                out.line("keychaind read it, but it does not count: \(why)")
            } else if let refused, counts == false {
                out.line("keychaind read it, but it does not count: \(refused)")
            } else if let refused {
                out.line("keychaind counts it, but not for every executable: \(refused)")
            } else {
                out.line("keychaind counts it: \(Self.describe(written))")
            }
        }
    }

    /// What keychaind lists for the registration file `path` of `id`, asked on a new connection:
    /// keychaind takes every change to apps.d before it identifies a new connection's peer, so the
    /// file just written is read by then. Nil when it is not listed (keychaind could not watch
    /// apps.d, so it reads it on its next start or SIGHUP).
    private func awaitRegistration(_ path: String, id: String) throws(KeychainError) -> [String: Value]? {
        try awaitRegistration(id: id) { $0 == path }
    }

    /// The same for the file called `name` in the user's apps.d (an approval names no directory).
    private func awaitRegistration(named name: String, id: String) throws(KeychainError) -> [String: Value]? {
        try awaitRegistration(id: id) { $0.hasSuffix("/" + name) }
    }

    private func awaitRegistration(id: String, file: (String) -> Bool) throws(KeychainError) -> [String: Value]? {
        let fresh = KeychainAdmin(connection: KeychainConnection(socketPath: connection.socketPath))
        let registrations = try fresh.status().raw["isolation"]?.map?["registrations"]?.array ?? []
        return registrations.compactMap(\.map).first {
            $0["source"]?.text == "user" && $0["file"]?.text.map(file) == true
                && $0["application-identifier"]?.text == id
        }
    }

    /// The executables of a listed registration that cannot carry its identity, and why; nil when none.
    private static func refusals(_ entry: [String: Value]) -> String? {
        let refused = (entry["refused"]?.map ?? [:]).sorted { $0.key < $1.key }.compactMap { $0.value.text }
        return refused.isEmpty ? nil : refused.joined(separator: "; ")
    }

    /// Approves a file of the user's apps.d. What is approved is what was shown before the
    /// passphrase was asked for (`register`: what it wrote), or nothing: any process of the user may
    /// rewrite the file meanwhile, and the daemon refuses a file that no longer says that.
    private mutating func approve(_ file: String, expecting written: Value? = nil) throws(KeychainError) {
        let admin = KeychainAdmin(connection: connection)
        var name = file
        if !name.hasSuffix(".json") { name += ".json" }
        let registration: Value
        if let written { registration = written } else { registration = try admin.previewApproval(file: name) }
        if !inv.json && written == nil { out.line("approving \(name): \(Self.describe(registration))") }
        var p = try presenceArguments(admin)
        defer { if p != nil { IO.wipe(&p!) } }
        let id = try admin.approve(file: name, expect: registration, keychainPassphrase: p)
        // Approved is not yet counting: an executable another registration holds, or one the user
        // can modify, carries no identity. Said as register says it without a passphrase.
        let seen = try? awaitRegistration(named: name, id: id)
        let refused = seen.flatMap(Self.refusals)
        if inv.json {
            var fields = [
                "\"approved\":\(JSON.string(id))", "\"file\":\(JSON.string(name))",
                "\"registration\":\(JSON.encode(registration))",
            ]
            if let refused { fields.append("\"refused\":\(JSON.string(refused))") }
            out.line("{" + fields.joined(separator: ",") + "}")
        } else {
            out.line("approved \(id) (\(name)): \(Self.describe(registration))")
            if let refused { out.line("keychaind does not count it for every executable: \(refused)") }
        }
    }

    /// A registration map in one line: groups, executables, and whether it is an admin.
    static func describe(_ registration: Value) -> String {
        let m = registration.map ?? [:]
        func list(_ key: String) -> String {
            (m[key]?.array ?? []).compactMap(\.text).joined(separator: ", ")
        }
        let admin = m["admin"]?.bool == true ? "ADMIN (every group)" : "not an admin"
        return "groups \(list("keychain-access-groups")); executables \(list("executables")); \(admin)"
    }

    private mutating func unregister() throws(KeychainError) {
        let admin = KeychainAdmin(connection: connection)
        let s = try admin.status()
        let id = inv.positional[0]
        let registrations = (s.raw["isolation"]?.map?["registrations"]?.array ?? []).compactMap(\.map)
        let files = registrations.filter {
            $0["source"]?.text == "user"
                && $0["application-identifier"]?.text.map { $0.utf8.elementsEqual(id.utf8) } == true
        }.compactMap { $0["file"]?.text }
        var p = try presenceArguments(admin)
        defer { if p != nil { IO.wipe(&p!) } }
        var revoked = false
        do throws(KeychainError) {
            try admin.revoke(applicationIdentifier: id, keychainPassphrase: p)
            revoked = true
        } catch  where error.status == .itemNotFound || (error.status == .missingEntitlement && !s.passphraseSet) {
            // Nothing was approved (or nothing needs to be, without a passphrase): the files are all there is.
        }
        for f in files { try IO.removeFile(f) }
        guard revoked || !files.isEmpty else {
            throw KeychainError(.itemNotFound, "no registration of yours has that application-identifier")
        }
        if inv.json {
            out.line("{\"revoked\":\(revoked),\"removed\":\(JSON.encode(.array(files.map(Value.text))))}")
        } else {
            for f in files { out.line("removed \(f)") }
            if revoked { out.line("revoked the approval of \(id)") }
        }
    }

    /// The passphrase from `file` (its first line), from descriptor `fd` (its next line), or from
    /// the terminal.
    private func passphrase(file: Opt, fd: Opt? = nil, prompt: String) throws(KeychainError) -> [UInt8] {
        if let path = inv.value(file) {
            var b = try IO.readFile(path)
            defer { IO.wipe(&b) }
            var end = b.firstIndex(of: 10) ?? b.count
            if end > 0 && b[end - 1] == 13 { end -= 1 }
            // A copy of its own: `Array(b[..<end])` of the whole file (no newline) shares `b`'s
            // storage, which the wipe above zeroes in place — the passphrase became NUL bytes.
            return IO.copy(b, count: end)
        }
        if let fd, let n = inv.value(fd).flatMap({ Int32($0) }) {
            defer { DescriptorPassphrases.didRead() }
            return try IO.readLine(n)
        }
        return try Prompt.readSecret(prompt, missing: noPassphrase(file: file, fd: fd))
    }

    private func given(_ file: Opt, _ fd: Opt) -> Bool { inv.value(file) != nil || inv.value(fd) != nil }

    /// A passphrase given in a file or on a descriptor, read at once: until it is read it may sit in
    /// a pipe that a process of the user could read through `/proc/<this pid>/fd/N` once this
    /// process is dumpable again (pam_keychaind hands it over on a socket, which nobody can open
    /// that way; a pipe the user made can be), so nothing — above all no call to a daemon that may be
    /// stopped — comes first. nil when it is to be asked for.
    private func givenPassphrase(file: Opt, fd: Opt) throws(KeychainError) -> [UInt8]? {
        given(file, fd) ? try passphrase(file: file, fd: fd, prompt: "") : nil
    }

    private mutating func unlock() throws(KeychainError) {
        var early = try givenPassphrase(file: .passphraseFile, fd: .passphraseFD)
        defer { if early != nil { IO.wipe(&early!) } }
        let admin = KeychainAdmin(connection: connection)
        if early == nil, try !admin.status().passphraseSet {
            // Nothing to ask for: without a passphrase the keychain is never locked.
            if inv.json {
                out.line("{\"ok\":true,\"unlocked\":false}")
            } else {
                out.line("no passphrase set: the keychain is always unlocked")
            }
            return
        }
        if inv.has(.ifLocked), try !admin.status().locked {
            if inv.json {
                out.line("{\"ok\":true,\"unlocked\":false}")
            } else {
                out.line("not locked: nothing to unlock")
            }
            return
        }
        var p: [UInt8]
        if let early {
            p = early
        } else if inv.has(.pinentry) || (!Terminal.isAvailable && !Terminal.standardInputIsPipeOrFile) {
            try unlockThroughPinentry(admin)
            ok()
            return
        } else {
            p = try Prompt.readSecret(
                "keychain passphrase: ", missing: noPassphrase(file: .passphraseFile, fd: .passphraseFD))
        }
        defer { IO.wipe(&p) }
        try admin.unlock(passphrase: p)
        ok()
    }

    /// `unlock` where no terminal can be asked (or with --pinentry): keychainctl runs the pinentry
    /// itself — in the user's session, with its display and terminal, none of which the daemon may
    /// have — and sends each passphrase typed to keychaind as a terminal's would go (the unlock
    /// request), asking again after a wrong one (at most three times).
    private func unlockThroughPinentry(_ admin: KeychainAdmin) throws(KeychainError) {
        let configured: String?
        if case .text(let program)? = try admin.status().raw["pinentryProgram"] {
            configured = program
        } else {
            configured = nil
        }
        let prompter = Prompter(configured: configured, timeoutSeconds: 120)
        var request = PromptRequest(
            title: "Unlock the keychain",
            description:
                "keychainctl unlock asks for the keychain passphrase.\n\nType it to unlock the keychain for every app.")
        if let tty = Terminal.open() {
            request.ttyName = Terminal.name(of: tty.rawValue)
            request.ttyType = CurrentProcess.environment("TERM")
        }
        do throws(PromptFailure) {
            try prompter.ask(request) { (pin) throws(KeychainError) -> String? in
                var typed = pin.unprotectedArray
                defer { IO.wipe(&typed) }
                do throws(KeychainError) {
                    try admin.unlock(passphrase: typed)
                    return nil
                } catch  where error.status == .authFailed {
                    return error.message
                }
            }
        } catch {
            throw error.keychainError
        }
    }

    private mutating func passwd() throws(KeychainError) {
        var old = try givenPassphrase(file: .passphraseFile, fd: .passphraseFD)
        defer { if old != nil { IO.wipe(&old!) } }
        var early = try givenPassphrase(file: .newPassphraseFile, fd: .newPassphraseFD)
        defer { if early != nil { IO.wipe(&early!) } }
        let admin = KeychainAdmin(connection: connection)
        let s = try admin.status()
        if inv.has(.ifSet), !s.passphraseSet {
            if inv.json {
                out.line("{\"ok\":true,\"changed\":false}")
            } else {
                out.line("no passphrase set: nothing to change")
            }
            return
        }
        if s.passphraseSet && (inv.repeated[.approveRegistration] != nil || inv.has(.approveNone)) {
            throw .param(
                "--approve and --approve-none go with setting the first passphrase; a passphrase is set: approve a registration with `keychainctl approve NAME`"
            )
        }
        // Before any prompt for the new passphrase: what is approved is decided on what was shown.
        let choice = s.passphraseSet ? FirstApprovals() : try firstApprovals(admin, s)
        if old == nil, s.passphraseSet {
            old = try Prompt.readSecret(
                "current passphrase: ", missing: noPassphrase(file: .passphraseFile, fd: .passphraseFD))
        }
        var new: [UInt8]
        if let early {
            new = early
        } else {
            new = try Prompt.readNewSecret(
                "new passphrase: ", "retype new passphrase: ",
                missing: noPassphrase(file: .newPassphraseFile, fd: .newPassphraseFD))
        }
        defer { IO.wipe(&new) }
        guard !new.isEmpty else { throw .param("the new passphrase must not be empty") }
        let approved = try admin.changePassphrase(old: old, new: new, approving: choice.approve)
        if inv.json {
            out.line(
                "{\"ok\":true,\"approved\":\(JSON.encode(.array(approved.map(Value.text)))),\"notApproved\":\(JSON.encode(.array(choice.left.map(Value.text))))}"
            )
            return
        }
        if !s.passphraseSet { out.line("passphrase set") }
        if !approved.isEmpty { out.line("approved with it: \(approved.joined(separator: ", "))") }
        if !choice.left.isEmpty {
            out.line(
                "not approved, so no longer counting: \(choice.left.joined(separator: ", ")) (look at each and run `keychainctl approve NAME` for those you trust)"
            )
        }
    }

    /// What setting the first passphrase approves: files of the user's apps.d with the registration
    /// each was shown as (`approve`), and the files left out (`left`).
    private struct FirstApprovals {
        var approve: [(file: String, expect: Value)] = []
        var left: [String] = []
    }

    /// Decides which of the user's registrations the first passphrase approves: those named with
    /// --approve (shown as they are approved), none with --approve-none, else — on a terminal — each
    /// shown in full and approved only when the user answers y; without a terminal none. Until the
    /// passphrase is set any process of the user may have written a registration, so nothing is
    /// approved that the user did not see or name.
    private mutating func firstApprovals(_ admin: KeychainAdmin, _ s: KeychainDaemonStatus) throws(KeychainError)
        -> FirstApprovals
    {
        let registrations = (s.raw["isolation"]?.map?["registrations"]?.array ?? []).compactMap(\.map)
        let user = registrations.filter { $0["source"]?.text == "user" }
        func base(_ path: String) -> String { String(path.split(separator: "/").last ?? "") }
        var files: [String] = []
        for r in user { if let f = r["file"]?.text.map(base), !files.contains(f) { files.append(f) } }
        files.sort()
        var choice = FirstApprovals()
        func add(_ name: String, _ registration: Value) {
            choice.approve.removeAll { $0.file == name }
            choice.approve.append((name, registration))
        }
        // This keychainctl as an admin through a file of the user's apps.d only: approving nothing
        // leaves no admin once the passphrase is set.
        let own =
            s.admin
            ? user.filter { $0["application-identifier"]?.text == s.caller }.compactMap { $0["file"]?.text.map(base) }
            : []
        let ownOnly =
            !own.isEmpty
            && !registrations.contains {
                $0["source"]?.text != "user" && $0["application-identifier"]?.text == s.caller
                    && $0["admin"]?.bool == true
            }
        if let named = inv.repeated[.approveRegistration] {
            for n in named {
                let name = n.hasSuffix(".json") ? n : n + ".json"
                let registration = try admin.previewApproval(file: name)
                if !inv.json { out.line("approving \(name): \(Self.describe(registration))") }
                add(name, registration)
            }
        } else if !inv.has(.approveNone), !files.isEmpty {
            if let tty = Terminal.open() {
                defer { withExtendedLifetime(tty) {} }
                let say = { (text: String) in IO.writeAll(tty.rawValue, Array(text.utf8)) }
                say(
                    "Setting the first passphrase approves only the registrations of your apps.d you confirm now (any process of yours could have written one):\n"
                )
                for name in files {
                    let registration: Value
                    do { registration = try admin.previewApproval(file: name) } catch {
                        say("\(name): cannot be approved: \(error.message)\n")
                        continue
                    }
                    let id = registration.map?["application-identifier"]?.text ?? "?"
                    say("\(id) (\(name)): \(Self.describe(registration))\n")
                    let listed = user.first { $0["file"]?.text.map(base) == name }
                    for exe in (listed?["interpreters"]?.array ?? []).compactMap(\.text) {
                        say("  warning: \(exe) is an interpreter: this registration identifies every script it runs\n")
                    }
                    if try Prompt.confirm(tty, "approve? [y/N] ") { add(name, registration) }
                }
            } else if ownOnly {
                throw .param(
                    "this keychainctl is an admin only through \(own.joined(separator: ", ")) in your apps.d, which setting the passphrase without a terminal does not approve: look at it and pass --approve \(own[0]), or --approve-none to set the passphrase without an admin of your own"
                )
            }
        }
        choice.left = files.filter { f in !choice.approve.contains { $0.file == f } }
        if ownOnly && own.allSatisfy(choice.left.contains) && !inv.json {
            out.line(
                "this keychainctl is an admin only through \(own.joined(separator: ", ")), not approved: it is no admin once the passphrase is set"
            )
        }
        return choice
    }

    private mutating func backup() throws(KeychainError) {
        let path = inv.positional[0]
        var p =
            given(.passphraseFile, .passphraseFD)
            ? try passphrase(file: .passphraseFile, fd: .passphraseFD, prompt: "")
            : try Prompt.readNewSecret(
                "backup passphrase: ", "retype backup passphrase: ",
                missing: noPassphrase(file: .passphraseFile, fd: .passphraseFD))
        defer { IO.wipe(&p) }
        guard !p.isEmpty else { throw .param("the backup passphrase must not be empty") }
        let admin = KeychainAdmin(connection: connection)
        var presence = try presenceArguments(admin)
        defer { if presence != nil { IO.wipe(&presence!) } }
        let bytes = try admin.backup(passphrase: p, keychainPassphrase: presence)
        try IO.writeFilePrivately(path, bytes)
        if inv.json {
            out.line("{\"bytes\":\(bytes.count),\"file\":\(JSON.string(path))}")
        } else {
            out.line("wrote \(bytes.count) bytes to \(path)")
        }
    }

    private mutating func restore() throws(KeychainError) {
        let path = inv.positional[0]
        let data = try IO.readFile(path)
        var p = try passphrase(file: .passphraseFile, fd: .passphraseFD, prompt: "backup passphrase: ")
        defer { IO.wipe(&p) }
        let admin = KeychainAdmin(connection: connection)
        var presence = try presenceArguments(admin)
        defer { if presence != nil { IO.wipe(&presence!) } }
        let r = try admin.restore(passphrase: p, data: data, keychainPassphrase: presence)
        if inv.json {
            out.line("{\"restored\":\(r.restored),\"skipped\":\(r.skipped)}")
        } else {
            out.line("restored \(r.restored) item\(r.restored == 1 ? "" : "s"), skipped \(r.skipped)")
        }
    }
}
