"""Integration tests against the real keychaind (see conftest.py; they skip only when no binary exists)."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import struct
import threading
import time
import uuid

import pytest

from keychaind import *  # noqa: F403 — the kSec… names, as SecItem code reads
from keychaind import KeychainError, wire

from conftest import APP1, APP1_GROUPS, APP2, SHARED

UUID_RE = re.compile(r"[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}")


def item(service, account="alice", **extra):
    q = {kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecAttrAccount: account}
    q.update(extra)
    return q


def status_of(fn, *args):
    try:
        fn(*args)
    except KeychainError as e:
        return e.status
    return 0


# -- the four calls ------------------------------------------------------------------------------------

def test_add_copy_update_delete_round_trip(client, service):
    assert client.add(item(service, **{kSecValueData: b"s3cret"})) is None
    assert client.copy(item(service, **{kSecReturnData: True})) == b"s3cret"
    client.update(item(service), {kSecValueData: b"n3w", kSecAttrLabel: "label"})
    got = client.copy(item(service, **{kSecReturnData: True, kSecReturnAttributes: True}))
    assert got[kSecValueData] == b"n3w" and got[kSecAttrLabel] == "label"
    client.delete(item(service))
    assert status_of(client.copy, item(service, **{kSecReturnData: True})) == errSecItemNotFound


def test_internet_password_round_trip(client, service):
    server = service + ".example"  # a server of this test's own
    login = {kSecClass: kSecClassInternetPassword, kSecAttrServer: server, kSecAttrAccount: "alice",
             kSecAttrProtocol: kSecAttrProtocolHTTPS, kSecAttrPort: 8443, kSecAttrPath: "/login",
             kSecAttrAuthenticationType: kSecAttrAuthenticationTypeHTMLForm}
    client.add({**login, kSecValueData: b"s3cret"})
    with pytest.raises(KeychainError) as e:
        client.add({**login, kSecValueData: b"again"})
    assert e.value.status == errSecDuplicateItem
    # Another port or protocol: another item, not a duplicate.
    client.add({**login, kSecAttrPort: 443, kSecValueData: b"other-port"})
    client.add({**login, kSecAttrProtocol: kSecAttrProtocolHTTP, kSecValueData: b"other-protocol"})
    got = client.copy({**login, kSecReturnData: True, kSecReturnAttributes: True})
    assert got[kSecValueData] == b"s3cret"
    assert got[kSecAttrServer] == server and got[kSecAttrPort] == 8443 and got[kSecAttrProtocol] == "htps"
    assert got[kSecAttrAuthenticationType] == "form" and got[kSecAttrPath] == "/login"
    # A generic-password query never returns it.
    assert status_of(client.copy, {kSecClass: kSecClassGenericPassword, kSecAttrAccount: "alice",
                                   kSecAttrService: server}) == errSecItemNotFound
    client.update(login, {kSecValueData: b"n3w"})
    assert client.copy({**login, kSecReturnData: True}) == b"n3w"
    client.delete(login)
    assert status_of(client.copy, login) == errSecItemNotFound
    everything = client.copy({kSecClass: kSecClassInternetPassword, kSecAttrServer: server,
                              kSecMatchLimit: kSecMatchLimitAll, kSecReturnData: True})
    assert sorted(everything) == [b"other-port", b"other-protocol"]


def test_copy_without_return_keys_sends_no_result(client, service):
    client.add(item(service, **{kSecValueData: b"x"}))
    assert client.copy(item(service)) is None  # success: something matched
    with pytest.raises(KeychainError) as e:
        client.copy(item(service, account="nobody"))
    assert e.value.status == errSecItemNotFound


def test_duplicate_item(client, service):
    client.add(item(service, **{kSecValueData: b"one"}))
    with pytest.raises(KeychainError) as e:
        client.add(item(service, **{kSecValueData: b"two", kSecAttrLabel: "other label", kSecAttrAccessible: "ck"}))
    assert e.value.status == errSecDuplicateItem and e.value.message
    assert client.copy(item(service, **{kSecReturnData: True})) == b"one"


def test_not_found_for_copy_update_delete(client, service):
    for fn, args in ((client.copy, (item(service, **{kSecReturnData: True}),)),
                     (client.update, (item(service), {kSecValueData: b"x"})),
                     (client.delete, (item(service),))):
        with pytest.raises(KeychainError) as e:
            fn(*args)
        assert e.value.status == errSecItemNotFound, fn.__name__


def test_update_and_delete_match_every_item(client, service):
    for account in ("a", "b", "c"):
        client.add(item(service, account, **{kSecValueData: account.encode()}))
    client.update({kSecClass: kSecClassGenericPassword, kSecAttrService: service}, {kSecAttrComment: "all"})
    got = client.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: service,
                       kSecReturnAttributes: True, kSecMatchLimit: kSecMatchLimitAll})
    assert sorted(a[kSecAttrAccount] for a in got) == ["a", "b", "c"]
    assert all(a[kSecAttrComment] == "all" for a in got)
    client.delete({kSecClass: kSecClassGenericPassword, kSecAttrService: service})
    assert status_of(client.copy, {kSecClass: kSecClassGenericPassword, kSecAttrService: service}) == errSecItemNotFound


def test_update_to_an_existing_key_is_a_duplicate_and_changes_nothing(client, service):
    client.add(item(service, "a", **{kSecValueData: b"a"}))
    client.add(item(service, "b", **{kSecValueData: b"b"}))
    with pytest.raises(KeychainError) as e:
        client.update(item(service, "a"), {kSecAttrAccount: "b"})
    assert e.value.status == errSecDuplicateItem
    assert client.copy(item(service, "a", **{kSecReturnData: True})) == b"a"


# -- result shapes (protocol.md §9) ---------------------------------------------------------------------

def test_result_shapes(client, service):
    added = client.add(item(service, **{kSecValueData: b"pw", kSecAttrLabel: "L", kSecAttrGeneric: b"\x00\x01",
                                        kSecAttrCreator: 0x41424344, kSecAttrIsInvisible: True,
                                        kSecReturnAttributes: True}))
    # add with r_Attributes: the new item's attributes, with the defaults the daemon chose
    assert isinstance(added, dict)
    assert added[kSecAttrAccessGroup] == APP1_GROUPS[0]
    assert added[kSecAttrAccessible] == kSecAttrAccessibleWhenUnlocked
    assert added[kSecAttrSynchronizable] is False
    assert added[kSecAttrService] == service and added[kSecAttrAccount] == "alice"
    assert added[kSecAttrLabel] == "L" and added[kSecAttrGeneric] == b"\x00\x01"
    assert added[kSecAttrCreator] == 0x41424344 and added[kSecAttrIsInvisible] is True
    assert isinstance(added[kSecAttrCreationDate], dt.datetime) and isinstance(added[kSecAttrModificationDate], dt.datetime)
    assert abs(added[kSecAttrCreationDate].timestamp() - time.time()) < 60
    assert kSecValueData not in added and kSecClass not in added

    data = client.copy(item(service, **{kSecReturnData: True}))
    assert data == b"pw"
    ref = client.copy(item(service, **{kSecReturnPersistentRef: True}))
    assert isinstance(ref, bytes) and ref
    attrs = client.copy(item(service, **{kSecReturnAttributes: True}))
    assert isinstance(attrs, dict) and attrs[kSecAttrLabel] == "L" and kSecValueData not in attrs
    both = client.copy(item(service, **{kSecReturnAttributes: True, kSecReturnData: True}))
    assert both[kSecValueData] == b"pw" and both[kSecAttrLabel] == "L"
    data_ref = client.copy(item(service, **{kSecReturnData: True, kSecReturnPersistentRef: True}))
    assert data_ref[kSecValueData] == b"pw" and data_ref[kSecValuePersistentRef] == ref
    three = client.copy(item(service, **{kSecReturnData: True, kSecReturnAttributes: True, kSecReturnPersistentRef: True}))
    assert three[kSecValueData] == b"pw" and three[kSecValuePersistentRef] == ref and three[kSecAttrAccount] == "alice"
    assert client.copy(item(service, **{kSecReturnData: False})) is None  # false = not asked

    # limits: one → a value; all → an array even for one hit; N → at most N
    assert client.copy(item(service, **{kSecReturnData: True, kSecMatchLimit: kSecMatchLimitOne})) == b"pw"
    assert client.copy(item(service, **{kSecReturnData: True, kSecMatchLimit: 1})) == b"pw"
    assert client.copy(item(service, **{kSecReturnData: True, kSecMatchLimit: kSecMatchLimitAll})) == [b"pw"]
    for account in ("b", "c"):
        client.add(item(service, account, **{kSecValueData: account.encode()}))
    by_service = {kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecReturnData: True}
    assert sorted(client.copy(dict(by_service, **{kSecMatchLimit: kSecMatchLimitAll}))) == [b"b", b"c", b"pw"]
    two = client.copy(dict(by_service, **{kSecMatchLimit: 2}))
    assert isinstance(two, list) and len(two) == 2
    assert client.copy(dict(by_service, **{kSecMatchLimit: kSecMatchLimitAll, kSecReturnData: False})) is None


def test_item_without_data_reads_back_empty(client, service):
    client.add(item(service))
    assert client.copy(item(service, **{kSecReturnData: True})) == b""


def test_persistent_reference_finds_the_item(client, service):
    ref = client.add(item(service, **{kSecValueData: b"pr", kSecReturnPersistentRef: True}))
    assert isinstance(ref, bytes)
    assert client.copy({kSecValuePersistentRef: ref, kSecReturnData: True}) == b"pr"
    assert client.copy({kSecClass: kSecClassGenericPassword, kSecValuePersistentRef: ref,
                        kSecReturnAttributes: True})[kSecAttrService] == service
    client.delete({kSecClass: kSecClassGenericPassword, kSecValuePersistentRef: ref})
    assert status_of(client.copy, {kSecValuePersistentRef: ref, kSecReturnData: True}) == errSecItemNotFound


def test_implicit_sync_filter(client, service):
    client.add(item(service, **{kSecValueData: b"synced", kSecAttrSynchronizable: True}))
    assert status_of(client.copy, item(service)) == errSecItemNotFound
    assert client.copy(item(service, **{kSecAttrSynchronizable: kSecAttrSynchronizableAny, kSecReturnData: True})) == b"synced"
    client.add(item(service, **{kSecValueData: b"local"}))  # differs only in sync: coexists
    assert client.copy(item(service, **{kSecReturnData: True})) == b"local"
    assert sorted(client.copy(item(service, **{kSecAttrSynchronizable: kSecAttrSynchronizableAny, kSecReturnData: True,
                                               kSecMatchLimit: kSecMatchLimitAll}))) == [b"local", b"synced"]
    client.delete(item(service, **{kSecAttrSynchronizable: kSecAttrSynchronizableAny}))
    assert status_of(client.copy, item(service, **{kSecAttrSynchronizable: kSecAttrSynchronizableAny})) == errSecItemNotFound


def test_matching_is_case_sensitive(client, service):
    client.add(item(service, "Alice", **{kSecValueData: b"x"}))
    assert status_of(client.copy, item(service, "alice", **{kSecMatchCaseInsensitive: True})) == errSecItemNotFound


def test_unicode_and_binary_round_trip(client, service):
    secret = bytes(range(256)) * 64
    client.add(item(service, "ünïcødé ✓", **{kSecValueData: secret, kSecAttrLabel: "日本語"}))
    got = client.copy(item(service, "ünïcødé ✓", **{kSecReturnData: True, kSecReturnAttributes: True}))
    assert got[kSecValueData] == secret and got[kSecAttrLabel] == "日本語"


# -- parameter errors (the connection stays usable) ------------------------------------------------------

@pytest.mark.parametrize("query, statuses", [
    ({kSecAttrService: "x"}, {errSecParam}),                                           # no class
    ({kSecClass: "cert"}, {errSecNoSuchClass}),                                       # not served
    ({kSecClass: kSecClassGenericPassword, kSecAttrService: 5}, {errSecParam}),
    ({kSecClass: kSecClassGenericPassword, kSecValueData: "text, not bytes"}, {errSecParam}),
    ({kSecClass: kSecClassGenericPassword, kSecAttrAccessible: "zz"}, {errSecParam}),
    ({kSecClass: kSecClassGenericPassword, "srvr": "x"}, {errSecNoSuchAttr}),
    ({kSecClass: kSecClassGenericPassword, "bogus_key": 1}, {errSecParam}),
    ({kSecClass: kSecClassGenericPassword, kSecMatchLimit: kSecMatchLimitAll}, {errSecParam}),
    ({kSecClass: kSecClassGenericPassword, kSecAttrSynchronizable: kSecAttrSynchronizableAny}, {errSecParam}),
])
def test_bad_add_parameters(client, query, statuses):
    with pytest.raises(KeychainError) as e:
        client.add(query)
    assert e.value.status in statuses, e.value
    assert client.status()["caller"] == APP1  # the connection is still fine


def test_bad_limits_and_misplaced_keys(client, service):
    client.add(item(service))
    for bad in ("m_LimitSome", 0, -1, True):
        assert status_of(client.copy, item(service, **{kSecMatchLimit: bad})) == errSecParam, bad
    assert status_of(client.copy, item(service, **{kSecReturnData: "yes"})) == errSecParam
    assert status_of(client.update, item(service, **{kSecReturnData: True}), {kSecAttrLabel: "x"}) == errSecParam
    assert status_of(client.update, item(service, **{kSecMatchLimit: kSecMatchLimitAll}), {kSecAttrLabel: "x"}) == errSecParam
    assert status_of(client.update, item(service), {kSecClass: kSecClassGenericPassword}) == errSecNoSuchAttr
    assert status_of(client.delete, item(service, **{kSecMatchLimit: kSecMatchLimitOne})) == errSecParam
    assert client.copy(item(service)) is None  # still there, connection fine
    # kSecMatchLimitAll says what a delete does anyway: accepted, as macOS does (wrappers add it).
    client.delete(item(service, **{kSecMatchLimit: kSecMatchLimitAll}))
    assert status_of(client.copy, item(service)) == errSecItemNotFound


# -- access groups and callers ---------------------------------------------------------------------------

def test_status_names_the_caller(client):
    s = client.status()
    assert s["caller"] == APP1 and s["admin"] is False
    assert isinstance(s["version"], str) and isinstance(s["items"], int) and isinstance(s["locked"], bool)


def test_status_lists_the_callers_groups(client):
    # protocol.md §11: status.groups, the caller's access groups in order (first = default for add)
    assert client.status().get("groups") == APP1_GROUPS


def test_default_group_is_the_first(client):
    assert client.default_group() == APP1_GROUPS[0]


def test_missing_entitlement_for_a_group_the_app_lacks(client, service):
    other = APP2  # app2's private group, which app1 does not have
    for fn, args in ((client.add, (item(service, **{kSecAttrAccessGroup: other, kSecValueData: b"x"}),)),
                     (client.copy, (item(service, **{kSecAttrAccessGroup: other}),)),
                     (client.delete, (item(service, **{kSecAttrAccessGroup: other}),))):
        with pytest.raises(KeychainError) as e:
            fn(*args)
        assert e.value.status == errSecMissingEntitlement, fn.__name__
    client.add(item(service, **{kSecValueData: b"x"}))
    with pytest.raises(KeychainError) as e:
        client.update(item(service), {kSecAttrAccessGroup: other})
    assert e.value.status == errSecMissingEntitlement
    client.update(item(service), {kSecAttrAccessGroup: SHARED})  # moving between own groups is fine
    assert client.copy(item(service, **{kSecReturnAttributes: True}))[kSecAttrAccessGroup] == SHARED


APP2_CODE = """
import json, sys
from keychaind import *
c = Client()
out = {}
def attempt(name, fn, *args):
    try:
        r = fn(*args)
        out[name] = ["ok", r.decode() if isinstance(r, bytes) else r]
    except KeychainError as e:
        out[name] = ["error", e.status]
