"""Two processes moving bytes through connex_c.Engine, with verification."""

import ctypes
import json
import threading
import time

import pytest

from conftest import wait_event_type
from peer import pattern

from connex_c import Engine

try:
    import numpy as np
except ImportError:          # python3-numpy
    np = None

N = 1 << 20


def _addr(buf):
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def test_read_write_between_processes(engine, peers):
    peer = peers.start("--model", "stage0", "--size", N, "--seed", 3)
    remote = peer.hello["addr"]
    assert peer.hello["rc"] == 0
    buf = bytearray(N)
    assert engine.register_memory(buf) == 0

    t0 = time.monotonic()
    assert engine.transfer_sync_read(peer.url, buf, remote, N) == 0
    dt = time.monotonic() - t0
    assert buf == pattern(N, 3)
    print("read 1 MiB: %.2f ms (first op includes connect)" % (dt * 1e3))

    # sub-ranges through raw addresses, at odd offsets on both sides
    base = _addr(buf)
    buf[:] = bytes(N)
    assert engine.transfer_sync_read(peer.url, base + 100, remote + 5001, 1000) == 0
    assert buf[100:1100] == pattern(N, 3)[5001:6001]
    assert buf[:100] == bytes(100) and buf[1100:1200] == bytes(100)

    # write, then have the peer show what it holds
    src = pattern(65536, 9)
    buf[:65536] = src
    assert engine.transfer_sync_write(peer.url, buf, remote + 4096, 65536) == 0
    got = bytes.fromhex(peer.request("dump", off=4096, n=65536)["hex"])
    assert got == src
    before = bytes.fromhex(peer.request("dump", off=0, n=4096)["hex"])
    assert before == pattern(N, 3)[:4096], "bytes outside the write untouched"

    # out of the peer's region: refused by the peer's bounds check, not a crash
    assert engine.transfer_sync_read(peer.url, buf, remote + N - 10, 100) < 0

    st = engine.stats()
    assert st["ops"]["read"] >= 2 and st["ops"]["write"] >= 1
    assert st["bytes"]["read"] >= N + 1000 and st["bytes"]["write"] >= 65536
    assert st["regions"] == 1 and st["registered_bytes"] == N
    assert st["peers_up"] == 1
    assert engine.peer_state(peer.url) == "up"
    assert engine.peer_backend(peer.url)
    listed = [p for p in engine.peers() if p["url"] == peer.url]
    assert len(listed) == 1
    assert listed[0]["lid"] == ("stage0", 0, 0, 0) and listed[0]["state"] == "up"
    assert listed[0]["backend"] == engine.peer_backend(peer.url) and listed[0]["why"]
    assert listed[0]["incarnation"] != 0 and listed[0]["same_host"] is True

    ev, _ = wait_event_type(engine, "up", ("stage0", 0, 0, 0))
    assert ev["url"] == peer.url
    peer.exit()
    ev, _ = wait_event_type(engine, "left", ("stage0", 0, 0, 0))


