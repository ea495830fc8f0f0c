"""Stdlib-only raw-frame client for the reliability campaign (docs/protocol.md §2–§4).

The campaign scripts must run on a clean machine without the Python client's venv, and must control
exactly what is on the wire (half frames, garbage, kill timing), so they speak raw frames through this
minimal CBOR codec instead of clients/python.
"""

from __future__ import annotations

import os
import sys
import socket
import struct
import subprocess
import time

# Status codes (docs/protocol.md §12).
SUCCESS, IO, PARAM, ALLOCATE, NOT_AVAILABLE = 0, -36, -50, -108, -25291
DUPLICATE, NOT_FOUND, DECODE, MISSING_ENTITLEMENT = -25299, -25300, -26275, -34018


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for info, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | info]) + struct.pack(fmt, n)
    raise ValueError("integer too large")


def encode(v) -> bytes:
    if v is True:
        return b"\xf5"
    if v is False:
        return b"\xf4"
    if v is None:
        return b"\xf6"
    if isinstance(v, int):
        return _head(0, v) if v >= 0 else _head(1, -1 - v)
    if isinstance(v, bytes):
        return _head(2, len(v)) + v
    if isinstance(v, str):
        b = v.encode()
        return _head(3, len(b)) + b
    if isinstance(v, float):
        return b"\xfb" + struct.pack(">d", v)
    if isinstance(v, (list, tuple)):
        return _head(4, len(v)) + b"".join(encode(x) for x in v)
    if isinstance(v, dict):
        return _head(5, len(v)) + b"".join(encode(k) + encode(x) for k, x in v.items())
    raise TypeError(type(v))


def decode(b: bytes):
    value, end = _decode(b, 0)
    if end != len(b):
        raise ValueError("trailing bytes")
    return value


def _decode(b: bytes, i: int):
    head = b[i]
    major, info = head >> 5, head & 0x1F
    i += 1
    if major == 7:
        if info == 20:
            return False, i
        if info == 21:
            return True, i
        if info == 22:
            return None, i
        if info == 25:
            return struct.unpack(">e", b[i:i + 2])[0], i + 2
        if info == 26:
            return struct.unpack(">f", b[i:i + 4])[0], i + 4
        if info == 27:
            return struct.unpack(">d", b[i:i + 8])[0], i + 8
        raise ValueError(f"simple {info}")
    if info < 24:
        n = info
    else:
        size = {24: 1, 25: 2, 26: 4, 27: 8}[info]
        n = int.from_bytes(b[i:i + size], "big")
        i += size
    if major == 0:
        return n, i
    if major == 1:
        return -1 - n, i
    if major == 2:
        return bytes(b[i:i + n]), i + n
    if major == 3:
        return b[i:i + n].decode(), i + n
    if major == 4:
        out = []
        for _ in range(n):
            x, i = _decode(b, i)
            out.append(x)
        return out, i
    if major == 5:
        out = {}
        for _ in range(n):
            k, i = _decode(b, i)
            out[k], i = _decode(b, i)
        return out, i
    if major == 6:
        return _decode(b, i)  # tag 1 (date): the number
    raise ValueError(f"major {major}")


def frame(obj) -> bytes:
    body = encode(obj)
    return struct.pack(">I", len(body)) + body


class Closed(Exception):
    pass


def send_identifying(sock, data: bytes) -> None:
    """Sends `data`, its first part with a pidfd of this process (SCM_RIGHTS), as keychaind's
    clients send a connection's first bytes (docs/protocol.md §1)."""
    pidfd = os.pidfd_open(os.getpid())
    try:
        sent = socket.send_fds(sock, [data], [pidfd])
    finally:
        os.close(pidfd)
    if sent < len(data):
        sock.sendall(data[sent:])


