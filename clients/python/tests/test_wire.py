"""Unit tests of framing and encoding: no daemon needed."""

from __future__ import annotations

import datetime as dt
import math
import re
import struct

import cbor2
import pytest

from keychaind import KeychainError, errSecDecode, errSecParam, wire
from keychaind.constants import (STATUS_NAMES, SecCopyErrorMessageString, kSecAttrAccount, kSecClass,
                                 kSecClassGenericPassword, kSecMatchLimit, kSecMatchLimitAll, kSecReturnData,
                                 kSecValueData, kSecAttrService, status_name)

from conftest import REPO


# -- a reference encoder with the daemon's rules (Sources/KeychainCore/CBOR.swift) ---------------------

def _head(major: int, n: int) -> bytes:
    m = major << 5
    if n < 24:
        return bytes([m | n])
    if n <= 0xFF:
        return bytes([m | 24, n])
    if n <= 0xFFFF:
        return bytes([m | 25]) + n.to_bytes(2, "big")
    if n <= 0xFFFFFFFF:
        return bytes([m | 26]) + n.to_bytes(4, "big")
    return bytes([m | 27]) + n.to_bytes(8, "big")


def swift_encode(v) -> bytes:
    """What CBOR.encode in the daemon produces for the same value."""
    if v is True:
        return b"\xf5"
    if v is False:
        return b"\xf4"
    if v is None:
        return b"\xf6"
    if isinstance(v, int):
        return _head(0, v) if v >= 0 else _head(1, -1 - v)
    if isinstance(v, float):
        return b"\xfb" + struct.pack(">d", v)
    if isinstance(v, bytes):
        return _head(2, len(v)) + v
    if isinstance(v, str):
        b = v.encode()
        return _head(3, len(b)) + b
    if isinstance(v, list):
        return _head(4, len(v)) + b"".join(swift_encode(e) for e in v)
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: (len(k.encode()), k.encode()))
        return _head(5, len(v)) + b"".join(swift_encode(k) + swift_encode(v[k]) for k in keys)
    if isinstance(v, dt.datetime):
        t = v.timestamp()
        return b"\xc1" + (swift_encode(int(t)) if t == math.floor(t) and abs(t) < 9e15 else swift_encode(t))
    raise TypeError(type(v))


EXAMPLE_QUERY = {"class": "genp", "svce": "com.example.app", "acct": "alice"}
# The frames of protocol.md §16, in the order they appear there.
EXAMPLE_MESSAGES = [
    {"v": 1, "id": 1, "op": "add", "query": dict(EXAMPLE_QUERY, v_Data=b"s3cret")},
    {"id": 1, "status": 0},
    {"v": 1, "id": 2, "op": "copy", "query": dict(EXAMPLE_QUERY, r_Data=True)},
    {"id": 2, "status": 0, "result": b"s3cret"},
    {"id": 3, "status": -25299, "message": "duplicate item"},
]


def doc_frames() -> list[bytes]:
    """The hex frames of docs/protocol.md §16."""
    text = (REPO / "docs" / "protocol.md").read_text()
    section = text[text.index("## 16. Worked example"):text.index("## 17.")]
    frames = []
    for block in re.findall(r"```\n(.*?)```", section, re.S):
        lines = block.split("\n\n", 1)
        if len(lines) != 2:
            continue
        hexed = re.sub(r"\s+", "", lines[1])
        frames.append(bytes.fromhex(hexed))
    return frames


def test_worked_example_in_protocol_md_matches_the_encoders():
    frames = doc_frames()
    assert len(frames) == len(EXAMPLE_MESSAGES)
    for message, frame in zip(EXAMPLE_MESSAGES, frames):
        body = swift_encode(message)
        assert frame == struct.pack(">I", len(body)) + body, message
        assert wire.decode(frame[4:]) == message
        assert wire.frame(wire.encode(message)) == frame  # the client sends the same bytes


def test_encode_request_is_deterministic_like_the_daemon():
    q = {kSecClass: kSecClassGenericPassword, kSecAttrService: "svc", kSecAttrAccount: "ü" * 30,
         kSecValueData: bytes(range(256)) * 3, kSecMatchLimit: kSecMatchLimitAll, kSecReturnData: True,
         "crtr": 0xFFFFFFFF, "neg": -(1 << 63), "list": [1, -1, 24, 255, 256, 65536, 1 << 40, "x", b"y", None],
         "cdat": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)}
    frame = wire.encode_request(7, "copy", q)
    expected = swift_encode({"v": 1, "id": 7, "op": "copy", "query": q})
    assert frame == struct.pack(">I", len(expected)) + expected


def test_map_keys_sorted_length_first_then_bytewise():
    body = wire.encode({"status": 0, "id": 1, "message": "m", "result": 1, "b": 0, "a": 0})
    keys = list(cbor2.loads(body).keys())
    assert keys == ["a", "b", "id", "result", "status", "message"]


