"""Crash consistency and full disk for keychaind (run through scripts/crash-test).

Crash rounds: 8 writer connections add, update and delete items with keys of their own, recording
every acknowledged change; the daemon is SIGKILLed at a random moment; a copy of the database and WAL
gets `PRAGMA integrity_check`; the daemon restarts on the same data; every item ever written is
checked: acknowledged state present (right secret, or absent after an acknowledged delete), the one
request per writer that was in flight at the kill either fully applied or not at all, and a full
listing shows no item that was never requested and no item that fails to decrypt.

Full disk: the data directory on a small tmpfs; a ballast file takes the remaining space; adds must
fail with a clear status and message while the daemon keeps serving and every earlier item stays
readable; removing the ballast makes adds work again without a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kcwire as kw  # noqa: E402

SERVICE = "com.example.crash"


class Writer(threading.Thread):
    """One connection doing add/update/delete on its own keys until the daemon dies."""

    def __init__(self, index: int, round_no: int, socket_path: str, model: dict, rng: random.Random):
        super().__init__(daemon=True)
        self.index, self.round_no, self.socket_path = index, round_no, socket_path
        self.model = model            # key -> acknowledged secret (bytes) or None (deleted); shared, per-key owner
        self.rng = rng
        self.live: list[str] = [k for k, v in model.items() if v is not None and k.startswith(f"w{index}-")]
        self.in_flight: tuple[str, bytes | None, bytes | None] | None = None   # key, before, after
        self.acks = 0
        self.error: str | None = None
        self.counter = 0

    def run(self):
        try:
            c = kw.Conn(self.socket_path, timeout=120)
        except OSError:
            return
        try:
            while True:
                roll = self.rng.random()
                if not self.live or roll < 0.5:
                    self.counter += 1
                    key = f"w{self.index}-r{self.round_no}-k{self.counter}"
                    secret = f"{key}-v0-".encode() + os.urandom(8).hex().encode()
                    self.in_flight = (key, None, secret)
                    r = c.call("add", query=kw.item(SERVICE, key, v_Data=secret))
                    self.check(r, "add", key)
                    self.model[key] = secret
                    self.live.append(key)
                elif roll < 0.8:
                    key = self.rng.choice(self.live)
                    before = self.model[key]
                    secret = f"{key}-u{self.round_no}.{self.counter}-".encode() + os.urandom(8).hex().encode()
                    self.counter += 1
                    self.in_flight = (key, before, secret)
                    r = c.call("update", query=kw.item(SERVICE, key), attributes={"v_Data": secret})
                    self.check(r, "update", key)
                    self.model[key] = secret
                else:
                    key = self.live.pop(self.rng.randrange(len(self.live)))
                    self.in_flight = (key, self.model[key], None)
                    r = c.call("delete", query=kw.item(SERVICE, key))
                    self.check(r, "delete", key)
                    self.model[key] = None
                self.in_flight = None
                self.acks += 1
        except kw.Closed:
            pass            # the daemon was killed: `in_flight` (if any) has an unknown outcome
        except Exception as e:  # noqa: BLE001
            self.error = f"writer {self.index}: {e!r}"
        finally:
            c.close()

    def check(self, r: dict, op: str, key: str):
        if r.get("status") != kw.SUCCESS:
            raise RuntimeError(f"{op} {key} failed: {r.get('status')} {r.get('message')}")


def verify(d: kw.Daemon, model: dict, unknown: dict) -> dict:
    """Compares the restarted daemon's items with the model. Returns counts of each kind of problem."""
    problems = {"lost": 0, "resurrected": 0, "wrong_secret": 0, "half": 0, "decode": 0, "unexpected": 0}
    details: list[str] = []
    c = kw.Conn(d.socket)
    r = c.call("copy", query={"class": "genp", "svce": SERVICE, "m_Limit": "m_LimitAll",
                              "r_Attributes": True, "r_Data": True})
    stored: dict[str, bytes] = {}
    if r["status"] == kw.SUCCESS:
        for entry in r["result"]:
            stored[entry["acct"]] = entry["v_Data"]
    elif r["status"] == kw.DECODE:
        problems["decode"] += 1
        details.append(f"listing: {r.get('message')}")
    elif r["status"] != kw.NOT_FOUND:
        raise RuntimeError(f"listing failed: {r}")
    for key in set(model) | set(unknown) | set(stored):
        have = stored.get(key)
        if key in unknown:
            allowed = unknown[key]
            if have not in allowed:
                problems["half"] += 1
                details.append(f"{key}: in flight at the kill; stored {have!r} is neither state before nor after")
            else:
                model[key] = have          # adopt the outcome
            continue
        if key not in model:
            problems["unexpected"] += 1
            details.append(f"{key}: stored but never requested")
            continue
        want = model[key]
        if want is None and have is not None:
            problems["resurrected"] += 1
            details.append(f"{key}: acknowledged delete, but present")
        elif want is not None and have is None:
            problems["lost"] += 1
            details.append(f"{key}: acknowledged, but missing")
        elif want != have:
            problems["wrong_secret"] += 1
            details.append(f"{key}: acknowledged secret differs")
    # Point lookups too (the hot path that skips attributes), for a sample of live keys.
    live = [k for k, v in model.items() if v is not None]
    for key in random.sample(live, min(len(live), 50)):
        r = c.call("copy", query=kw.item(SERVICE, key, r_Data=True))
        if r["status"] != kw.SUCCESS or r.get("result") != model[key]:
            problems["wrong_secret"] += 1
            details.append(f"{key}: point lookup gave {r.get('status')}")
    c.close()
    problems["details"] = details[:20]
    return problems