def test_batches(engine, peers):
    peer = peers.start("--model", "batch", "--size", N, "--seed", 4)
    remote = peer.hello["addr"]
    buf = bytearray(N)
    assert engine.register_memory(buf) == 0
    base = _addr(buf)
    want = pattern(N, 4)
    # 128 x 4 KiB reads, addresses as lists, then as numpy arrays
    offs = [i * 4096 + (i % 3) for i in range(128)]
    st = engine.transfer_batch_read(peer.url, [base + o for o in offs], [remote + o for o in offs],
                                    [4096] * 128)
    assert st == [0] * 128
    for o in offs:
        assert buf[o:o + 4096] == want[o:o + 4096]
    if np is not None:
        buf[:] = bytes(N)
        o = np.arange(64, dtype=np.uint64) * 8192
        st = engine.transfer_batch_read(peer.url, base + o,
                                        remote + o, np.full(64, 8192, dtype=np.int64))
        assert st == [0] * 64 and buf[:8192] == want[:8192]
    # writes, checked at the peer
    src = pattern(65536, 21)
    buf[:65536] = src
    st = engine.transfer_batch_write(peer.url, [base + i * 16384 for i in range(4)],
                                     [remote + 4096 + i * 16384 for i in range(4)], [16384] * 4)
    assert st == [0] * 4
    assert bytes.fromhex(peer.request("dump", off=4096, n=65536)["hex"]) == src
    # a bad entry refuses the whole batch, nothing moves
    st = engine.transfer_batch_write(peer.url, [base, base + 4096], [remote + 200000, remote + N],
                                     [4096, 4096])
    assert st == [-4, -4]
    assert bytes.fromhex(peer.request("dump", off=200000, n=4096)["hex"]) == want[200000:204096]
    # batch put_signal: the message arrives after every entry
    peer.send("recv", timeout=10000, snap=True)
    spec = json.dumps({"off": 0, "n": 65536}).encode()
    buf[:65536] = pattern(65536, 33)
    h = engine.batch_put_signal(peer.url, [base + i * 8192 for i in range(8)],
                                [remote + i * 8192 for i in range(8)], [8192] * 8, spec)
    assert h.wait(10000) == 0
    assert h.statuses == [0] * 8
    r = peer.read()
    assert bytes.fromhex(r["msg"]) == spec
    assert bytes.fromhex(r["snap"]) == bytes(buf[:65536]), "the message arrived before its data"
    with pytest.raises(ValueError):
        engine.transfer_batch_read(peer.url, [base], [remote, remote], [1])
    with pytest.raises(TypeError):
        engine.transfer_batch_read(peer.url, ["x"], [remote], [1])


def test_put_signal_data_before_message(engine, peers):
    peer = peers.start("--model", "sig", "--size", N, "--seed", 1)
    remote = peer.hello["addr"]
    buf = bytearray(pattern(N, 77))
    assert engine.register_memory(buf) == 0
    assert engine.connect(peer.url, 5000) == 0
    for i, (off, n) in enumerate([(0, 4096), (8192, 300000), (N - 512, 512)]):
        peer.send("recv", timeout=10000, snap=True)      # the peer waits in recv_msg
        spec = json.dumps({"off": off, "n": n, "i": i}).encode()
        h = engine.put_signal(peer.url, _addr(buf) + off, remote + off, n, spec)
        assert h.wait(10000) == 0
        assert h.done and h.wait(0) == 0, "the status stays readable"
        r = peer.read()
        assert bytes.fromhex(r["msg"]) == spec
        assert bytes.fromhex(r["snap"]) == bytes(buf[off:off + n]), \
            "the message arrived before its data"
        assert tuple(r["peer"]) == ("pytest", 9, 0, 0)
        assert r["url"] == engine.local_url
    # unbounded wait in the caller's thread
    peer.send("recv", timeout=10000)
    assert engine.put_signal(peer.url, buf, remote, 16, b"x").wait() == 0
    assert peer.read()["msg"] == b"x".hex()
    assert engine.stats()["ops"]["put_signal"] == 4


def test_messages_both_ways_and_lid_forms(engine, peers):
    peer = peers.start("--model", "msg", "--stage", 2)
    assert engine.send_msg(peer.url, b"hello") == 0
    r = peer.request("recv", timeout=5000)
    assert bytes.fromhex(r["msg"]) == b"hello"
    # once known, the bare LID (string or tuple) names the peer
    assert engine.send_msg("msg|2|0|0", b"by lid") == 0
    assert bytes.fromhex(peer.request("recv")["msg"]) == b"by lid"
    assert engine.send_msg(("msg", 2, 0, 0), bytearray(b"by tuple")) == 0
    assert bytes.fromhex(peer.request("recv")["msg"]) == b"by tuple"
    assert engine.send_msg(peer.url, b"") == 0
    assert peer.request("recv")["msg"] == ""
    big = pattern((1 << 20) + 1, 5)
    assert engine.send_msg(peer.url, big) == 0
    assert bytes.fromhex(peer.request("recv", timeout=10000)["msg"]) == big

    assert peer.request("send", to=engine.local_url, data=b"back".hex())["rc"] == 0
    m = engine.recv_msg(5000)
    assert m is not None and m.data == b"back"
    assert m.peer == ("msg", 2, 0, 0) and m.url == peer.url
    assert engine.recv_msg(50) is None


