"""The Mooncake Transfer Engine surface of connex_c.TransferEngine, method by method, with
Mooncake's return conventions, unknown and unreachable peers; and a Mooncake-style target and
initiator (tests/mooncake_style) run unchanged with `mooncake.engine` mapped to connex_c."""

import os
import subprocess
import sys
import time

import pytest

from conftest import HB_MS, HB_TIMEOUT_MS, PKG_ROOT, stable_port

import connex_c
from connex_c import CX_EINVAL, CX_EUNSUPPORTED, TransferEngine, TransferNotify, TransferOpcode

KW = dict(heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS, connect_timeout_ms=1000,
          pool_bytes=1 << 20)
HERE = os.path.dirname(os.path.abspath(__file__))


def _te():
    t = TransferEngine(**KW)
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return t


@pytest.fixture
def two():
    a, b = _te(), _te()
    yield a, b
    b.close()
    a.close()


def _dead_peer():
    """ip:port where nothing listens (a port just freed; stable_port avoids the ephemeral
    range, so nobody's connect() takes it meanwhile)."""
    return "127.0.0.1:%d" % stable_port()


def _fill(te, addr, data):
    assert te.write_bytes_to_buffer(addr, data, len(data)) == 0


def test_initialize_variants():
    t = TransferEngine(**KW)
    assert t.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p") == 0
    assert t.get_rpc_port() > 0 and t.get_engine() is t.engine
    assert t.get_session_id() == "127.0.0.1:%d" % t.get_rpc_port()
    topo = t.get_local_topology()
    assert '"backends"' in topo and t.get_session_id() in topo
    t.close()
    t = TransferEngine(**KW)
    assert t.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "etcd") == CX_EUNSUPPORTED
    assert t.initialize("127.0.0.1", "etcd://127.0.0.1:2379", "tcp", "") == CX_EUNSUPPORTED
    with pytest.raises(ValueError):
        t.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "")


def test_first_buffer_address_known_unknown_unreachable(two):
    a, b = two
    base, size = b._pool.first_arena()
    assert a.get_first_buffer_address(b.get_session_id()) == base and size == 1 << 20
    assert a.get_first_buffer_address(b.get_local_url()) == base
    t0 = time.monotonic()
    assert a.get_first_buffer_address(_dead_peer()) == 0          # unreachable
    assert time.monotonic() - t0 < 10
    assert a.get_first_buffer_address("nobody|0|0|0") == 0       # unknown LID
    assert a.get_first_buffer_address("not a host") == 0           # not a peer name at all


def test_first_buffer_is_the_first_registered():
    """Without a managed pool of its own first, a peer's first buffer is what it registered
    first, and a region registered later does not replace it."""
    a, b = _te(), connex_c.Engine("mc-plain", heartbeat_ms=HB_MS,
                                  heartbeat_timeout_ms=HB_TIMEOUT_MS)
    try:
        with pytest.raises(connex_c.ConnexError) as ei:
            a.get_engine().peer_first_region(b.local_url)         # not connected yet
        assert ei.value.code == connex_c.CX_EPEER
        one, two_ = bytearray(4096), bytearray(8192)
        assert b.register_memory(one) == 0
        assert b.register_memory(two_) == 0
        assert a.get_first_buffer_address(b.local_url) != 0
        addr, ln = a.get_engine().peer_first_region(b.local_url)
        assert ln == 4096 and addr == a.get_first_buffer_address(b.local_url)
        assert b.unregister_memory(one) == 0
        deadline = time.monotonic() + 10
        while a.get_engine().peer_first_region(b.local_url)[1] != 8192:
            assert time.monotonic() < deadline, "the peer's unregistration never arrived"
            time.sleep(0.01)
    finally:
        b.close()
        a.close()


def test_sync_transfers_and_opcodes(two):
    a, b = two
    rem = a.get_first_buffer_address(b.get_session_id())
    loc = a.allocate_managed_buffer(65536)
    data = os.urandom(65536)
    _fill(a, loc, data)
    assert a.transfer_sync_write(b.get_session_id(), loc, rem, 65536) == 0
    assert b.read_bytes_from_buffer(rem, 65536) == data
    _fill(a, loc, bytes(65536))
    assert a.transfer_sync_read(b.get_session_id(), loc, rem, 65536) == 0
    assert a.read_bytes_from_buffer(loc, 65536) == data
    assert a.transfer_sync(b.get_session_id(), loc, rem + 8, 8, TransferOpcode.WRITE) == 0
    assert a.transfer_sync(b.get_session_id(), loc, rem, 8, TransferOpcode.READ) == 0
    with pytest.raises(ValueError):
        a.transfer_sync(b.get_session_id(), loc, rem, 8, 7)
    # out of the peer's region: CX_EINVAL from the peer, not a crash
    assert a.transfer_sync_read(b.get_session_id(), loc, rem + (1 << 20), 8) == CX_EINVAL
    # unreachable
    assert a.transfer_sync_write(_dead_peer(), loc, rem, 8) < 0
    assert a.free_managed_buffer(loc, 65536) == 0


