import Foundation
import Glibc
import KeychainSystem
import KeychainTestSupport
import Testing

/// `DirectoryWatch` is what makes keychaind read an `apps.d` again when a registration appears,
/// changes or goes: every such change must be seen, including in a directory made after the watch
/// began, and nothing else should wake it. The kernel queues a change before the call that made it
/// returns, so each look (`hasChanged`) is exact: no waiting, no timing.
@Suite struct DirectoryWatchTests {
    private func write(_ path: String, _ text: String) throws {
        let file = try FileDescriptor.open(path, [.writeOnly, .create, .truncate])
        try file.writeAll(Array(text.utf8))
        file.close()
    }

    /// A temporary apps.d, watched for `*.json` files (the temporary directory removes itself).
    private func watchedAppsDirectory() throws -> (TemporaryDirectory, String, DirectoryWatch) {
        let temporary = try TemporaryDirectory(prefix: "kc-watch")
        let apps = temporary.appending("apps.d")
        try FileSystem.makeDirectory(apps)
        return (temporary, apps, try DirectoryWatch(directories: [apps]) { $0.hasSuffix(".json") })
    }

    @Test func writingRenamingAndRemovingARegistrationAreChanges() throws {
        let (temporary, apps, watch) = try watchedAppsDirectory()
        #expect(try !watch.hasChanged(), "nothing happened yet")

        try write(apps + "/a.json", "{}")
        #expect(try watch.hasChanged(), "a file written and closed")
        #expect(try !watch.hasChanged(), "each change is reported once")

        try write(apps + "/notes.txt", "not a registration")
        try write(apps + "/b.json.tmp-1", "{}")
        #expect(try !watch.hasChanged(), "files that do not matter")
        try FileSystem.rename(apps + "/b.json.tmp-1", to: apps + "/b.json")
        #expect(try watch.hasChanged(), "renamed into place (keychainctl register writes that way)")

        try FileSystem.setPermissions(apps + "/b.json", 0o644)
        #expect(try watch.hasChanged(), "its mode changed (which decides whether a system file counts)")
        try FileSystem.setPermissions(apps, 0o755)
        #expect(try watch.hasChanged(), "the directory's own mode changed (the same for a system directory)")
        try FileSystem.unlink(apps + "/a.json")
        #expect(try watch.hasChanged(), "removed")
        try FileSystem.rename(apps + "/b.json", to: temporary.appending("b.json"))
        #expect(try watch.hasChanged(), "renamed away")
    }

    @Test func aFileCreatedEmptyIsAChangeOnlyOnceItsWriterClosesIt() throws {
        let (temporary, apps, watch) = try watchedAppsDirectory()
        defer { withExtendedLifetime(temporary) {} }  // the directory lives until the test ends
        let file = try FileDescriptor.open(apps + "/half.json", [.writeOnly, .create, .exclusive])
        #expect(try !watch.hasChanged(), "created empty: a reader would find nothing to read yet")
        try file.writeAll(Array("{".utf8))
        #expect(try !watch.hasChanged(), "still being written")
        file.close()
        #expect(try watch.hasChanged(), "closed")

        // A link made in place is whole at once.
        #expect(symlink(apps + "/half.json", apps + "/link.json") == 0)
        #expect(try watch.hasChanged(), "a symbolic link")
        try FileSystem.link(apps + "/half.json", to: apps + "/hard.json")
        #expect(try watch.hasChanged(), "a hard link")
    }

    @Test func aDirectoryThatDoesNotExistYetIsWatchedOnceItIsMade() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-watch")
        let config = temporary.appending("config")
        let apps = config + "/keychaind/apps.d"
        let watch = try DirectoryWatch(directories: [apps]) { $0.hasSuffix(".json") }

        try FileSystem.makeDirectory(config)
        #expect(try !watch.hasChanged(), "a directory above it appeared, not it")
        try FileSystem.makeDirectory(config + "/other")
        #expect(try !watch.hasChanged(), "a directory beside the path")
        try FileSystem.makeDirectory(config + "/keychaind")
        #expect(try !watch.hasChanged())
        try FileSystem.makeDirectory(apps)
        #expect(try watch.hasChanged(), "apps.d appeared (a reader lists it now)")
        try write(apps + "/late.json", "{}")
        #expect(try watch.hasChanged(), "a file in the directory made after the watch began")