service = %(service)r
q = {kSecClass: kSecClassGenericPassword, kSecAttrService: service, kSecAttrAccount: "alice", kSecReturnData: True}
attempt("shared", c.copy, dict(q, agrp=%(shared)r))
attempt("any", c.copy, q)
attempt("private", c.copy, dict(q, agrp=%(app1)r))
attempt("device", c.device_id, %(shared)r)
attempt("status", lambda: c.status()["caller"])
print(json.dumps(out))
"""


def test_apps_sharing_a_group_share_items_and_nothing_else(daemon, client, service):
    client.add(item(service, **{kSecValueData: b"shared-secret", kSecAttrAccessGroup: SHARED}))
    client.add(item(service, **{kSecValueData: b"private-secret"}))  # app1's first group
    device = client.device_id(SHARED)
    out = daemon.run_python(daemon.app2_python, APP2_CODE % {"service": service, "shared": SHARED, "app1": APP1})
    assert out["status"] == ["ok", APP2]
    assert out["shared"] == ["ok", "shared-secret"]
    assert out["any"] == ["ok", "shared-secret"]  # app1's private item does not exist for app2
    assert out["private"] == ["error", errSecMissingEntitlement]
    assert out["device"] == ["ok", device]


def test_unregistered_executable_is_missing_entitlement(daemon, service):
    out = daemon.run_python(daemon.stranger_python, APP2_CODE % {"service": service, "shared": SHARED, "app1": APP1})
    assert out["any"] == ["error", errSecMissingEntitlement]
    assert out["device"] == ["error", errSecMissingEntitlement]
    assert out["status"] == ["ok", None]  # status answers, and says the caller is unknown


def test_device_id_is_stable_and_well_formed(daemon, client):
    first = client.device_id()
    assert UUID_RE.fullmatch(first)
    assert client.device_id() == first
    with daemon.client() as other:
        assert other.device_id() == first
    attrs = client.copy({kSecClass: kSecClassGenericPassword, kSecAttrService: "com.keychaind.device-identifier",
                         kSecAttrAccount: "device-id", kSecAttrAccessGroup: APP1_GROUPS[0], kSecReturnAttributes: True})
    assert attrs[kSecAttrAccessible] == kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly


def test_device_id_race_between_threads_yields_one_value(daemon):
    group = SHARED
    results, errors = [], []

    def worker():
        try:
            with daemon.client() as c:
                results.append(c.device_id(group))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(set(results)) == 1 and len(results) == 12


# -- pipelining and concurrency --------------------------------------------------------------------------

def test_pipelined_requests_on_one_connection(daemon, service):
    with daemon.raw() as raw:
        frames = [wire.encode_request(1, "add", item(service, **{kSecValueData: b"p"}))]
        frames += [wire.encode_request(i, "copy", item(service, **{kSecReturnData: True})) for i in range(2, 52)]
        raw.send(b"".join(frames))  # all at once, before reading anything
        responses = [raw.recv() for _ in range(51)]
    assert [r["id"] for r in responses] == list(range(1, 52))
    assert all(r["status"] == 0 for r in responses)
    assert all(r["result"] == b"p" for r in responses[1:])


def test_a_forked_child_connects_on_its_own_and_leaves_the_parents_connection(client, service):
    """The daemon identifies the process that connected: after fork() the child must open its own
    connection, and nothing it does may cut the parent's."""
    client.add(item(service, **{kSecValueData: b"parent"}))
    parent_connection = client._conn
    pid = os.fork()
    if pid == 0:  # the child: no pytest here; the exit status says what went wrong
        code = 0
        try:
            inherited = client._conn
            client.close()  # must not shut the parent's socket down
            if inherited is not None:
                code = 10
            elif client.copy(item(service, **{kSecReturnData: True})) != b"parent":
                code = 11
            else:
                client.update(item(service), {kSecValueData: b"child"})
                if client._conn is None or client._conn.pid != os.getpid():
                    code = 12
            client.close()
        except BaseException:  # noqa: BLE001
            code = 13
        os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not finish within 60 s")
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert client.copy(item(service, **{kSecReturnData: True})) == b"child"
    assert client._conn is parent_connection and parent_connection.usable, "the parent kept its connection"


