"""A killed peer gives "failed" and CX_EPEER; the same identity restarted gives "joined"."""

import os
import signal
import time

from conftest import HB_TIMEOUT_MS, sigstop, stable_port, wait_event_type
from peer import pattern

from connex_c import CX_EPEER

N = 65536
LID = ("victim", 1, 0, 0)


def test_kill_then_restart(engine, peers):
    peer = peers.start("--model", "victim", "--stage", 1, "--port", stable_port(), "--size", N,
                       "--seed", 1)
    port = int(peer.url.split("#")[0].rsplit(":", 1)[1])
    buf = bytearray(N)
    assert engine.register_memory(buf) == 0
    assert engine.transfer_sync_read(peer.url, buf, peer.hello["addr"], N) == 0
    assert buf == pattern(N, 1)
    wait_event_type(engine, "up", LID)

    t0 = time.monotonic()
    peer.kill()
    ev, _ = wait_event_type(engine, "failed", LID, timeout_s=5.0)
    detect_ms = (time.monotonic() - t0) * 1e3
    print("kill -9 -> failed event: %.1f ms (%s)" % (detect_ms, ev["reason"]))
    assert ev["reason"]
    assert detect_ms < HB_TIMEOUT_MS + 1000
    assert engine.transfer_sync_read(peer.url, buf, peer.hello["addr"], N) == CX_EPEER
    assert engine.transfer_sync_read(LID, buf, peer.hello["addr"], N) == CX_EPEER
    assert engine.send_msg(LID, b"anyone?") == CX_EPEER
    assert engine.stats()["peer_failures"] >= 1

    # the same LID on the same port, new incarnation, new data
    again = peers.start("--model", "victim", "--stage", 1, "--port", port, "--size", N,
                        "--seed", 2)
    assert again.url == peer.url
    buf[:] = bytes(N)
    rc = None
    for _ in range(50):                 # bounded: the failed peer is reconnected by URL
        rc = engine.transfer_sync_read(again.url, buf, again.hello["addr"], N)
        if rc == 0:
            break
        time.sleep(0.1)
    assert rc == 0
    assert buf == pattern(N, 2)
    ev, _ = wait_event_type(engine, "joined", LID, timeout_s=5.0)
    assert ev["url"] == again.url
    assert engine.stats()["peer_joins"] >= 1
    assert engine.send_msg(LID, b"welcome back") == 0
    assert bytes.fromhex(again.request("recv")["msg"]) == b"welcome back"


def test_hung_peer_suspect_then_failed(engine, peers):
    peer = peers.start("--model", "sleeper")
    lid = ("sleeper", 0, 0, 0)
    assert engine.connect(peer.url, 5000) == 0
    wait_event_type(engine, "up", lid)
    sigstop(peer.p.pid)
    try:
        t0 = time.monotonic()
        _, seen = wait_event_type(engine, "failed", lid, timeout_s=HB_TIMEOUT_MS / 1e3 + 5)
        dt = time.monotonic() - t0
        print("SIGSTOP -> failed: %.0f ms; events %s" % (dt * 1e3, [e["type"] for e in seen]))
        assert "suspect" in [e["type"] for e in seen]
        assert dt >= HB_TIMEOUT_MS / 1e3 * 0.5
        assert engine.send_msg(lid, b"x") == CX_EPEER
    finally:
        os.kill(peer.p.pid, signal.SIGCONT)


def test_stopped_peer_waits_and_op_timeouts(peers, monkeypatch):
    """A put_signal to a stopped peer: a short wait expires (-3) and the handle stays valid;
    after SIGCONT it completes with 0. With a short op timeout, ops to a stopped peer end with
    CX_ETIMEDOUT, for sync transfers and for put_signal handles alike.

    zmq on both sides, where the target's progress thread serves every request: UCX over cma or
    shm completes a same-host read from a stopped process (correctly), so no timeout would
    happen there."""
    from conftest import HB_MS
    from connex_c import CX_ETIMEDOUT, Engine

    monkeypatch.delenv("CONNEX_BACKEND", raising=False)
    peer = peers.start("--model", "frozen", "--size", N, "--backend", "zmq")
    remote = peer.hello["addr"]
    with Engine("waiter", heartbeat_ms=HB_MS, heartbeat_timeout_ms=5000, op_timeout_ms=400,
                backend="zmq") as e:
        buf = bytearray(N)
        assert e.register_memory(buf) == 0
        assert e.transfer_sync_read(peer.url, buf, remote, N) == 0
        sigstop(peer.p.pid)
        try:
            h = e.put_signal(peer.url, buf, remote, 4096, b"later")
            t0 = time.monotonic()
            assert h.wait(100) == CX_ETIMEDOUT
            assert 0.05 < time.monotonic() - t0 < 1.0
            assert not h.done
            os.kill(peer.p.pid, signal.SIGCONT)
            assert h.wait(5000) == 0
            assert h.done

            sigstop(peer.p.pid)
            t0 = time.monotonic()
            assert e.transfer_sync_read(peer.url, buf, remote, 4096) == CX_ETIMEDOUT
            dt = time.monotonic() - t0
            print("op timeout 400 ms -> returned after %.0f ms" % (dt * 1e3))
            assert 0.3 < dt < 3.0
            h1 = e.put_signal(peer.url, buf, remote, 4096, b"never")
            h2 = e.put_signal(peer.url, buf, remote, 4096, b"never")
            assert h1.wait() in (CX_ETIMEDOUT, CX_EPEER)        # in this thread
            assert h2.wait(3000) in (CX_ETIMEDOUT, CX_EPEER)    # via a reaper thread
            assert e.stats()["op_timeouts"] >= 1
        finally:
            os.kill(peer.p.pid, signal.SIGCONT)


def test_close_completes_unwaited_put_signals(peers):
    from connex_c import Engine

    peer = peers.start("--model", "sink", "--size", N)
    e = Engine("dropper", heartbeat_ms=100, heartbeat_timeout_ms=1000)
    buf = bytearray(N)
    assert e.register_memory(buf) == 0
    kept = [e.put_signal(peer.url, buf, peer.hello["addr"], 4096, b"k%d" % i) for i in range(8)]
    for i in range(8):
        e.put_signal(peer.url, buf, peer.hello["addr"], 4096, b"d")     # handle dropped
    sigstop(peer.p.pid)       # keep some of them in flight at close
    try:
        t0 = time.monotonic()
        e.close()
        assert time.monotonic() - t0 < 5.0
        assert all(h.done for h in kept)
        assert all(h.wait(0) in (0, -2, -3, -7) for h in kept)
        assert not e._ops, "every op reaped"
    finally:
        os.kill(peer.p.pid, signal.SIGCONT)
