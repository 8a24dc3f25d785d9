"""Replica groups through connex_c.Group (docs/mobility.md "Groups", "Steps"): two replica
processes of one stage, steps round robin, kill -9 with steps in flight (hand-over, none lost),
restart on the same port (rejoin), put_signal to a group, the directory, bad input."""

import math
import os
import threading
import time

import pytest

from conftest import HB_MS, HB_TIMEOUT_MS, sigstop, stable_port
from peer import pattern

import connex_c
from connex_c import (CX_ECLOSED, CX_EINPROGRESS, CX_EINVAL, CX_EPEER, ConnexError, Engine,
                      EngineClosed, Group, GroupClosed, InvalidArgument, WaitTimeout)

N = 65536
WAIT_S = 15.0      # one step's wait: generous, a step completes in milliseconds


def _port(url):
    return int(url.split("#")[0].rsplit(":", 1)[1])


def _lid(url):
    m, s, sh, r = url.split("#", 1)[1].split("|")
    return (m, int(s), int(sh), int(r))


def _wait_state(g, lid, want, timeout_s=10.0):
    """Polls members() (bounded) until lid reads `want`; returns the members seen last."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = g.members()
        if any(m["lid"] == lid and m["state"] == want for m in seen):
            return seen
        time.sleep(0.05)
    raise AssertionError("%r not %r within %.0f s: %r" % (lid, want, timeout_s, seen))


def _drain(peer, expect, quiet_ms=300):
    """The group steps peer received, as {step id: message dict}; expects `expect` of them."""
    got = {}
    deadline = time.monotonic() + WAIT_S
    while len(got) < expect and time.monotonic() < deadline:
        for m in peer.request("drain", quiet=quiet_ms)["msgs"]:
            assert m["step"] not in got, "step %d queued twice at one receiver" % m["step"]
            got[m["step"]] = m
    extra = peer.request("drain", quiet=quiet_ms)["msgs"]       # nothing more
    assert not extra, extra
    return got


def _replicas(peers, model, *extra):
    a = peers.start("--model", model, "--stage", 1, "--replica", 0, "--port", stable_port(),
                    "--size", N, "--seed", 1, *extra)
    b = peers.start("--model", model, "--stage", 1, "--replica", 1, "--size", N, "--seed", 2,
                    *extra)
    return a, b


def test_round_robin_two_replicas(engine, peers):
    a, b = _replicas(peers, "rr")
    la, lb = _lid(a.url), _lid(b.url)
    with engine.group("rr|1|*|*") as g:
        assert g.pattern == "rr|1|*|*" and g.policy == "round_robin" and not g.closed
        g.add(a.url)
        g.add(b.url)
        _wait_state(g, la, "up")
        _wait_state(g, lb, "up")
        assert sorted(m["lid"] for m in g.members()) == [la, lb]
        assert g.pick() in (la, lb)

        steps = [g.send(b"step-%d" % i) for i in range(8)]
        res = [s.wait(WAIT_S) for s in steps]
        by = [r[0] for r in res]
        ids = [r[1] for r in res]
        # alternating while both are up (>= 2: a member suspect for a moment on a loaded host)
        assert by.count(la) >= 2 and by.count(lb) >= 2, by
        assert len(set(ids)) == 8 and all(i > 0 for i in ids)
        assert all(s.done and s.status == 0 for s in steps)
        assert steps[0].wait(0) == res[0]                          # same answer again
        assert g.steps_pending == 0

        # each replica queued exactly the steps taken_by names, with their ids and our identity
        for peer, lid in ((a, la), (b, lb)):
            got = _drain(peer, by.count(lid))
            want = {i: b"step-%d" % k for k, (t, i) in enumerate(res) if t == lid}
            assert {i: bytes.fromhex(m["msg"]) for i, m in got.items()} == want
            for m in got.values():
                assert tuple(m["peer"]) == ("pytest", 9, 0, 0)
                assert m["from_incarnation"] == engine.incarnation

        # a plain message is not a step
        assert engine.send_msg(a.url, b"plain") == 0
        m = a.request("recv")
        assert bytes.fromhex(m["msg"]) == b"plain" and m["step"] == 0

        # mark_failed: skipped (and reads failed) until added again
        g.mark_failed(lb)
        assert {m["lid"]: m["state"] for m in g.members()}[lb] == "failed"
        assert all(g.pick() == la for _ in range(4))
        assert all(g.send(b"m").wait(WAIT_S)[0] == la for _ in range(3))
        g.add(b.url)                      # the caller vouches for it again
        _wait_state(g, lb, "up")
        by = [g.send(b"m").wait(WAIT_S)[0] for _ in range(4)]
        assert set(by) == {la, lb}, by
        _drain(a, 3 + by.count(la))
        _drain(b, by.count(lb))
    assert g.closed
    with pytest.raises(GroupClosed):
        g.send(b"late")
    assert engine.stats()["steps_handed_over"] == 0


def test_unwaited_steps_are_reaped(engine, peers, monkeypatch):
    """Handles dropped without wait() do not pile up: a sweep frees the completed ones."""
    import connex_c.group as grp
    monkeypatch.setattr(grp, "_SWEEP_FIRST", 8)
    a = peers.start("--model", "sw", "--stage", 1)
    with engine.group("sw|1|*|*", policy="least_inflight") as g:
        g.add(a.url)
        _wait_state(g, _lid(a.url), "up")
        kept = []
        for i in range(40):
            s = g.send(b"%d" % i)
            if i % 10 == 0:
                kept.append(s)
            time.sleep(0.005)
        assert g.steps_pending < 40
        assert all(s.wait(WAIT_S)[0] == _lid(a.url) for s in kept)
        assert len(_drain(a, 40)) == 40


def test_kill_replica_with_steps_in_flight(peers, monkeypatch):
    """Replica A is stopped (it cannot acknowledge anything), steps go out round robin, then A is
    killed -9: every step completes, those sent to A are handed to B, none is lost or queued
    twice. A is FAILED, pick() skips it; restarted on its port it rejoins and takes steps again.

    zmq on every side: the receiver's progress thread acknowledges each step, so a stopped
    process holds its steps in flight for certain."""
    monkeypatch.delenv("CONNEX_BACKEND", raising=False)
    a, b = _replicas(peers, "ha", "--backend", "zmq")
    la, lb = _lid(a.url), _lid(b.url)
    with Engine("sender", stage=9, heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS,
                backend="zmq") as e, e.group("ha|1|*|*") as g:
        g.add(a.url)
        g.add(b.url)
        _wait_state(g, la, "up")
        _wait_state(g, lb, "up")
        warm = [g.send(b"warm").wait(WAIT_S) for _ in range(4)]
        assert {t for t, _ in warm} == {la, lb}
        _drain(a, 2)
        _drain(b, 2)

        sigstop(a.p.pid)
        steps = [g.send(b"inflight-%d" % i) for i in range(10)]
        time.sleep(0.1)
        pending = sum(not s.done for s in steps)
        t0 = time.monotonic()
        a.kill()                                   # SIGKILL works on a stopped process
        res = [s.wait(WAIT_S) for s in steps]
        dt = time.monotonic() - t0
        print("kill -9 with %d of 10 steps in flight on A: all completed %.0f ms later"
              % (pending, dt * 1e3))
        assert pending >= 1, "some steps were sent to the stopped replica"
        assert all(t == lb for t, _ in res), res      # A acknowledged none of them
        got = _drain(b, 10)
        assert sorted(got) == sorted(i for _, i in res), "every step reached B, once"
        assert {i: bytes.fromhex(m["msg"]) for i, m in got.items()} == \
            {i: b"inflight-%d" % k for k, (_, i) in enumerate(res)}
        assert e.stats()["steps_handed_over"] >= pending

        _wait_state(g, la, "failed", timeout_s=5.0)
        assert all(g.pick() == lb for _ in range(5))
        assert all(g.send(b"after").wait(WAIT_S)[0] == lb for _ in range(4))
        _drain(b, 4)

        # the same identity on the same port, new incarnation: rejoins, takes steps again
        a2 = peers.start("--model", "ha", "--stage", 1, "--replica", 0, "--port", _port(a.url),
                         "--size", N, "--backend", "zmq")
        assert a2.url == a.url and a2.hello["incarnation"] != a.hello["incarnation"]
        t0 = time.monotonic()
        _wait_state(g, la, "up", timeout_s=10.0)
        print("restart -> member up again: %.0f ms" % ((time.monotonic() - t0) * 1e3))
        res = [g.send(b"back-%d" % i).wait(WAIT_S) for i in range(6)]
        by = [t for t, _ in res]
        assert by.count(la) >= 2 and by.count(lb) >= 2, by
        got = _drain(a2, by.count(la))
        assert sorted(got) == sorted(i for t, i in res if t == la)
        assert all(m["from_incarnation"] == e.incarnation for m in got.values())
        _drain(b, by.count(lb))


def test_put_signal_to_group(engine, peers):
    a, b = _replicas(peers, "ps")
    buf = bytearray(pattern(N, 7))
    assert engine.register_memory(buf) == 0
    with engine.group("ps|1|*|*") as g:
        g.add(a.url)
        g.add(b.url)
        _wait_state(g, _lid(a.url), "up")
        _wait_state(g, _lid(b.url), "up")
        by_peer = {_lid(a.url): a, _lid(b.url): b}
        for k in range(4):
            off = 512 * (k + 1)
            src = memoryview(buf)[100 * k:100 * k + 4096]
            taken, sid = g.put_signal(src, off, b"ps-%d" % k).wait(WAIT_S)
            p = by_peer[taken]
            m = p.request("recv")
            assert bytes.fromhex(m["msg"]) == b"ps-%d" % k and m["step"] == sid
            got = bytes.fromhex(p.request("dump", off=off, n=4096)["hex"])
            assert got == bytes(buf[100 * k:100 * k + 4096]), "data in place before the message"
        # a range no member's first region holds: the step fails with CX_EINVAL
        with pytest.raises(ConnexError) as ei:
            g.put_signal(buf, N - 100, b"too far", n=4096).wait(WAIT_S)
        assert ei.value.code == CX_EINVAL
        # not registered here: refused at once
        with pytest.raises(InvalidArgument):
            g.put_signal(bytearray(4096), 0, b"x")


def test_directory_and_group_members_from_it(peers):
    a, b = _replicas(peers, "dir")
    with Engine("lister", stage=3, heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS,
                directory="static", peers=[a.url, b.url]) as e:
        assert e.directory_kind == "static"
        ents = e.directory()
        assert {d["lid"]: d["url"] for d in ents} == {
            ("lister", 3, 0, 0): e.local_url, _lid(a.url): a.url, _lid(b.url): b.url}
        assert all(d["version"] >= 1 for d in ents)
        assert [d["lid"] for d in e.directory("lister|*|*|*")] == [("lister", 3, 0, 0)]
        assert e.directory("nobody|*|*|*") == []
        with pytest.raises(InvalidArgument):
            e.directory("not|a|pattern")
        with pytest.raises(TypeError):
            e.directory(5)
        g = e.group("dir|1|*|*")               # members from the directory, no add()
        _wait_state(g, _lid(a.url), "up")
        _wait_state(g, _lid(b.url), "up")
        s = g.send(b"via directory")
        assert s.wait(WAIT_S)[0] in (_lid(a.url), _lid(b.url))
    assert g.closed                            # closing the engine closed the group
    with pytest.raises(ConnexError) as ei:
        g.members()
    assert ei.value.code == CX_ECLOSED
    with pytest.raises(InvalidArgument):
        Engine("bad", peers="not-a-url")
    with pytest.raises(InvalidArgument):
        Engine("bad", directory="zookeeper://x")


def test_no_member_close_and_gil():
    """A step with no member waits (bounded by the connect timeout) and ends CX_EPEER; the GIL
    is free meanwhile; closing the group or the engine ends open steps with CX_ECLOSED."""
    with Engine("lonely", heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS,
                connect_timeout_ms=800, backend="zmq") as e:
        g = Group(e, "nobody|1|*|*", policy="least_inflight")
        assert g.members() == []
        with pytest.raises(ConnexError) as ei:
            g.pick()
        assert ei.value.code == CX_EPEER
        s = g.send(b"anyone?")
        with pytest.raises(WaitTimeout) as wt:
            s.wait(0)
        assert wt.value.code == CX_EINPROGRESS and not s.done and s.status is None

        stop = threading.Event()
        count = [0]

        def spin():
            while not stop.is_set():
                count[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        try:
            time.sleep(0.05)
            c0 = count[0]
            t0 = time.monotonic()
            with pytest.raises(ConnexError) as ei:
                s.wait(WAIT_S)
            dt = time.monotonic() - t0
            c1 = count[0]
        finally:
            stop.set()
            t.join()
        assert ei.value.code == CX_EPEER and ei.value.step == s.step_id > 0
        assert ei.value.taken_by is None
        assert 0.2 < dt < 5.0, dt
        assert c1 - c0 > 10000, (c0, c1)
        with pytest.raises(ConnexError):           # the same answer again
            s.wait(0)

        # two threads waiting on one step, then the group closes under them
        s1 = g.send(b"1")
        s2 = g.send(b"2")
        errs = []

        def waiter():
            try:
                s1.wait(WAIT_S)
            except ConnexError as exc:
                errs.append(exc.code)

        ts = [threading.Thread(target=waiter) for _ in range(2)]
        for t in ts:
            t.start()
        time.sleep(0.1)
        g.close()
        for t in ts:
            t.join(WAIT_S)
        assert errs == [CX_ECLOSED, CX_ECLOSED]
        with pytest.raises(ConnexError) as ei:
            s2.wait(0)                             # reaped by close(), never waited before
        assert ei.value.code == CX_ECLOSED
        assert g.steps_pending == 0
        g.close()                                  # again: nothing

        g2 = e.group("nobody|1|*|*")
        s3 = g2.send(b"3")
    assert g2.closed                               # engine closed its group first
    with pytest.raises(ConnexError) as ei:
        s3.wait(5)
    assert ei.value.code == CX_ECLOSED
    with pytest.raises(EngineClosed):
        e.group("nobody|1|*|*")
    with pytest.raises(ConnexError):
        g2.send(b"late")


@pytest.mark.parametrize("pattern,policy,exc", [
    (123, "round_robin", TypeError),
    (None, "round_robin", TypeError),
    ("", "round_robin", ValueError),
    ("a\0b|1|*|*", "round_robin", ValueError),
    ("a|b", "round_robin", InvalidArgument),
    ("a|x|*|*", "round_robin", InvalidArgument),
    ("a|1|*|*|9", "round_robin", InvalidArgument),
    ("a|1|*|*", "fastest", ValueError),
    ("a|1|*|*", 7, ValueError),
    ("a|1|*|*", None, TypeError),
    ("a|1|*|*", True, TypeError),
])
def test_bad_group_arguments(engine, pattern, policy, exc):
    with pytest.raises(exc):
        engine.group(pattern, policy)


def test_bad_member_and_step_arguments(engine):
    with pytest.raises(TypeError):
        Group(object(), "a|1|*|*")
    g = engine.group("a|1|*|*", connex_c.CX_PICK_LEAST_INFLIGHT)
    assert g.policy == "least_inflight"
    with pytest.raises(TypeError):
        g.add(5)
    with pytest.raises(TypeError):
        g.add(None)
    for bad in ("not a url", "127.0.0.1:1#b|1|0|0", engine.local_url, "127.0.0.1:99999#a|1|0|0"):
        with pytest.raises(InvalidArgument):
            g.add(bad)                 # not a URL, not matching, our own identity, bad port
    with pytest.raises(InvalidArgument):
        g.mark_failed(("a", 1, 0, 7))  # not a member
    with pytest.raises(TypeError):
        g.mark_failed(3.5)
    with pytest.raises(ValueError):
        g.mark_failed(("a", 1, 0))
    with pytest.raises(TypeError):
        g.send("text")
    with pytest.raises(TypeError):
        g.send(None)
    with pytest.raises(ValueError):
        g.send(bytes(connex_c.CX_MSG_MAX + 1))
    with pytest.raises(InvalidArgument):
        g.send(bytes(connex_c.CX_MSG_MAX))      # no room for the step's envelope
    buf = bytearray(4096)
    with pytest.raises(ValueError):
        g.put_signal(buf, -1, b"")
    with pytest.raises(TypeError):
        g.put_signal(buf, "0", b"")
    with pytest.raises(TypeError):
        g.put_signal(buf, 0, "text")
    with pytest.raises(TypeError):
        g.put_signal("text", 0, b"")
    with pytest.raises(TypeError):
        g.put_signal(12345678, 0, b"")           # raw address without n
    with pytest.raises(ValueError):
        g.put_signal(buf, 0, b"", n=8192)        # longer than the buffer
    with pytest.raises(InvalidArgument):
        g.put_signal(buf, 0, b"")                # not registered
    s = g.send(b"x")
    for bad, exc in (("1", TypeError), (math.nan, ValueError), (True, TypeError)):
        with pytest.raises(exc):
            s.wait(bad)
    g.close()
    for call in (lambda: g.add("127.0.0.1:1#a|1|0|0"), g.members, g.pick,
                 lambda: g.mark_failed(("a", 1, 0, 0)), lambda: g.send(b"x"),
                 lambda: g.put_signal(buf, 0, b"")):
        with pytest.raises(GroupClosed):
            call()
    with pytest.raises(ConnexError) as ei:
        s.wait(1)
    assert ei.value.code == CX_ECLOSED


def test_many_groups_back_to_baseline():
    """Opening and closing groups (with a step each, ended by the close) leaves no fds, no step
    handles and no registered group behind."""
    with Engine("churn", heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS,
                backend="zmq") as e:
        e.group("warm|1|*|*").close()
        fds = len(os.listdir("/proc/self/fd"))
        for i in range(200):
            with e.group("churn%d|1|*|*" % (i % 7), policy=("round_robin", "least_inflight")[i % 2]) as g:
                s = g.send(b"x")
            with pytest.raises(ConnexError) as ei:
                s.wait(5)
            assert ei.value.code == CX_ECLOSED and g.steps_pending == 0
        assert len(e._groups) == 0
        assert len(os.listdir("/proc/self/fd")) == fds
        assert e.stats()["ops_in_flight"] == 0