def crash_rounds(args) -> dict:
    root = tempfile.mkdtemp(prefix="keychaind-crash-")
    d = kw.Daemon(args.daemon, root)
    rng = random.Random(args.seed)
    model: dict[str, bytes | None] = {}
    totals = {"rounds": 0, "acknowledged": 0, "in_flight_at_kill": 0, "applied_in_flight": 0,
              "lost": 0, "resurrected": 0, "wrong_secret": 0, "half": 0, "decode": 0, "unexpected": 0,
              "integrity_failures": 0, "writer_errors": 0}
    failures: list[str] = []
    started = time.monotonic()
    try:
        d.start()
        for round_no in range(args.rounds):
            writers = [Writer(i, round_no, d.socket, model, random.Random(rng.random())) for i in range(8)]
            for w in writers:
                w.start()
            time.sleep(rng.uniform(args.min_delay, args.max_delay))
            d.kill9()
            for w in writers:
                w.join(30)
            unknown: dict[str, set] = {}
            for w in writers:
                totals["acknowledged"] += w.acks
                if w.error:
                    totals["writer_errors"] += 1
                    failures.append(w.error)
                if w.in_flight:
                    key, before, after = w.in_flight
                    unknown[key] = {before, after}
                    totals["in_flight_at_kill"] += 1
            check = kw.integrity_check(os.path.join(d.data_dir, "keychain.db"), os.path.join(root, "scratch"))
            if check != "ok":
                totals["integrity_failures"] += 1
                failures.append(f"round {round_no}: integrity_check: {check[:300]}")
            d.start()
            before_unknown = {k: model.get(k) for k in unknown}
            p = verify(d, model, unknown)
            for k in unknown:
                if model.get(k) != before_unknown[k]:
                    totals["applied_in_flight"] += 1
            for k in ("lost", "resurrected", "wrong_secret", "half", "decode", "unexpected"):
                totals[k] += p[k]
            if p["details"]:
                failures.extend(f"round {round_no}: {x}" for x in p["details"])
            totals["rounds"] += 1
            if args.verbose:
                print(f"round {round_no}: acks so far {totals['acknowledged']}, items {sum(v is not None for v in model.values())}",
                      file=sys.stderr)
        totals["items_at_end"] = sum(v is not None for v in model.values())
        d.stop()
        final = kw.integrity_check(os.path.join(d.data_dir, "keychain.db"), os.path.join(root, "scratch"))
        if final != "ok":
            totals["integrity_failures"] += 1
            failures.append(f"after clean stop: integrity_check: {final[:300]}")
    finally:
        d.kill9()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    totals["seconds"] = round(time.monotonic() - started, 1)
    totals["failures"] = failures[:30]
    return totals