def test_dates_are_tag_1():
    assert wire.encode(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)) == bytes.fromhex("c11a65920080")
    # naive datetimes are taken as UTC
    assert wire.encode(dt.datetime(2024, 1, 1)) == bytes.fromhex("c11a65920080")
    half = wire.encode(dt.datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=dt.timezone.utc))
    assert half[0] == 0xC1 and cbor2.loads(half).timestamp() == 1704067200.5
    # the daemon's forms decode: tag 1 over an integer and over a double
    assert wire.decode(bytes.fromhex("c11a65920080")) == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert wire.decode(swift_encode(dt.datetime(2024, 1, 1, 0, 0, 0, 250000, tzinfo=dt.timezone.utc))).microsecond == 250000


@pytest.mark.parametrize("bad", [
    1 << 63, -(1 << 63) - 1, {1: "x"}, {b"k": 1}, {"k": {1, 2}}, {"k": object()}, {"k": 1.5j},
    {"k": [0] * 4097}, {str(i): 0 for i in range(4097)},
])
def test_values_outside_the_subset_are_refused_before_sending(bad):
    with pytest.raises(KeychainError) as e:
        wire.encode({"query": bad} if not isinstance(bad, dict) else bad)
    assert e.value.status == errSecParam


def test_depth_limit():
    ok = {}
    cur = ok
    for _ in range(15):  # 16 levels in all
        cur["n"] = {}
        cur = cur["n"]
    wire.encode(ok)
    cur["n"] = {}
    with pytest.raises(KeychainError):
        wire.encode(ok)


def test_bytearray_and_memoryview_are_byte_strings():
    assert wire.encode({"v_Data": bytearray(b"ab")}) == wire.encode({"v_Data": b"ab"})
    assert wire.encode({"v_Data": memoryview(b"ab")}) == wire.encode({"v_Data": b"ab"})


def test_frame_reader_cuts_frames_and_keeps_partials():
    frames = [wire.frame(wire.encode({"id": i, "status": 0})) for i in range(1, 4)]
    stream = b"".join(frames)
    r = wire.FrameReader()
    got = []
    for i in range(0, len(stream), 3):  # arbitrary chunking
        r.feed(stream[i:i + 3])
        got.extend(wire.decode(b)["id"] for b in r.frames())
    assert got == [1, 2, 3]
    assert r.pending == 0
    r.feed(frames[0][:5])
    assert list(r.frames()) == [] and r.pending == 5


def test_frame_reader_refuses_oversize_headers():
    r = wire.FrameReader(max_bytes=16)
    r.feed(struct.pack(">I", 17))
    with pytest.raises(KeychainError) as e:
        list(r.frames())
    assert e.value.status == errSecDecode


def test_empty_body_frame():
    r = wire.FrameReader()
    r.feed(b"\0\0\0\0")
    assert list(r.frames()) == [b""]


def test_response_parsing():
    r = wire.Response({"id": 5, "status": -25300, "message": "not found"})
    assert (r.id, r.status, r.message, r.has_result) == (5, -25300, "not found", False)
    err = r.error()
    assert isinstance(err, KeychainError) and err.status == -25300 and err.message == "not found"
    assert wire.Response({"id": 1, "status": 0, "result": None}).has_result
    for bad in ([], {"status": 0}, {"id": 1}, {"id": "1", "status": 0}, {"id": 1, "status": True},
                {"id": 1, "status": 1 << 31}, {"id": 1, "status": -(1 << 31) - 1}):
        with pytest.raises(KeychainError):
            wire.Response(bad)


def test_the_decoder_reads_what_the_daemon_writes():
    when = dt.datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=dt.timezone.utc)
    value = {"id": 7, "status": -25300, "result": [{"v_Data": b"\x00\xff", "labl": "é", "cdat": when,
                                                    "crtr": 4294967295, "invi": True, "n": None}],
             "neg": -(1 << 63), "f": 1.5}
    assert wire.decode(cbor2.dumps(value, canonical=True, datetime_as_timestamp=True)) == value
    assert wire.decode(bytes.fromhex("c11a65920080")) == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert wire.decode(bytes.fromhex("f93e00")) == 1.5  # a half float
    assert wire.decode(bytes.fromhex("1800")) == 0     # a head longer than needed