        // Gone, and made again: followed both ways.
        try FileSystem.unlink(apps + "/late.json")
        #expect(try watch.hasChanged())
        #expect(rmdir(apps) == 0)
        #expect(try watch.hasChanged(), "apps.d went")
        try write(config + "/keychaind/stray.json", "{}")
        #expect(try !watch.hasChanged(), "a registration-like file above apps.d is not in it")
        try FileSystem.makeDirectory(apps)
        #expect(try watch.hasChanged())
        try write(apps + "/again.json", "{}")
        #expect(try watch.hasChanged(), "watched again once made again")
    }

    @Test func aWaitEndsWithEventsOrWithStop() throws {
        let (temporary, apps, watch) = try watchedAppsDirectory()
        defer { withExtendedLifetime(temporary) {} }  // the directory lives until the test ends
        try write(apps + "/a.json", "{}")
        #expect(try watch.waitForEvents(), "events already queued end the wait at once")
        #expect(try watch.waitForEvents(), "and are still there: waiting takes none")
        #expect(try watch.hasChanged())

        // A thread blocked in the wait (nothing is queued) is woken by stop, and its loop ends.
        let ended = Locked<Bool?>(nil)
        let done = Condition()
        let lock = Lock()
        let waiter = Thread {
            let result = (try? watch.waitForEvents()) ?? true
            lock.withLock {
                ended.withLock { $0 = result }
                done.broadcast()
            }
        }
        waiter.start()
        watch.stop()
        lock.withLock {
            while ended.withLock({ $0 }) == nil { lock.wait(done) }
        }
        #expect(ended.withLock { $0 } == false, "stopped: the watching thread's loop ends")
        #expect(try !watch.waitForEvents(), "and any later wait returns at once")
    }

    @Test func aDirectoryRenamedIntoPlaceIsWatchedAndItsFilesAreAChange() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-watch")
        let apps = temporary.appending("apps.d")
        let watch = try DirectoryWatch(directories: [apps]) { $0.hasSuffix(".json") }
        try FileSystem.makeDirectory(temporary.appending("staging"))
        try write(temporary.appending("staging/a.json"), "{}")
        #expect(try !watch.hasChanged(), "made beside it")
        try FileSystem.rename(temporary.appending("staging"), to: apps)
        #expect(try watch.hasChanged(), "renamed into place, with its registration")
        try write(apps + "/b.json", "{}")
        #expect(try watch.hasChanged(), "watched from then on")
        try FileSystem.rename(apps, to: temporary.appending("gone"))
        #expect(try watch.hasChanged(), "renamed away")
        try write(temporary.appending("gone/c.json"), "{}")
        #expect(try !watch.hasChanged(), "the renamed directory is no longer it")
    }

    @Test func targetsSharingADirectoryOrReachedThroughALinkKeepEveryRole() throws {
        let temporary = try TemporaryDirectory(prefix: "kc-watch")
        let config = temporary.appending("config")
        try FileSystem.makeDirectory(config)
        #expect(symlink(config, temporary.appending("link")) == 0)
        // One target is the other's parent, a third reaches the parent through a symbolic link, and
        // a fourth does not exist yet below it: one directory, every role.
        let watch = try DirectoryWatch(
            directories: [config, temporary.appending("link"), config + "/apps.d"]
        ) { $0.hasSuffix(".json") }
        try write(config + "/top.json", "{}")
        #expect(try watch.hasChanged(), "a file in the parent target")
        try FileSystem.makeDirectory(config + "/apps.d")
        #expect(try watch.hasChanged(), "the child target appeared")
        try write(config + "/apps.d/a.json", "{}")
        #expect(try watch.hasChanged(), "a file in the child target")
        try write(config + "/again.json", "{}")
        #expect(try watch.hasChanged(), "the parent is still watched as a target")
    }
}
