import Foundation
import KeychainSystem
import KeychainTestSupport
import Testing

/// POSIX ACLs as keychaind reads them: the `system.posix_acl_access` attribute parsed without
/// libacl, and write access decided as the kernel decides it.
@Suite struct AccessControlListTests {
    typealias E = AccessControlList.Entry

    /// `setfacl -m u:1000:rwx,g:27:r-x` on a 0755 file: owner rwx, named user rwx, group r-x, named
    /// group r-x, mask rwx, other r-x.
    static let typical = AccessControlList(entries: [
        E(tag: .owner, permissions: 7), E(tag: .user, permissions: 7, id: 1000), E(tag: .owningGroup, permissions: 5),
        E(tag: .group, permissions: 5, id: 27), E(tag: .mask, permissions: 7), E(tag: .other, permissions: 5),
    ])

    @Test func theAttributeFormatRoundTripsAndMalformedValuesAreRefused() throws {
        let bytes = Self.typical.attribute
        #expect(bytes.count == 4 + 6 * 8)
        #expect(Array(bytes[0..<12]) == [2, 0, 0, 0, 1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff])
        #expect(AccessControlList(attribute: bytes) == Self.typical)
        #expect(AccessControlList(attribute: [1, 0, 0, 0]) == nil, "version 1")
        #expect(AccessControlList(attribute: Array(bytes.dropLast())) == nil, "a cut entry")
        #expect(AccessControlList(attribute: [2, 0, 0, 0, 0x40, 0, 7, 0, 0, 0, 0, 0]) == nil, "an unknown tag")
        #expect(AccessControlList(attribute: []) == nil)
    }

    @Test func writeIsGrantedAsTheKernelGrantsIt() {
        let acl = Self.typical
        func writes(_ uid: UInt32, _ groups: Set<UInt32>, _ list: AccessControlList = Self.typical) -> Bool {
            list.grantsWrite(uid: uid, groups: groups, ownerUID: 0, ownerGID: 0)
        }
        #expect(writes(1000, [1000]), "the named user")
        #expect(!writes(1001, [1001]), "another user: other is r-x")
        #expect(!writes(1001, [27]), "a member of the named group, which has r-x")
        #expect(acl.grantsWrite(uid: 5, groups: [], ownerUID: 5, ownerGID: 0), "the owner")
        let masked = AccessControlList(
            entries: acl.entries.map { $0.tag == .mask ? E(tag: .mask, permissions: 5) : $0 })
        #expect(!writes(1000, [1000], masked), "the mask takes write from the named user")
        let byGroup = AccessControlList(entries: [
            E(tag: .owner, permissions: 7), E(tag: .owningGroup, permissions: 5),
            E(tag: .group, permissions: 7, id: 27),
            E(tag: .mask, permissions: 7), E(tag: .other, permissions: 7),
        ])
        #expect(writes(1001, [1001, 27], byGroup), "a member of a named group with rwx")
        #expect(!writes(1001, [0], byGroup), "a member of the owning group (r-x) is not other")
        #expect(writes(1001, [1001], byGroup), "other has rwx")
        let namedUserDenied = AccessControlList(entries: [
            E(tag: .owner, permissions: 7), E(tag: .user, permissions: 5, id: 1000),
            E(tag: .owningGroup, permissions: 5),
            E(tag: .group, permissions: 7, id: 27), E(tag: .mask, permissions: 7), E(tag: .other, permissions: 5),
        ])
        #expect(!writes(1000, [27], namedUserDenied), "a named user entry decides before the groups")
    }

    @Test func anACLIsReadFromTheFileAndNoneIsNil() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-acl")
        let file = temporary.appending("f")
        #expect(FileManager.default.createFile(atPath: file, contents: Data()))
        #expect(try FileSystem.accessControlList(file) == nil)
        let set = Process()
        set.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        set.arguments = [
            "-c", "import os, sys; os.setxattr(sys.argv[1], 'system.posix_acl_access', bytes.fromhex(sys.argv[2]))",
            file,
            Self.typical.attribute.map { String(format: "%02x", $0) }.joined(),
        ]
        try set.run()
        set.waitUntilExit()
        #expect(set.terminationStatus == 0)
        #expect(try FileSystem.accessControlList(file) == Self.typical)
        #expect(try FileSystem.status(file).permissions & 0o070 == 0o070, "the group bits show the mask")
        #expect(throws: Errno.self) { try FileSystem.accessControlList(temporary.appending("missing")) }
    }
}
