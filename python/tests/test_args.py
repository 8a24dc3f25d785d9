"""Bad arguments: TypeError/ValueError from Python, CX_EINVAL from the core, never a crash."""

import threading
import time

import pytest

import connex_c
from connex_c import CX_EINVAL, Engine, EngineClosed


@pytest.mark.parametrize("kw,exc", [
    (dict(model=123), TypeError),
    (dict(model="bad model!"), ValueError),
    (dict(model=""), ValueError),
    (dict(model="m\n"), ValueError),
    (dict(model="m" * 64), ValueError),
    (dict(model="m", port=70000), ValueError),
    (dict(model="m", port="80"), TypeError),
    (dict(model="m", stage=-1), ValueError),
    (dict(model="m", replica=1 << 32), ValueError),
    (dict(model="m", stage=True), TypeError),
    (dict(model="m", listen_ip=5), TypeError),
    (dict(model="m", listen_ip="not-an-ip"), ValueError),      # refused by the core: EINVAL
    (dict(model="m", advertise_ip="not-an-ip"), ValueError),
    (dict(model="m", listen_ip="0.0.0.0", advertise_ip="::1"), ValueError),   # EINVAL: IPv6 for IPv4
    (dict(model="m", backend="no-such-backend"), Exception),
])
def test_engine_constructor(kw, exc, monkeypatch):
    monkeypatch.delenv("CONNEX_BACKEND", raising=False)    # it would win over backend=
    with pytest.raises(exc):
        Engine(**kw)


def test_core_invalid_is_value_error():
    with pytest.raises(ValueError) as ei:
        Engine("m", heartbeat_ms=1000, heartbeat_timeout_ms=500)
    assert isinstance(ei.value, connex_c.ConnexError) and ei.value.code == CX_EINVAL


def test_memory_arguments(engine):
    with pytest.raises(TypeError):
        engine.register_memory("abc", 3)
    with pytest.raises(TypeError):
        engine.register_memory(1.5, 3)
    with pytest.raises(TypeError):
        engine.register_memory(4096)            # raw address: the length is required
    with pytest.raises(ValueError):
        engine.register_memory(b"immutable")    # peers could write into it
    with pytest.raises(ValueError):
        engine.register_memory(bytearray(10), 20)
    with pytest.raises(ValueError):
        engine.register_memory(bytearray(0))
    with pytest.raises(ValueError):
        engine.register_memory(-1, 10)
    with pytest.raises(ValueError):
        engine.register_memory(bytearray(10), -1)
    buf = bytearray(4096)
    assert engine.register_memory(buf) == 0
    assert engine.register_memory(buf) == CX_EINVAL, "overlapping registration refused"
    with pytest.raises(BufferError):
        buf.extend(b"x")                        # pinned while registered
    assert engine.unregister_memory(buf) == 0
    assert engine.unregister_memory(buf) == CX_EINVAL, "not registered any more"
    buf.extend(b"x")


def test_transfer_arguments(engine):
    buf = bytearray(4096)
    assert engine.register_memory(buf) == 0
    url = "127.0.0.1:1#nobody|0|0|0"
    with pytest.raises(TypeError):
        engine.transfer_sync_read(123, buf, 4096, 16)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(("m", 1, 2), buf, 4096, 16)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(("m", -1, 0, 0), buf, 4096, 16)
    with pytest.raises(TypeError):
        engine.transfer_sync_read((5, 1, 0, 0), buf, 4096, 16)
    with pytest.raises(ValueError):
        engine.transfer_sync_read("", buf, 4096, 16)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(url, b"read-only", 4096, 4)
    with pytest.raises(TypeError):
        engine.transfer_sync_read(url, buf, "4096", 16)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(url, buf, -4096, 16)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(url, buf, 4096, -1)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(url, buf, 4096, 4097)
    with pytest.raises(TypeError):
        engine.transfer_sync_write(url, "text", 4096, 4)
    with pytest.raises(TypeError):
        engine.send_msg(url, "text is not bytes")
    with pytest.raises(TypeError):
        engine.send_msg(url, 42)
    with pytest.raises(TypeError):
        engine.recv_msg("10")
    with pytest.raises(ValueError):
        engine.wait_event(float("nan"))
    with pytest.raises(TypeError):
        engine.put_signal(url, buf, 4096, 16, "text")
    # well-typed but wrong: the core says CX_EINVAL (its log line names the fault)
    assert engine.transfer_sync_read("not a url#", buf, 4096, 16) == CX_EINVAL
    assert engine.transfer_sync_read("garbage|x|y|z", buf, 4096, 16) == CX_EINVAL
    unreg = bytearray(64)
    assert engine.transfer_sync_read(url, unreg, 4096, 64) == CX_EINVAL
    assert engine.put_signal("not a url#", buf, 4096, 16, b"m").wait(1000) == CX_EINVAL


def test_closed_engine_raises():
    e = Engine("closing")
    url = e.local_url
    assert url.startswith("127.0.0.1:") and url.endswith("#closing|0|0|0")
    e.close()
    e.close()
    assert e.closed
    with pytest.raises(EngineClosed):
        e.local_url
    with pytest.raises(EngineClosed):
        e.send_msg(url, b"x")
    with pytest.raises(EngineClosed):
        e.recv_msg(0)


def test_context_manager():
    with Engine("ctx", stage=2, shard=3, replica=4) as e:
        assert e.local_url.endswith("#ctx|2|3|4")
        assert e.port > 0
        assert e.backends
        assert e.stats()["regions"] == 0
    assert e.closed


def test_close_wakes_a_blocked_receiver():
    e = Engine("closer")
    got = {}

    def blocked():
        try:
            e.recv_msg(None)
            got["r"] = "returned"
        except EngineClosed:
            got["r"] = "closed"

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    e.close()
    t.join(5)
    assert not t.is_alive()
    assert got["r"] == "closed"
    assert time.monotonic() - t0 < 2.0


def test_port_in_use_is_an_error_and_closes_nothing():
    """A second engine on a taken port fails with an exception, and the failed create leaves
    every descriptor of the process alone (run in a child: a bad close would hit pytest's)."""
    import os
    import subprocess
    import sys
    code = r"""
import os, sys, connex_c
probe = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]
a = connex_c.Engine("first")
try:
    b = connex_c.Engine("second", port=a.port)
    err = "NO-ERROR: created " + b.local_url
except BaseException as exc:
    err = repr(exc)
bad = []
for fd in [0, 1, 2] + probe:
    try:
        os.fstat(fd)
    except OSError:
        bad.append(fd)
os.write(2, ("RESULT %r %s\n" % (bad, err)).encode())
a.close()
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), CONNEX_LIB=connex_c.library_path())
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    line = [x for x in r.stderr.splitlines() if x.startswith("RESULT")]
    assert line, r.stderr
    assert line[0].startswith("RESULT []"), \
        "a failed cx_engine_create closed descriptors it did not own: " + line[0]
    assert "ConnexError" in line[0], line[0]