def test_one_client_many_threads(client, service):
    client.add(item(service, **{kSecValueData: b"t"}))
    errors = []

    def worker():
        try:
            for _ in range(25):
                assert client.copy(item(service, **{kSecReturnData: True})) == b"t"
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_concurrent_adds_of_one_item_exactly_one_wins(daemon, service):
    outcomes = []

    def worker(n):
        with daemon.client() as c:
            outcomes.append(status_of(c.add, item(service, **{kSecValueData: str(n).encode()})))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == [errSecDuplicateItem] * 9 + [0]


# -- bad input on the wire (protocol.md §13) --------------------------------------------------------------

def _still_serving(daemon):
    with daemon.client() as c:
        assert c.status()["caller"] == APP1


def test_unknown_op_is_param_and_the_connection_stays_usable(daemon):
    with daemon.raw() as raw:
        raw.request(7, "frobnicate", {})
        r = raw.recv()
        assert r["id"] == 7 and r["status"] == errSecParam and isinstance(r["message"], str) and "result" not in r
        raw.request(8, "status")
        r = raw.recv()
        assert r["id"] == 8 and r["status"] == 0 and r["result"]["caller"] == APP1


@pytest.mark.parametrize("message, expected_id", [
    ({"id": 9, "op": "status"}, 9),                                    # no v
    ({"v": 2, "id": 9, "op": "status"}, 9),                            # unsupported version
    ({"v": 1, "op": "status"}, 0),                                     # no id
    ({"v": 1, "id": -4, "op": "status"}, 0),                           # negative id
    ({"v": 1, "id": 9}, 9),                                            # no op
    ({"v": 1, "id": 9, "op": 5}, 9),                                   # op not text
    ({"v": 1, "id": 9, "op": "copy"}, 9),                              # no query
    ({"v": 1, "id": 9, "op": "copy", "query": [1]}, 9),                # query not a map
    ({"v": 1, "id": 9, "op": "update", "query": {"class": "genp"}}, 9),  # no attributes
    ({"v": 1, "id": 9, "op": "add", "query": {"class": "genp"}, "attributes": {}}, 9),
    ({"v": 1, "id": 9, "op": "copy", "query": {"class": "genp"}, "extra": 1}, 9),
])
def test_well_framed_bad_requests_get_param_and_keep_the_connection(daemon, message, expected_id):
    with daemon.raw() as raw:
        raw.send(wire.frame(wire.encode(message)))
        r = raw.recv()
        assert r is not None, "connection closed"
        assert r["status"] == errSecParam and r["id"] == expected_id, r
        raw.request(10, "status")
        r = raw.recv()
        assert r["id"] == 10 and r["status"] == 0


