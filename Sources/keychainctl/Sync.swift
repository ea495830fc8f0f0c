import KeychainClient
import KeychainCore

/// `keychainctl sync ACTION`: synchronizable items through a shared folder (docs/sync.md).
enum SyncVerb {
    static let usage = "keychainctl sync status | pair [CODE] | rotate | leave [--keychain-passphrase-file FILE]"
    static let summary = "sync synchronizable items with your other devices through a shared folder"
    static let details = """
        Needs "syncFolder" in keychaind.json (a folder Syncthing or the like keeps in step between your
        devices). `sync pair` on a device already syncing (or the first one) prints a one-time code and
        answers the other device for ten minutes; `sync pair CODE` on the new device joins with it and
        waits (up to two minutes) for the answer to arrive through the folder. `sync status` lists the
        devices, the last change seen from each, conflicts resolved and files that could not be read.
        `sync rotate` makes a new sync key after a device is lost or removed: the removed device reads
        nothing written afterwards; each device you keep pairs again (`sync pair` here, `sync pair CODE`
        there). `sync leave` forgets the key on this device. All but status need the keychain
        passphrase while one is set.
        """
}

extension Command {
    mutating func sync() throws(KeychainError) {
        let action = inv.positional[0]
        var args: [String: Value] = [:]
        switch action {
        case "status":
            guard inv.positional.count == 1 else { throw .param("sync status takes no CODE") }
            args["action"] = .text("status")
        case "pair":
            if inv.positional.count == 2 {
                args["action"] = .text("join")
                args["code"] = .text(inv.positional[1])
            } else {
                args["action"] = .text("invite")
            }
        case "rotate", "leave":
            guard inv.positional.count == 1 else { throw .param("sync \(action) takes no CODE") }
            args["action"] = .text(action)
        default:
            throw .param("unknown sync action \"\(action)\" (status, pair, rotate, leave)")
        }
        let connection = self.connection
        let result: Value?
        if action == "status" {
            result = try connection.call(.sync, arguments: args)
        } else {
            result = try withPresence { (presence) throws(KeychainError) -> Value? in
                try connection.call(.sync, arguments: args.merging(presence) { a, _ in a })
            }
        }
        let m = result?.map ?? [:]
        if inv.json {
            out.line(JSON.encode(.map(m.isEmpty ? ["ok": .bool(true)] : m)))
            return
        }
        switch action {
        case "pair" where m["code"] != nil:
            out.line("pairing code: \(m["code"]?.text ?? "")")
            out.line("On the other device run:  keychainctl sync pair \(m["code"]?.text ?? "")")
            out.line("(valid for \((m["expiresIn"]?.int ?? 600) / 60) minutes, for one device)")
        case "pair":
            out.line("paired with device \(m["pairedWith"]?.text ?? "?") (sync key \(m["keyEpoch"]?.int ?? 0))")
        case "rotate":
            out.line("new sync key \(m["keyEpoch"]?.int ?? 0): pair each device you keep again")
        case "leave":
            out.line("this device left sync")
        default:
            statusLines(m)
        }
    }

    private mutating func statusLines(_ m: [String: Value]) {
        out.line(pad("folder") + (m["folder"]?.text ?? ""))
        out.line(pad("this device") + (m["device"]?.text ?? ""))
        if m["paired"]?.bool != true && m["locked"]?.bool == true {
            out.line(pad("paired") + "not known while the keychain is locked (the sync key is a keychain item)")
        } else if m["repairNeeded"]?.bool == true {
            out.line(
                pad("paired")
                    + "no: the sync key predates device signatures; pair this device again (keychainctl sync pair)")
        } else if m["paired"]?.bool != true {
            out.line(pad("paired") + "no (keychainctl sync pair)")
        } else {
            out.line(pad("sync key") + String(m["keyEpoch"]?.int ?? 0))
        }
        if let newer = m["newerKeyEpoch"]?.int {
            out.line(pad("newer key") + "\(newer) in the folder: this device was left out; pair it again")
        }
        if m["locked"]?.bool == true { out.line(pad("state") + "locked: sync resumes when unlocked") }
        out.line(
            pad("items")
                + "\(m["items"]?.int ?? 0) synchronizable (\(m["tombstones"]?.int ?? 0) deletions kept, \(m["tombstonesCollected"]?.int ?? 0) dropped)"
        )
        out.line(pad("conflicts resolved") + String(m["conflictsResolved"]?.int ?? 0))
        if let t = m["lastCycle"]?.date { out.line(pad("last sync") + Human.text(.date(t), key: "mdat")) }
        if let e = m["lastError"]?.text { out.line(pad("last error") + e) }
        for d in m["devices"]?.array ?? [] {
            guard let f = d.map else { continue }
            var line = (f["device"]?.text ?? "?") + (f["this"]?.bool == true ? " (this device)" : "")
            if f["paired"]?.bool == false { line += " (not paired: its files are not read)" }
            if let t = f["lastChange"]?.date { line += ", last change " + Human.text(.date(t), key: "mdat") }
            out.line(pad("device") + line)
        }
        for p in m["problems"]?.array ?? [] { out.line(pad("not read") + (p.text ?? "")) }
    }
}