def mount_small_fs(path: str, size_kib: int) -> str:
    """A small file system at `path`: tmpfs, else a loop-mounted ext4 image. Returns what was mounted."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        raise RuntimeError("full-disk test needs root to mount a small file system")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return "tmpfs"
    image = path + ".img"
    subprocess.run(["truncate", "-s", f"{size_kib}K", image], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True, capture_output=True)
    r2 = subprocess.run(["mount", "-o", "loop", image, path], capture_output=True, text=True)
    if r2.returncode == 0:
        return "ext4 loop"
    raise RuntimeError(f"cannot mount tmpfs ({r.stderr.strip()}) nor a loop image ({r2.stderr.strip()})")


def fill(path: str) -> int:
    """Writes a ballast file until ENOSPC; returns its size."""
    n = 0
    chunk = b"\0" * 4096
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
                n += len(chunk)
        except OSError:
            pass
    return n


def full_disk(args) -> dict:
    root = tempfile.mkdtemp(prefix="keychaind-full-")
    mnt = os.path.join(root, "small")
    result: dict = {"ok": False}
    kind = None
    d = None
    try:
        try:
            kind = mount_small_fs(mnt, args.disk_kib)
        except Exception as e:  # noqa: BLE001
            result.update(skipped=str(e))
            return result
        result["filesystem"] = f"{kind}, {args.disk_kib} KiB"
        d = kw.Daemon(args.daemon, root, data_dir=os.path.join(mnt, "data"))
        d.start()
        pid = d.pid
        c = kw.Conn(d.socket)
        stored: dict[str, bytes] = {}

        def add(i: int, size: int = 2048):
            key = f"disk-{i}"
            secret = os.urandom(size // 2).hex().encode()
            r = c.call("add", query=kw.item(SERVICE, key, v_Data=secret))
            if r["status"] == kw.SUCCESS:
                stored[key] = secret
            return r

        for i in range(40):
            r = add(i)
            if r["status"] != 0:
                raise RuntimeError(f"add before filling the disk failed: {r}")
        ballast = os.path.join(mnt, "ballast")
        result["ballast_bytes"] = fill(ballast)
        statuses: dict[int, int] = {}
        messages: set[str] = set()
        failed_adds = 0
        for i in range(40, 240):
            r = add(i)
            if r["status"] != kw.SUCCESS:
                failed_adds += 1
                statuses[r["status"]] = statuses.get(r["status"], 0) + 1
                messages.add(r.get("message", "(no message)"))
                if failed_adds >= 20:
                    break
        result["adds_accepted_while_full"] = len(stored) - 40
        result["failed_adds"] = failed_adds
        result["failure_statuses"] = statuses
        result["failure_messages"] = sorted(messages)[:5]
        # Updates and deletes when full fail cleanly too (or succeed): never a crash.
        r = c.call("update", query=kw.item(SERVICE, "disk-0"), attributes={"v_Data": os.urandom(4000)})
        result["update_while_full"] = r["status"]
        if r["status"] == kw.SUCCESS:
            stored.pop("disk-0")        # its new value is random; drop it from the check
            c.call("delete", query=kw.item(SERVICE, "disk-0"))
        result["daemon_alive_while_full"] = d.alive() and d.pid == pid
        unreadable = [k for k, v in stored.items()
                      if c.call("copy", query=kw.item(SERVICE, k, r_Data=True)).get("result") != v]
        result["unreadable_while_full"] = len(unreadable)
        # A restart while the disk is still full (the user reboots): it must serve what is stored, or
        # refuse to start with the reason — never come up empty.
        c.close()
        result["stop_while_full_status"] = d.stop()
        if d.start(expect_failure=True):
            c = kw.Conn(d.socket)
            bad = [k for k, v in stored.items() if c.call("copy", query=kw.item(SERVICE, k, r_Data=True)).get("result") != v]
            result["restart_while_full"] = f"served; {len(stored) - len(bad)}/{len(stored)} items readable"
            unreadable += bad
            pid = d.pid
        else:
            result["restart_while_full"] = "refused to start: " + d.log_tail(2).strip()
            os.unlink(ballast)
            d.start()
            pid = d.pid
            c = kw.Conn(d.socket)
        if os.path.exists(ballast):
            os.unlink(ballast)
        r = add(1000)
        r2 = add(1001)
        result["add_after_freeing"] = [r["status"], r2["status"]]
        result["same_process_after_freeing"] = d.alive() and d.pid == pid
        c.close()
        rc = d.stop()
        result["clean_stop_status"] = rc
        result["integrity_check"] = kw.integrity_check(os.path.join(mnt, "data", "keychain.db"), os.path.join(root, "scratch"))
        d.start()
        c = kw.Conn(d.socket)
        missing = [k for k, v in stored.items() if c.call("copy", query=kw.item(SERVICE, k, r_Data=True)).get("result") != v]
        result["missing_after_restart"] = len(missing)
        result["items_checked"] = len(stored)
        c.close()
        d.stop()
        good_statuses = set(statuses) <= {kw.IO}
        good_messages = all("full" in m.lower() for m in messages)
        result["ok"] = (failed_adds > 0 and good_statuses and good_messages and result["daemon_alive_while_full"]
                        and not unreadable and result["add_after_freeing"] == [0, 0]
                        and result["same_process_after_freeing"] and result["integrity_check"] == "ok"
                        and not missing and rc == 0)
    finally:
        if d:
            d.kill9()
        if kind:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--min-delay", type=float, default=0.02)
    ap.add_argument("--max-delay", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--disk-kib", type=int, default=4096)
    ap.add_argument("--no-disk", action="store_true")
    ap.add_argument("--no-crash", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    out: dict = {"seed": args.seed}
    ok = True
    if not args.no_crash:
        t = crash_rounds(args)
        out["crash"] = t
        bad = sum(t[k] for k in ("lost", "resurrected", "wrong_secret", "half", "decode", "unexpected",
                                 "integrity_failures", "writer_errors"))
        ok &= bad == 0 and t["rounds"] == args.rounds
    if not args.no_disk:
        f = full_disk(args)
        out["full_disk"] = f
        ok &= f.get("ok", False) or "skipped" in f
    out["ok"] = ok
    print(json.dumps(out, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