def _expect_error_then_close(raw, status=errSecParam):
    responses = raw.recv_until_eof()
    assert len(responses) == 1, responses
    assert responses[0]["id"] == 0 and responses[0]["status"] == status and responses[0]["message"]


def test_oversize_frame_header_closes_the_connection(daemon):
    with daemon.raw() as raw:
        raw.send(struct.pack(">I", (1 << 20) + 1))
        _expect_error_then_close(raw)
    _still_serving(daemon)


def test_frame_of_exactly_the_limit_is_read(daemon):
    limit = 1 << 20
    pad = limit - 64
    while True:  # grow the byte string until the body is exactly maxFrameBytes
        body = wire.encode({"v": 1, "id": 3, "op": "status", "pad": b"\0" * pad})
        if len(body) == limit:
            break
        pad += limit - len(body)
    with daemon.raw() as raw:
        raw.send(wire.frame(body))
        r = raw.recv()
        assert r is not None and r["id"] == 3  # read and answered, not refused as oversize


@pytest.mark.parametrize("body", [
    wire.encode([1, 2, 3]),          # CBOR, not a map
    wire.encode(42),
    b"\xff\x00",                     # not CBOR
    b"",                             # empty body
    bytes.fromhex("bf6176 01ff"),    # indefinite-length map
    bytes.fromhex("a2 6169 01 6169 02"),  # duplicate key
    bytes.fromhex("a1 01 02"),       # integer map key
    bytes.fromhex("a1 6176 c2 41 01"),  # tag 2 (bignum)
    wire.encode({"v": 1}) + b"\x00",  # trailing byte
])
def test_non_map_or_invalid_cbor_closes_the_connection(daemon, body):
    with daemon.raw() as raw:
        raw.send(wire.frame(body))
        _expect_error_then_close(raw)
    _still_serving(daemon)