# A broken or impostor daemon (any process of the user can serve the socket): what it sends must end
# as errSecDecode, quickly and without allocating for what it claims, never as another exception.
@pytest.mark.parametrize("hex_body, why", [
    ("c2590708" + "ff" * 1800, "tag 2"),           # a bignum (its text form raised ValueError)
    # bignum map keys, all hashing alike, made decoding quadratic (200 KB took 4 s): refused at the first
    ("a2c24a0100000000000000000000c24a0200000000000000000000", "tag 2"),
    ("c482213903e8", "tag 4"),                        # decimal fraction
    ("d81e820102", "tag 30"),                         # rational
    ("d824" + "6161", "tag 36"),                      # MIME (ran the e-mail parser)
    ("c16161", "tag 1 over something"),
    ("c11bffffffffffffffff", "beyond 64 signed bits"),
    ("c1fb7ff0000000000000", "out of range"),         # tag 1 over infinity
    ("9f01ff", "indefinite"),
    ("5f41ff", "indefinite"),
    ("bf6161 01ff", "indefinite"),
    ("0100", "bytes after the data item"),
    ("a2616101616102", "twice"),
    ("a10101", "not text"),
    ("f7", "simple value"),
    ("f820", "simple value"),
    ("1bffffffffffffffff", "beyond 64 signed bits"),
    ("3bffffffffffffffff", "beyond 64 signed bits"),
    ("62c328", "not UTF-8"),
    ("9b0fffffffffffffff", "longer than the body"),   # an array of 2^60 elements, claimed
    ("bb0fffffffffffffff", "longer than the body"),
    ("5b0fffffffffffffff", "longer than the body"),
    ("81" * 70 + "01", "deeper"),
    ("", "ends inside"),
    ("1a0001", "ends inside a head"),
    ("fc", "reserved"),
])
def test_the_decoder_refuses_everything_outside_the_protocols_subset(hex_body, why):
    with pytest.raises(KeychainError) as e:
        wire.decode(bytes.fromhex(hex_body.replace(" ", "")))
    assert e.value.status == errSecDecode and why in e.value.message, e.value.message



def test_socket_path_resolution():
    assert wire.socket_path({"KEYCHAIND_SOCKET": "/x/y.sock", "XDG_RUNTIME_DIR": "/r"}) == "/x/y.sock"
    assert wire.socket_path({"KEYCHAIND_SOCKET": "", "XDG_RUNTIME_DIR": "/r"}) == "/r/keychaind/keychaind.sock"
    assert wire.socket_path({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/keychaind/keychaind.sock"
    import os
    assert wire.socket_path({}) == f"/run/user/{os.getuid()}/keychaind/keychaind.sock"
    assert wire.socket_path({"XDG_RUNTIME_DIR": ""}) == f"/run/user/{os.getuid()}/keychaind/keychaind.sock"


def test_keychain_error():
    e = KeychainError(-25300)
    assert e.status == -25300 and e.name == "errSecItemNotFound"
    assert e.message == SecCopyErrorMessageString(-25300)
    assert str(e).startswith("errSecItemNotFound (-25300): ")
    assert KeychainError(-1234, "x").name == "OSStatus -1234"
    assert status_name(-34018) == "errSecMissingEntitlement"
    assert STATUS_NAMES[0] == "errSecSuccess"


def test_constants_are_the_wire_strings():
    import keychaind as k
    assert (k.kSecClass, k.kSecClassGenericPassword, k.kSecAttrService, k.kSecAttrAccount) == ("class", "genp", "svce", "acct")
    assert (k.kSecMatchLimitOne, k.kSecMatchLimitAll, k.kSecAttrSynchronizableAny) == ("m_LimitOne", "m_LimitAll", "syna")
    assert (k.kSecReturnData, k.kSecReturnAttributes, k.kSecReturnPersistentRef) == ("r_Data", "r_Attributes", "r_PersistentRef")
    assert (k.kSecValueData, k.kSecValuePersistentRef) == ("v_Data", "v_PersistentRef")
    assert k.kSecAttrAccessibleAfterFirstUnlock == "ck" and k.kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly == "cku"
    assert (k.errSecDuplicateItem, k.errSecItemNotFound, k.errSecMissingEntitlement, k.errSecParam) == (-25299, -25300, -34018, -50)


def test_a_connections_first_bytes_carry_a_pidfd_of_the_sender():
    # keychaind on a kernel without SO_PEERPIDFD answers bytes that arrived before it pinned the
    # connecting process only when they come with their writer's pidfd (protocol.md §1).
    import array
    import os
    import socket

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        data = bytes(wire.encode_request(1, "status"))
        wire.send_identifying(a, data)
        fds = array.array("i")
        got, ancillary, _flags, _addr = b.recvmsg(len(data), socket.CMSG_SPACE(4 * fds.itemsize))
        assert got == data
        passed = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                passed.extend(fds)
        assert len(passed) == 1, ancillary
        try:
            link = os.readlink(f"/proc/self/fd/{passed[0]}")
            assert link == "anon_inode:[pidfd]" or link.startswith("pidfd:"), link
            with open(f"/proc/self/fdinfo/{passed[0]}") as info:
                pids = [line.split()[1] for line in info if line.startswith("Pid:")]
            assert pids == [str(os.getpid())]
        finally:
            os.close(passed[0])
