#!/usr/bin/env python3
"""User-space instructions per request from two callgrind runs of the same server.

    instructions.py SMALL.out N_SMALL LARGE.out N_LARGE [--components]

Both runs start the server the same way and differ only in how many requests they served, so the
difference divided by the difference in requests is the cost of one request, whatever starting up
and stopping cost. Prints one JSON object: {"per_request": …} and, with --components, the same
difference split by the kind of work each function does (its own instructions, not its callees'),
so the parts add up to the whole.
"""
import json
import re
import shutil
import subprocess
import sys

# First match wins. Each pattern is tried on "file:function [object]" as callgrind_annotate prints it
# (Swift names demangled when `swift demangle` is there).
COMPONENTS = [
    ("crypto (libsodium: AEAD opens, BLAKE2b blind index)", r"libsodium|blake2b|generichash|KeyedHash|BlindIndexer|AEAD\.|ItemCodec|PreparedGCMKey|Sodium\.|Vault\."),
    ("SQLite", r"libsqlite3|SQLite\.swift"),
    ("reference counting, exclusivity", r"swift_retain|swift_release|swift_bridgeObjectRe|RefCounts|isUniquelyReferenced|swift_beginAccess|swift_endAccess|AccessSet|swift_unknownObject"),
    ("allocation", r"malloc|[^a-z]free|_int_free|_int_malloc|swift_allocObject|swift_slowAlloc|swift_slowDealloc|swift_dealloc|_swift_release_dealloc|dealloc|deinit|arrayDestroy|allocate\(|tcache|arena\.c|cfree"),
    ("Swift strings, dictionaries, hashing", r"Hasher|hash\(into|_hash\(|Dictionary|Set<|_findStringSwitchCase|String|_allASCII|_stringCompare|UTF8|Unicode"),
    ("request decode and response framing (CBOR)", r"CBOR\.|Messages\.swift|Frame\.swift|Value\.swift|Request\.|Response\.|FrameBuffer|of Value|RequestShape|QueryTemplate|Operation\.named"),
    ("Swift runtime (value copies, generic metadata, casts)", r"Metadata|swift::|swift_getGeneric|getCache|swift_dynamicCast|swift_conformsTo|protocol witness|initializeWithCopy|initializeWithTake|assignWithCopy|destroy for|outlined copy|outlined consume|outlined retain|outlined release|swift_array|instantiateConcreteType|_HashTable|ContiguousArrayBuffer|Array\.|UnsafeMutablePointer|swift_once|storeEnumTag|thunk for"),
    ("locks and atomics", r"pthread_mutex|pthread_rwlock|Locked\.swift|Locks\.swift|Lock\.|TransitionLock|lll_|futex|Synchronization|Atomic"),
    ("system call wrappers (user side)", r"recvmsg|sendmsg|sendto|__libc_send|__libc_recv|\bsend\b|\brecv\b|poll|syscall|kc_[a-z_]+|clock_gettime|__vdso|vdso|asynccancel|Socket\.|FileDescriptor|MonotonicClock|ProcessHandle"),
    ("memset, memcpy (wiping, copying)", r"memset|memcpy|memmove|memcmp|bzero|sodium_memzero|SecretBytes|Zeroing"),
    ("connection, identity, policy (KeychainDaemon)", r"KeychainDaemon/|AccessPolicy|Connection\.|ConnectionPeer|RequestHandler|Registrar|AppEntry|Caller"),
    ("query and item service (KeychainItems)", r"KeychainItems/|ParsedQuery|ItemService|RowFilter|rowFilter|Attribute"),
    ("store and point-lookup cache (KeychainStore)", r"KeychainStore/|StoredItem|StoreReader|ItemStore|PointLookup"),
]


def functions(path):
    """(name, self instructions) for every function in a callgrind output file."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", "--auto=no", path],
                         capture_output=True, text=True, check=True).stdout
    if shutil.which("swift"):
        out = subprocess.run(["swift", "demangle", "--simplified"], input=out, capture_output=True,
                             text=True).stdout or out
    total, rows = None, []
    listing = False
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([\s\d.]+%\)\s+)?PROGRAM TOTALS", line)
        if m:
            total = int(m.group(1).replace(",", ""))
            continue
        if "file:function" in line:
            listing = True
            continue
        if not listing:
            continue
        m = re.match(r"\s*([\d,]+)\s+(?:\([\s\d.]+%\)\s+)?(.*)$", line)
        if m:
            rows.append((m.group(2), int(m.group(1).replace(",", ""))))
    return total, rows


def classify(rows):
    parts = {name: 0 for name, _ in COMPONENTS}
    parts["other (a C server's own code)"] = 0
    for name, count in rows:
        for component, pattern in COMPONENTS:
            if re.search(pattern, name):
                parts[component] += count
                break
        else:
            parts["other (a C server's own code)"] += count
    return parts


def main():
    args = sys.argv[1:]
    with_components = "--components" in args
    args = [a for a in args if a != "--components"]
    small, n_small, large, n_large = args[0], int(args[1]), args[2], int(args[3])
    t_small, rows_small = functions(small)
    t_large, rows_large = functions(large)
    n = n_large - n_small
    result = {"per_request": round((t_large - t_small) / n)}
    if with_components:
        a, b = classify(rows_small), classify(rows_large)
        result["components"] = {k: round((b[k] - a[k]) / n) for k in b}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