def test_nesting_deeper_than_16_closes_the_connection(daemon):
    deep = {"v": 1, "id": 1, "op": "copy"}
    cur = {}
    deep["query"] = cur
    for _ in range(15):  # query is level 2; this makes 17 levels
        cur["n"] = {}
        cur = cur["n"]
    import cbor2
    with daemon.raw() as raw:
        raw.send(wire.frame(cbor2.dumps(deep)))
        _expect_error_then_close(raw)
    _still_serving(daemon)


def test_truncated_frame_then_half_close(daemon):
    with daemon.raw() as raw:
        frame = wire.encode_request(1, "status")
        raw.send(frame[:len(frame) - 3])
        raw.sock.shutdown(socket.SHUT_WR)
        responses = raw.recv_until_eof()  # nobody to answer: the daemon just closes
        assert all(r["status"] != 0 for r in responses)
    _still_serving(daemon)


def test_responses_before_a_bad_frame_are_still_written(daemon):
    with daemon.raw() as raw:
        raw.send(wire.encode_request(1, "status") + wire.frame(wire.encode([1])))
        responses = raw.recv_until_eof()
    assert [(r["id"], r["status"]) for r in responses] == [(1, 0), (0, errSecParam)]


def test_a_stalled_client_does_not_block_others(daemon):
    with daemon.raw() as stalled:
        stalled.send(struct.pack(">I", 100) + b"\xa1")  # half a frame, then nothing
        # answered while the stalled connection is still open: a daemon waiting on it would not answer
        _still_serving(daemon)