def no_peer_pidfd_filter() -> None:
    """Makes getsockopt(SO_PEERPIDFD) fail with ENOPROTOOPT in this process and every program it
    execs (a seccomp filter), as on kernels before 6.5: the daemon then pins peers with pidfd_open
    after accept. For tests of that path on a newer kernel."""
    import ctypes, platform
    arch = {"x86_64": (0xC000003E, 55), "aarch64": (0xC00000B7, 209)}.get(platform.machine())
    if arch is None:
        raise OSError(f"no seccomp filter for {platform.machine()}")
    audit_arch, nr_getsockopt = arch
    ld, jeq, ret = 0x20, 0x15, 0x06
    allow, errno_ret, enoprotoopt, so_peerpidfd = 0x7FFF0000, 0x00050000, 92, 77
    program = [
        (ld, 0, 0, 4),                       # A = seccomp_data.arch
        (jeq, 0, 5, audit_arch),             # another ABI: allow
        (ld, 0, 0, 0),                       # A = seccomp_data.nr
        (jeq, 0, 3, nr_getsockopt),          # another call: allow
        (ld, 0, 0, 32),                      # A = low half of args[2] (optname)
        (jeq, 0, 1, so_peerpidfd),           # another option: allow
        (ret, 0, 0, errno_ret | enoprotoopt),
        (ret, 0, 0, allow),
    ]
    raw = b"".join(struct.pack("HBBI", *i) for i in program)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Fprog(len(program), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "--no-peer-pidfd":
    # python3 kcwire.py --no-peer-pidfd PROGRAM ARGS…: runs PROGRAM under that filter.
    no_peer_pidfd_filter()
    os.execv(sys.argv[2], sys.argv[2:])


class Conn:
    """One connection; `call` sends one request and waits for its response."""

    def __init__(self, path: str, timeout: float | None = 30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        self.sent_first = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except OSError as e:
                raise Closed(str(e)) from e
            if not chunk:
                raise Closed("end of stream")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def receive(self) -> dict:
        (length,) = struct.unpack(">I", self._read(4))
        return decode(self._read(length))

    def send(self, op: str, **fields) -> int:
        rid = self.next_id
        self.next_id += 1
        try:
            data = frame({"v": 1, "id": rid, "op": op, **fields})
            if self.sent_first:
                self.sock.sendall(data)
            else:
                self.sent_first = True
                send_identifying(self.sock, data)
        except OSError as e:
            raise Closed(str(e)) from e
        return rid

    def call(self, op: str, **fields) -> dict:
        rid = self.send(op, **fields)
        r = self.receive()
        if r.get("id") != rid:
            raise Closed(f"response id {r.get('id')} for request {rid}: {r}")
        return r


def item(service: str, account: str, **extra) -> dict:
    return {"class": "genp", "svce": service, "acct": account, **extra}


def stop_process(pid: int, timeout: float = 60.0):
    """SIGSTOP, then waits until every thread of `pid` has stopped. kill() returns once the signal is
    queued, and each thread stops only when it next runs: on a loaded machine a thread woken by a
    request sent just after kill() can serve it first. (Resume with SIGCONT.)"""
    import signal
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass                                    # a thread that ended meanwhile
        if states and all(state in "Tt" for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} did not stop within {timeout} s: thread states {states}")
        time.sleep(0.001)


class Daemon:
    """A keychaind process on a private socket/data dir/config, with one app: this Python interpreter."""

    def __init__(self, binary: str, root: str, data_dir: str | None = None, config: dict | None = None,
                 log_level: str = "info"):
        self.binary, self.root = binary, root
        self.socket = os.path.join(root, "run", "keychaind.sock")
        self.data_dir = data_dir or os.path.join(root, "data")
        self.config_file = os.path.join(root, "config", "keychaind.json")
        self.log_file = os.path.join(root, "daemon.log")
        self.log_level = log_level
        os.makedirs(os.path.join(root, "config", "apps.d"), exist_ok=True)
        import json
        with open(self.config_file, "w") as f:
            json.dump(config or {}, f)
        exe = os.path.realpath("/proc/self/exe")
        with open(os.path.join(root, "config", "apps.d", "campaign.json"), "w") as f:
            json.dump({"application-identifier": "CAMPAIGN.app", "keychain-access-groups": ["CAMPAIGN.app"],
                       "executables": [exe]}, f)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0, expect_failure: bool = False):
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen([self.binary, "--socket", self.socket, "--data-dir", self.data_dir,
                                      "--config", self.config_file, "--log-level", self.log_level],
                                     stdout=log, stderr=log, env={**os.environ, "SWIFT_BACKTRACE": "enable=no"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if expect_failure:
                    return False
                raise RuntimeError(f"keychaind exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                Conn(self.socket, timeout=2).close()
                return True
            except OSError:
                time.sleep(0.01)
        raise RuntimeError(f"keychaind did not serve within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
        rc = self.proc.wait(timeout=120) if self.proc else -1
        return rc

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def threads(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        return 0


def integrity_check(db_path: str, scratch: str) -> str:
    """`PRAGMA integrity_check` on a copy of the database and its WAL (so the check's own recovery
    and checkpoint never change the files the daemon will reopen)."""
    import shutil
    os.makedirs(scratch, exist_ok=True)
    copy = os.path.join(scratch, "check.db")
    for suffix in ("", "-wal"):
        if os.path.exists(copy + suffix):
            os.unlink(copy + suffix)
        if os.path.exists(db_path + suffix):
            shutil.copyfile(db_path + suffix, copy + suffix)
    out = subprocess.run(["sqlite3", copy, "PRAGMA integrity_check;"], capture_output=True, text=True)
    return (out.stdout + out.stderr).strip()
