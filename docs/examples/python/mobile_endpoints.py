"""mobile_endpoints: a sender and two replicas of one stage, on loopback, through the scenario of
docs/mobility.md: a replica hangs with a step in flight and is killed, and the step completes on
the other; it rejoins on the same port; it moves to a new port; the stage scales down to nothing.
Every step is printed: who took it, and whether it was handed over.

    python3 mobile_endpoints.py        run the scenario (exit 0 when every step went as expected)

The replicas are this same script, started with --replica: each dials the sender, so the
sender's group ("demo|1|*|*") learns them from the transport events, and prints every step it
receives. Needs connex_c importable (pip install ./python, or PYTHONPATH=python) and libconnex
(CONNEX_LIB, or where connex_c finds it)."""

import os
import signal
import subprocess
import sys
import threading
import time

import connex_c

HB = dict(heartbeat_ms=200, heartbeat_timeout_ms=1000)
failures = []


# ---------------------------------------------------------------- replica

def replica_main(idx, port, sender):
    stop = threading.Event()
    me = "AB"[idx]
    with connex_c.Engine("demo", stage=1, replica=idx, port=port, **HB) as e:
        # After the engine is up: libfabric sets a SIGTERM handler of its own when it opens
        # (it calls exit), and this one must be the one that runs (SIGTERM = leave cleanly).
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        e.connect(sender, 5000)        # after a restart, that is how the sender hears of us
        print(e.local_url, flush=True)
        while not stop.is_set():
            m = e.recv_msg(100)
            if m is None:
                continue
            if m.step:
                print("    [replica %s] queued step %d from %s|%d|%d|%d: %r"
                      % ((me, m.step) + tuple(m.peer) + (m.data.decode(),)), flush=True)
    return 0                           # leaving the with block closes cleanly: the sender sees LEFT


# ---------------------------------------------------------------- sender

class Replica:
    def __init__(self, idx, port, sender):
        self.idx = idx
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--replica",
                                   str(idx), str(port), sender], stdout=subprocess.PIPE,
                                  text=True, bufsize=1)
        self.url = self.p.stdout.readline().strip()   # its first line: its URL
        if "#" not in self.url:
            raise SystemExit("replica %s did not start" % "AB"[idx])
        self.port = int(self.url.split("#")[0].rsplit(":", 1)[1])
        threading.Thread(target=self._echo, daemon=True).start()
        print("  replica %s up at %s (pid %d)" % ("AB"[idx], self.url, self.p.pid))

    def _echo(self):
        for line in self.p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()

    def signal(self, sig):
        self.p.send_signal(sig)

    def kill9(self):
        self.p.kill()
        self.p.wait(10)

    def stop_clean(self):
        self.p.terminate()
        self.p.wait(10)


def wait_member(g, idx, want, timeout_s=8.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(m["lid"][3] == idx and m["state"] == want for m in g.members()):
            return
        time.sleep(0.01)
    failures.append("replica %s never reached %s" % ("AB"[idx], want))
    print("  !! replica %s never reached state %s" % ("AB"[idx], want))


class Sender:
    def __init__(self, e, g):
        self.e, self.g = e, g
        self.handed = 0

    def _handed_now(self):
        n = self.e.stats()["steps_handed_over"]
        was, self.handed = self.handed, n
        return n > was

    def step(self, text, want=None, expect_error=False):
        """Send one step and wait; want: the replica index expected (None: any)."""
        t0 = time.monotonic()
        try:
            by, sid = self.g.send(text.encode()).wait(5.0 if not expect_error else 10.0)
        except connex_c.ConnexError as exc:
            time.sleep(0.03)
            print("  sender: step %r: %s after %d ms"
                  % (text, connex_c.strerror(exc.code), (time.monotonic() - t0) * 1000))
            if not expect_error:
                failures.append(text)
            return None
        handed = self._handed_now()
        time.sleep(0.03)               # let the replica's line come out first
        print("  sender: step %d %r taken by replica %s%s (%d ms)"
              % (sid, text, "AB"[by[3]], ", HANDED OVER" if handed else "",
                 (time.monotonic() - t0) * 1000))
        if expect_error or (want is not None and by[3] != want):
            print("  !! expected %s" % ("an error" if expect_error else "replica " + "AB"[want]))
            failures.append(text)
        return by[3]


def wait_stopped(pid):
    """SIGSTOP is asynchronous: wait until every thread of pid is stopped."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            states = []
            for t in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return
        if states and all(s in ("T", "t") for s in states):
            break
        time.sleep(0.002)
    time.sleep(0.02)


def sender_main():
    with connex_c.Engine("demo", connect_timeout_ms=2000, **HB) as e, \
            e.group("demo|1|*|*") as g:
        me = e.local_url
        print("sender %s (backends %s)" % (me, e.backends))
        r = [Replica(0, 0, me), Replica(1, 0, me)]
        wait_member(g, 0, "up")
        wait_member(g, 1, "up")
        s = Sender(e, g)

        print("\n1. steps go round robin over both replicas")
        for i in range(4):
            s.step("token batch %d" % i)

        print("\n2. replica A hangs with a step in flight, then is killed: the step completes on B")
        if g.pick()[3] == 1:
            s.step("one for B first", 1)
        r[0].signal(signal.SIGSTOP)
        wait_stopped(r[0].p.pid)
        print("  replica A stopped (SIGSTOP)")
        text = "in flight when A died"
        st = g.send(text.encode())
        try:
            st.wait(0.2)
            print("  !! the step did not wait for A")
            failures.append(text)
        except connex_c.WaitTimeout:
            print("  sender: step in flight at replica A; kill -9 A")
            t0 = time.monotonic()
            r[0].kill9()
            by, sid = st.wait(5.0)
            handed = s._handed_now()
            time.sleep(0.03)
            print("  sender: step %d %r: ok, taken by replica %s, handed over %d ms after the kill"
                  % (sid, text, "AB"[by[3]], (time.monotonic() - t0) * 1000))
            if by[3] != 1 or not handed:
                failures.append(text)
        for _ in range(2):
            s.step("while A is down", 1)

        print("\n3. replica A restarts on the same port and rejoins")
        r[0] = Replica(0, r[0].port, me)
        wait_member(g, 0, "up")
        for _ in range(4):
            s.step("after the rejoin")

        print("\n4. replica A moves: killed, restarted on a new port, it dials the sender")
        r[0].kill9()
        wait_member(g, 0, "failed")
        r[0] = Replica(0, 0, me)
        wait_member(g, 0, "up")
        for _ in range(4):
            s.step("after the move")

        print("\n5. scale down: B closes cleanly (LEFT), then A; then no member is left")
        r[1].stop_clean()
        wait_member(g, 1, "left")
        for _ in range(3):
            s.step("B has left", 0)
        r[0].stop_clean()
        wait_member(g, 0, "left")
        s.step("nobody to take it", expect_error=True)

        print("\nsteps handed over: %d; %s" % (e.stats()["steps_handed_over"],
              "SOME STEPS DID NOT GO AS EXPECTED" if failures else "every step went as expected"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--replica":
        sys.exit(replica_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    if len(sys.argv) != 1:
        sys.exit("usage: %s   (runs the scenario; see docs/mobility.md)" % sys.argv[0])
    sys.exit(sender_main())