@pytest.mark.skipif(np is None, reason="numpy not installed (python3-numpy)")
def test_numpy_buffers(engine, peers):
    peer = peers.start("--model", "np", "--size", N, "--seed", 11)
    arr = np.zeros((256, 1024), dtype=np.float32)       # 1 MiB, 2-D
    assert engine.register_memory(arr) == 0
    assert engine.transfer_sync_read(peer.url, arr, peer.hello["addr"], N) == 0
    assert arr.tobytes() == pattern(N, 11)
    row = arr[3]                                         # a view into the registered array
    row[:] = 1.5
    assert engine.transfer_sync_write(peer.url, row, peer.hello["addr"], row.nbytes) == 0
    got = np.frombuffer(bytes.fromhex(peer.request("dump", off=0, n=row.nbytes)["hex"]),
                        dtype=np.float32)
    assert (got == 1.5).all()
    with pytest.raises(ValueError):
        engine.transfer_sync_read(peer.url, arr[:, ::2], peer.hello["addr"], 16)
    ro = arr[5]
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        engine.transfer_sync_read(peer.url, ro, peer.hello["addr"], 16)
    assert engine.transfer_sync_write(peer.url, ro, peer.hello["addr"], 16) == 0


class FakeTensor:
    """What the binding uses of a torch.Tensor."""

    def __init__(self, buf):
        self.buf = buf
        self.addr = _addr(buf)

    def data_ptr(self):
        return self.addr

    def element_size(self):
        return 4

    def numel(self):
        return len(self.buf) // 4

    def is_contiguous(self):
        return True


def test_data_ptr_objects(engine, peers):
    peer = peers.start("--model", "tensor", "--size", 8192, "--seed", 4)
    t = FakeTensor(bytearray(8192))
    assert engine.register_memory(t) == 0
    assert engine.transfer_sync_read(peer.url, t, peer.hello["addr"], 8192) == 0
    assert t.buf == pattern(8192, 4)
    with pytest.raises(ValueError):
        engine.transfer_sync_read(peer.url, t, peer.hello["addr"], 8193)


def test_gil_released_while_blocked(engine, peers):
    peer = peers.start("--model", "gil")
    assert engine.connect(peer.url, 5000) == 0

    # 1) a counting thread advances while this thread sits in wait_event / recv_msg
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
        while engine.wait_event(0) is not None:
            pass
        assert engine.wait_event(300) is None
        c1 = count[0]
        assert engine.recv_msg(300) is None
        c2 = count[0]
    finally:
        stop.set()
        t.join()
    assert c1 - c0 > 10000 and c2 - c1 > 10000, (c0, c1, c2)

    # 2) the message this thread waits for is produced by another Python thread
    def later():
        time.sleep(0.2)
        peer.request("send", to=engine.local_url, data=b"from-thread".hex())

    t = threading.Thread(target=later)
    t0 = time.monotonic()
    t.start()
    m = engine.recv_msg(10000)
    t.join(10)
    assert m is not None and m.data == b"from-thread"
    assert time.monotonic() - t0 < 5.0


def test_two_engines_in_one_process():
    with Engine("a", heartbeat_ms=100) as a, Engine("b", heartbeat_ms=100) as b:
        buf = bytearray(pattern(4096, 6))
        dst = bytearray(4096)
        assert b.register_memory(buf) == 0 and a.register_memory(dst) == 0
        assert a.transfer_sync_read(b.local_url, dst, _addr(buf), 4096) == 0
        assert dst == buf


def test_wildcard_listen_advertises_given_address():
    """Listening on every interface, the URL carries advertise_ip, and another engine reaches it."""
    with Engine("wild", listen_ip="0.0.0.0", advertise_ip="127.0.0.1", heartbeat_ms=100) as a, \
            Engine("dial", heartbeat_ms=100) as b:
        assert a.local_url.startswith("127.0.0.1:")
        buf = bytearray(pattern(4096, 8))
        dst = bytearray(4096)
        assert a.register_memory(buf) == 0 and b.register_memory(dst) == 0
        assert b.transfer_sync_read(a.local_url, dst, _addr(buf), 4096) == 0
        assert dst == buf