def test_notify(two):
    a, b = two
    rem = a.get_first_buffer_address(b.get_session_id())
    loc = a.allocate_managed_buffer(4096)
    _fill(a, loc, b"n" * 4096)
    assert a.transfer_sync(b.get_session_id(), loc, rem, 4096, TransferOpcode.WRITE,
                           TransferNotify("kv", "layer 3 done")) == 0
    assert a.batch_transfer_sync(b.get_session_id(), [loc], [rem], [16], TransferOpcode.READ,
                                 TransferNotify("kv", "read")) == 0
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        got += b.get_notifies()
        time.sleep(0.01)
    assert [(n.name, n.msg) for n in got] == [("kv", "layer 3 done"), ("kv", "read")]
    assert b.read_bytes_from_buffer(rem, 4096) == b"n" * 4096   # data first, then the notify
    assert b.get_notifies() == []
    with pytest.raises(TypeError):
        a.transfer_sync(b.get_session_id(), loc, rem, 8, TransferOpcode.WRITE, "not a notify")


def test_batches_sync_and_async(two):
    a, b = two
    s = b.get_session_id()
    rem = a.get_first_buffer_address(s)
    k, n = 8, 4096
    loc = a.allocate_managed_buffer(k * n)
    data = os.urandom(k * n)
    _fill(a, loc, data)
    locs = [loc + i * n for i in range(k)]
    rems = [rem + (k - 1 - i) * n for i in range(k)]              # reversed on the peer
    assert a.batch_transfer_sync_write(s, locs, rems, [n] * k) == 0
    want = b"".join(data[(k - 1 - i) * n:(k - i) * n] for i in range(k))
    assert b.read_bytes_from_buffer(rem, k * n) == want
    _fill(a, loc, bytes(k * n))
    assert a.batch_transfer_sync_read(s, locs, rems, [n] * k) == 0
    assert a.read_bytes_from_buffer(loc, k * n) == data

    b1 = a.batch_transfer_async_write(s, locs, [r + k * n for r in rems], [n] * k)
    b2 = a.batch_transfer_async(s, locs[:2], rems[:2], [n] * 2, TransferOpcode.READ)
    assert b1 > 0 and b2 > 0 and b1 != b2
    assert a.get_batch_transfer_status([b1, b2]) == 0
    assert a.get_batch_transfer_status([b1]) == CX_EINVAL          # ids are used up
    assert b.read_bytes_from_buffer(rem + k * n, k * n) == want
    b3 = a.batch_transfer_async_read(s, locs, rems, [n] * k)
    assert b3 > 0 and a.get_batch_transfer_status(b3) == 0
    # a bad entry: out of the peer's region
    b4 = a.batch_transfer_async_read(s, [loc], [rem + (1 << 20)], [n])
    assert b4 == 0 or a.get_batch_transfer_status([b4]) < 0
    with pytest.raises(ValueError):
        a.batch_transfer_async_write(s, locs, rems[:1], [n] * k)


def test_async_to_unreachable_and_unknown_peers(two):
    a, _ = two
    loc = a.allocate_managed_buffer(64)
    dead = _dead_peer()
    bid = a.batch_transfer_async_write(dead, [loc], [4096], [64])
    assert bid == 0 or a.get_batch_transfer_status([bid]) < 0
    bid = a.transfer_submit_write(dead, loc, 4096, 64)
    if bid >= 0:
        deadline = time.monotonic() + 30
        st = 0
        while st == 0 and time.monotonic() < deadline:
            st = a.transfer_check_status(bid)
            time.sleep(0.005)
        assert st in (-1, -2)
    assert a.batch_transfer_async_read("nobody|0|0|0", [loc], [4096], [64]) == 0
    assert a.transfer_submit_read("nobody|0|0|0", loc, 4096, 64) < 0
    assert a.transfer_check_status(987654) == -1                  # unknown id
    assert a.get_batch_transfer_status([987654]) == CX_EINVAL


