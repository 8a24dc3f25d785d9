import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

# The simulated device (docs/gpu.md) for the device-memory cases; libconnex reads this at its
# first memory-kind question, and host memory is host memory either way.
os.environ.setdefault("CONNEX_GPU_SIM", "1")

# Scripts written for Mooncake, run as their own processes by test_mooncake.py.
collect_ignore = ["mooncake_style"]

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)

import connex_c  # noqa: E402

# Short heartbeats so that a hung peer is noticed in about a second; a killed one is noticed at
# once through the reset of its connections.
HB_MS = 100
HB_TIMEOUT_MS = 1000
REPLY_S = 15.0

def sigstop(pid, timeout_s=2.0):
    """SIGSTOP, then wait until every thread of pid is stopped: kill() returns before the target
    has stopped, and a request sent at once could still be served (seen on a loaded 2-vCPU VM)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            states = []
            for t in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.001)


def stable_port(ip="127.0.0.1"):
    """A free port outside the kernel's ephemeral range, for a peer that is restarted on the port
    it first had: while it is down, an ephemeral port can be handed to anyone's connect() or
    bind(0) (the C harness does the same: bench/stable_port.h)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    lo_port, hi_port = (10000, lo - 1) if lo - 1 >= 11000 else (hi + 1, 65535)
    for _ in range(64):
        port = random.randint(lo_port, hi_port)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError:
                continue
            return port
    return 0


class Peer:
    """A tests/peer.py process; request() sends one JSON command and waits (bounded) for the
    JSON reply line."""

    def __init__(self, *args):
        env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("CONNEX_LIB", connex_c.library_path())
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py")] + list(args),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, bufsize=1)
        self._buf = b""
        self.hello = self.read()
        assert "url" in self.hello, self.hello

    @property
    def url(self):
        return self.hello["url"]

    def read(self, timeout=REPLY_S):
        # Our own line buffer over the raw fd: select() on a buffered file object misses lines
        # already read into its buffer.
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            r, _, _ = select.select([fd], [], [], max(0.0, left))
            if not r:
                raise AssertionError("peer sent nothing within %.0f s" % timeout)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError("peer exited (rc %s) without answering" % self.p.poll())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def send(self, cmd, **kw):
        kw["cmd"] = cmd
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()

    def request(self, cmd, **kw):
        self.send(cmd, **kw)
        return self.read()

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def exit(self):
        if self.p.poll() is None:
            r = self.request("exit")
            assert r == {"closed": True}
            assert self.p.wait(10) == 0

@pytest.fixture
def peers():
    """Start peers with peers.start(args...); all are killed at teardown."""
    started = []

    class Factory:
        @staticmethod
        def start(*args):
            p = Peer("--hb", str(HB_MS), "--hbt", str(HB_TIMEOUT_MS), *map(str, args))
            started.append(p)
            return p

    yield Factory
    for p in started:
        p.kill()

@pytest.fixture
def engine():
    e = connex_c.Engine("pytest", stage=9, heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS)
    yield e
    e.close()

def wait_event_type(e, want, peer=None, timeout_s=10.0):
    """Events until one of type `want` (for `peer` when given); asserts it came in time."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        ev = e.wait_event(int((deadline - time.monotonic()) * 1000) + 1)
        if ev is None:
            break
        seen.append(ev)
        if ev["type"] == want and (peer is None or ev["peer"] == peer):
            return ev, seen
    raise AssertionError("no %r event for %r within %.1f s; saw %r" % (want, peer, timeout_s, seen))
