import KeychainCore
import KeychainCrypto
import KeychainItems

// keychaind-bench --rotation: the cost of a passphrase change, in process (no daemon), on keychains
// of the given sizes. A change verifies the old passphrase and derives the new master key (two
// Argon2id runs at the profile's costs), re-wraps the item key of every item of the rotated classes,
// commits, and checkpoints the WAL. The Argon2id part is measured on its own in the same run, so the
// rest — what the number of items costs — can be read off.
#if canImport(Glibc)
    import Glibc
#endif

/// Peak resident memory since the last `resetPeakMemory` (VmHWM), in MiB.
func peakMemoryMiB() -> Double? { statusField("VmHWM:").map { $0 / 1024 } }

/// Starts a new peak-RSS measurement (Linux: writing 5 to clear_refs resets VmHWM).
func resetPeakMemory() {
    guard let f = fopen("/proc/self/clear_refs", "w") else { return }
    fputs("5", f)
    fclose(f)
}

func statusField(_ name: String) -> Double? {
    guard let f = fopen("/proc/self/status", "r") else { return nil }
    defer { fclose(f) }
    var line = [CChar](repeating: 0, count: 256)
    while fgets(&line, 256, f) != nil {
        let s = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if s.hasPrefix(name) { return s.split(separator: " ").compactMap { Double($0) }.first }
    }
    return nil
}

func passphrase(_ s: String) -> SecureBytes {
    do {
        guard let p = try PasswordHash.passphrase(Array(s.utf8)) else { die("empty passphrase") }
        return p
    } catch { die("\(error)") }
}

/// The rotated classes the items are spread over (akpu would need a passphrase before the fill).
let rotatedCodes = ["ak", "ck", "aku", "cku"]

func runRotationBench(sizes: [Int], rounds: Int, profile: KDFProfile, json: Bool) -> Never {
    let caller = Caller(accessGroups: ["BENCH.rotation"])
    var template = Array("/tmp/keychaind-rotation.XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { die("mkdtemp failed") }
    let root = String(cString: made)

    struct Keychain {
        let items: Int
        let directory: String
        let service: ItemService
        var firstSet = 0.0
        var changes: [Double] = []
        var peak = 0.0
    }
    var keychains: [Keychain] = []
    for size in sizes {
        let directory = root + "/items-\(size)"
        let service: ItemService
        do { service = try ItemService(directory: directory, kdfProfile: profile) } catch { die("\(error)") }
        let t0 = now()
        let writers = 8
        join(
            (0..<writers).map { w in
                { @Sendable in
                    var i = w
                    while i < size {
                        let attributes: [String: Value] = [
                            "class": .text("genp"), "svce": .text("bench.rotation"), "acct": .text("user\(i)"),
                            "pdmn": .text(rotatedCodes[i % rotatedCodes.count]),
                            "v_Data": .bytes(Array(repeating: 7, count: 32)),
                        ]
                        do { _ = try service.add(attributes, caller: caller) } catch { die("fill: \(error)") }
                        i += writers
                    }
                }
            })
        if !json { print("\(size) items: filled in \(fmt(now() - t0)) s") }
        var keychain = Keychain(items: size, directory: directory, service: service)
        do {
            let t1 = now()
            try service.changePassphrase(old: nil, new: passphrase("p0"))
            keychain.firstSet = now() - t1
        } catch { die("\(error)") }
        keychains.append(keychain)
    }

    // Rounds alternate over the sizes, with one Argon2id derivation at the profile's costs on its own
    // per round (a change runs two: the old passphrase checked, the new master key derived).
    var argon: [Double] = []
    for r in 0..<rounds {
        let t0 = now()
        do { _ = try PasswordHash.derive(passphrase("bench"), .fresh(profile)) } catch { die("\(error)") }
        argon.append(now() - t0)
        for k in keychains.indices {
            resetPeakMemory()
            let t1 = now()
            do {
                try keychains[k].service.changePassphrase(old: passphrase("p\(r)"), new: passphrase("p\(r + 1)"))
            } catch { die("\(error)") }
            keychains[k].changes.append(now() - t1)
            keychains[k].peak = max(keychains[k].peak, peakMemoryMiB() ?? 0)
        }
    }
    for k in keychains {
        do { guard try k.service.itemCount() == k.items else { die("the item count changed") } } catch {
            die("\(error)")
        }
        k.service.close()
        _ = system("rm -rf '\(k.directory)'")
    }
    rmdir(root)

    let argonMedian = median(argon)
    // With a 0-item keychain in the run, its change (Argon2id, keyring, commit, checkpoint) is the
    // baseline the others are compared with: what remains is what the items cost.
    let baseline = keychains.first { $0.items == 0 }.map { median($0.changes) }
    if json {
        let entries = keychains.map { k in
            "{\"items\": \(k.items), \"first_set_s\": \(fmt3(k.firstSet)), \"change_median_s\": \(fmt3(median(k.changes))), "
                + "\"change_minus_argon2id_s\": \(fmt3(median(k.changes) - 2 * argonMedian)), "
                + "\"change_minus_empty_s\": \(baseline.map { fmt3(median(k.changes) - $0) } ?? "null"), \"peak_rss_mib\": \(fmt(k.peak))}"
        }
        print(
            "{\"profile\": \"\(profile.rawValue)\", \"rounds\": \(rounds), \"argon2id_s\": \(fmt3(argonMedian)), "
                + "\"sizes\": [\(entries.joined(separator: ", "))]}")
    } else {
        print(
            "passphrase change, \(profile.rawValue) Argon2id, median of \(rounds) changes per size (rounds alternate sizes)"
        )
        print("Argon2id alone, one derivation: \(fmt(argonMedian * 1000)) ms (a change runs two)")
        for k in keychains {
            let m = median(k.changes)
            let items = baseline.map { ", minus the 0-item change \(fmt((m - $0) * 1000)) ms" } ?? ""
            print(
                "\(k.items) items: change \(fmt(m * 1000)) ms, minus 2 × Argon2id \(fmt((m - 2 * argonMedian) * 1000)) ms\(items) "
                    + "(runs: \(k.changes.map { fmt($0 * 1000) }.joined(separator: ", ")) ms); first set \(fmt(k.firstSet * 1000)) ms; "
                    + "peak RSS during a change \(fmt(k.peak)) MiB")
        }
    }
    exit(0)
}

func fmt3(_ v: Double) -> String { "\((v * 1000).rounded() / 1000)" }
