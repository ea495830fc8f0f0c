import Testing

@testable import KeychainCrypto

/// The uniqueness digest is stored in every row: however it is computed (from arrays, from bytes in
/// place, framed into one buffer), it must be the keyed BLAKE2b of the same framed parts, or items
/// written before could no longer be found.
@Suite struct BlindIndexTests {
    @Test("the uniqueness digest is the framed hash of group, service, account and the sync byte")
    func uniqueKeyIsTheFramedHash() throws {
        var rng = SystemRandomNumberGenerator()
        let keyBytes = (0..<BlindIndexer.keyLength).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let indexer = try keyBytes.withUnsafeBytes { BlindIndexer(key: try SecureBytes(copying: $0)) }
        let samples: [([UInt8], [UInt8], [UInt8])] = [
            ([], [], []), (Array("TEAM.app".utf8), Array("svc".utf8), Array("acct".utf8)),
            (Array("g".utf8), [], Array(repeating: 0x78, count: 300)),
            (Array("TEAM.shared".utf8), Array("ünï".utf8), [0, 1, 2, 0xFF]),
            ((0..<200).map { _ in .random(in: 0...255, using: &rng) }, Array("s".utf8), Array("a".utf8)),
        ]
        for (group, service, account) in samples {
            for sync in [false, true] {
                let expected = keyBytes.withUnsafeBytes {
                    KeyedHash.hash(
                        key: $0, domain: BlindIndexer.Column.uniqueKey.rawValue,
                        parts: [group, service, account, [sync ? 1 : 0]], length: BlindIndexer.uniqueKeyLength)
                }
                let fromArrays = indexer.uniqueKey(
                    accessGroup: group, service: service, account: account, synchronizable: sync)
                var inPlace = [UInt8](repeating: 0, count: BlindIndexer.uniqueKeyLength)
                group.withUnsafeBytes { g in
                    service.withUnsafeBytes { s in
                        account.withUnsafeBytes { a in
                            inPlace.withUnsafeMutableBytes {
                                indexer.uniqueKey(
                                    accessGroup: g, service: s, account: a, synchronizable: sync, into: $0)
                            }
                        }
                    }
                }
                #expect(fromArrays == expected, "\(group.count)/\(service.count)/\(account.count) \(sync)")
                #expect(inPlace == expected, "\(group.count)/\(service.count)/\(account.count) \(sync)")
            }
        }
    }
}