def test_submit_and_check_status(two):
    a, b = two
    s = b.get_session_id()
    rem = a.get_first_buffer_address(s)
    loc = a.allocate_managed_buffer(1 << 16)
    _fill(a, loc, b"s" * (1 << 16))
    for submit in (a.transfer_submit_write, a.transfer_submit_read):
        bid = submit(s, loc, rem, 1 << 16)
        assert bid > 0
        deadline = time.monotonic() + 30
        st = 0
        while st == 0 and time.monotonic() < deadline:
            st = a.transfer_check_status(bid)
            time.sleep(0.001)
        assert st == 1
        assert a.transfer_check_status(bid) == -1                 # used up
    assert b.read_bytes_from_buffer(rem, 1 << 16) == b"s" * (1 << 16)


def test_send_probe(two):
    a, b = two
    assert a.send_probe(b.get_session_id()) == 0
    assert a.send_probe(b.get_session_id()) == 0                  # already up: at once
    assert a.send_probe(_dead_peer()) != 0
    assert a.send_probe("nobody|0|0|0") != 0
    assert a.send_probe("no-port-here") != 0


def test_memory_registration_and_buffers(two):
    a, _ = two
    bufs = [bytearray(4096) for _ in range(3)]
    assert a.batch_register_memory(bufs, [4096] * 3) == 0
    assert a.register_memory(bufs[0], 4096) != 0                   # overlaps: refused
    assert a.batch_unregister_memory(bufs) == 0
    assert a.batch_unregister_memory(bufs) != 0                    # none registered now
    # a failure part-way leaves nothing of the batch registered
    assert a.register_memory(bufs[1], 4096) == 0
    assert a.batch_register_memory(bufs, [4096] * 3) != 0
    assert a.register_memory(bufs[0], 4096) == 0 and a.unregister_memory(bufs[0]) == 0
    assert a.unregister_memory(bufs[1]) == 0
    assert a.allocate_managed_buffer(2 << 20) != 0                 # a second arena
    big = a.allocate_managed_buffer(1 << 50)                       # cannot be had: 0
    assert big == 0


def test_on_cuda_calls_without_a_stream(two):
    a, b = two
    s = b.get_session_id()
    rem = a.get_first_buffer_address(s)
    loc = a.allocate_managed_buffer(128)
    _fill(a, loc, b"c" * 128)
    assert a.transfer_write_on_cuda(s, loc, rem, 128) is None
    assert a.transfer_read_on_cuda(s, loc, rem, 128) is None
    assert a.batch_transfer_write_on_cuda(s, [loc], [rem], [128], 0) is None
    assert a.batch_transfer_read_on_cuda(s, [loc], [rem], [128], 0) is None
    with pytest.raises(RuntimeError):
        a.transfer_write_on_cuda(s, loc, rem + (1 << 20), 128)


def test_module_mapping_in_process():
    import connex_c.mooncake as mc
    saved = {k: sys.modules.get(k) for k in ("mooncake", "mooncake.engine")}
    try:
        mc.install()
        from mooncake.engine import TransferEngine as TE, TransferOpcode as OP
        from mooncake import engine
        assert TE is TransferEngine and OP.WRITE == 1 and engine.SUPPORT_CUDA is True
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_mooncake_style_target_and_initiator_unchanged():
    """tests/mooncake_style: a target and an initiator test written against `mooncake.engine`,
    run with python/shim on PYTHONPATH and nothing else changed."""
    tport, iport = stable_port(), stable_port()
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([os.path.join(PKG_ROOT, "shim"), PKG_ROOT]),
               TARGET_SERVER_NAME="127.0.0.1:%d" % tport,
               INITIATOR_SERVER_NAME="127.0.0.1:%d" % iport,
               MC_METADATA_SERVER="P2PHANDSHAKE", PROTOCOL="tcp", TARGET_LIFETIME_S="120")
    env["CONNEX_LIB"] = os.path.abspath(connex_c.library_path())   # the initiator runs elsewhere
    target = subprocess.Popen([sys.executable, os.path.join(HERE, "mooncake_style", "target.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = target.stdout.readline()
        assert "target ready" in line, line
        r = subprocess.run([sys.executable, "-m", "unittest", "-v", "initiator_test"],
                           cwd=os.path.join(HERE, "mooncake_style"), env=env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Ran 6 tests" in r.stderr and "OK" in r.stderr
    finally:
        if target.poll() is None:
            target.stdin.write("exit\n")
            target.stdin.flush()
            try:
                target.wait(10)
            except subprocess.TimeoutExpired:
                target.kill()
                target.wait(10)
    assert target.returncode == 0
