"""Tensors from Python: DLPack and __cuda_array_interface__ objects as buffers of every
Engine/TransferEngine call, device memory recognised as such (the simulated device), lengths
taken from the object, non-contiguous memory refused."""

import os

import pytest

from conftest import HB_MS, HB_TIMEOUT_MS
from tensors import DLPackOnly, SimTensor

import connex_c
from connex_c import Engine, TransferEngine
from connex_c._lib import lib as cxlib

try:
    import numpy as np
except ImportError:          # python3-numpy
    np = None

needs_numpy = pytest.mark.skipif(np is None, reason="python3-numpy not installed")
N = 1 << 16


@pytest.fixture
def pair():
    a = Engine("tensor-a", heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS)
    b = Engine("tensor-b", heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS)
    yield a, b
    b.close()
    a.close()


@pytest.fixture
def sim():
    made = []

    def make(n, **kw):
        t = SimTensor(n, **kw)
        made.append(t)
        return t
    yield make
    for t in made:
        t.free()


@needs_numpy
def test_numpy_and_dlpack_only_lengths_from_the_object(pair):
    a, b = pair
    src = np.frombuffer(os.urandom(N), dtype=np.uint8).copy()
    dst = np.zeros(N // 4, dtype=np.float32)           # the same bytes, another dtype
    assert b.register_memory(src) == 0                # length from the array
    assert a.register_memory(DLPackOnly(dst)) == 0    # length from the DLPack capsule
    assert a.memory_kind(DLPackOnly(dst)) == "host"
    assert a.transfer_sync_read(b.local_url, DLPackOnly(dst), src.ctypes.data) == 0
    assert dst.tobytes() == src.tobytes()
    part = DLPackOnly(dst[16:32])                     # a contiguous slice: its own length
    assert a.transfer_sync_write(b.local_url, part, src.ctypes.data) == 0
    assert src[:64].tobytes() == dst[16:32].tobytes()
    h = a.write_async(b.local_url, part, src.ctypes.data + 64)
    assert h.wait(10000) == 0
    assert a.unregister_memory(DLPackOnly(dst)) == 0
    assert b.unregister_memory(src) == 0


@needs_numpy
def test_non_contiguous_is_refused(pair):
    a, _ = pair
    arr = np.zeros((64, 64), dtype=np.uint8)
    with pytest.raises(ValueError, match="contiguous"):
        a.register_memory(arr[:, ::2])
    with pytest.raises(ValueError, match="contiguous"):
        a.register_memory(DLPackOnly(arr[:, ::2]))
    with pytest.raises(ValueError, match="contiguous"):
        a.register_memory(DLPackOnly(arr.T))
    assert a.register_memory(DLPackOnly(arr[3:5])) == 0   # rows of a C array are one block


def test_sim_device_through_dlpack_and_cai(pair, sim):
    a, b = pair
    dev_b = sim(N, cai=False)                          # DLPack only
    dev_a = sim(N, dlpack=False)                       # __cuda_array_interface__ only
    assert not hasattr(dev_b, "__cuda_array_interface__")
    assert not hasattr(dev_a, "__dlpack__")
    assert b.memory_kind(dev_b) == "sim" and a.memory_kind(dev_a) == "sim"
    assert b.register_memory(dev_b) == 0
    assert a.register_memory(dev_a) == 0
    data = os.urandom(N)
    dev_b.write(data)
    # device <- device across the pair: the core stages both sides (docs/gpu.md)
    assert a.transfer_sync_read(b.local_url, dev_a, dev_b.ptr) == 0
    assert dev_a.read() == data
    dev_a.write(data[::-1])
    assert a.transfer_sync_write(b.local_url, dev_a, dev_b.ptr + 4096, 4096) == 0
    assert dev_b.read()[4096:8192] == data[::-1][:4096]
    assert a.put_signal(b.local_url, dev_a, dev_b.ptr, None, b"sig").wait(10000) == 0
    m = b.recv_msg(5000)
    assert m is not None and m.data == b"sig" and dev_b.read() == data[::-1]
    assert a.unregister_memory(dev_a) == 0 and b.unregister_memory(dev_b) == 0


def test_tensor_shapes_and_bad_tensors(pair, sim):
    a, _ = pair
    t = sim(4096, shape=(16, 64), itemsize=4, strides=(64, 1), dlpack=True, cai=False)
    assert a.register_memory(t) == 0 and a.unregister_memory(t) == 0
    t2 = sim(4096, shape=(16, 32), itemsize=4, strides=(64, 1), cai=False)  # every other row
    with pytest.raises(ValueError, match="contiguous"):
        a.register_memory(t2)
    t3 = sim(4096, shape=(16, 32), itemsize=4, strides=(64, 1), dlpack=False)
    with pytest.raises(ValueError, match="contiguous"):
        a.register_memory(t3)
    rocm = sim(4096, cai=False, device_type=10)
    with pytest.raises(ValueError, match="rocm"):
        a.register_memory(rocm)
    t4 = sim(4096, cai=False)
    with pytest.raises(ValueError, match="exceeds"):
        a.register_memory(t4, 8192)


@needs_numpy
def test_device_claim_over_host_memory_is_refused(pair):
    """An object that says it is CUDA memory where libconnex sees host memory (no usable CUDA
    here) is refused: registering it as host memory would let the binding memcpy into it."""
    a, _ = pair
    arr = np.zeros(4096, dtype=np.uint8)

    class FakeCuda:
        __cuda_array_interface__ = {"shape": (4096,), "typestr": "|u1",
                                    "data": (arr.ctypes.data, False), "version": 3}
    with pytest.raises(ValueError, match="host memory"):
        a.register_memory(FakeCuda())

    class ReadOnly:
        __cuda_array_interface__ = {"shape": (4096,), "typestr": "|u1",
                                    "data": (arr.ctypes.data, True), "version": 3}
    with pytest.raises(ValueError, match="read-only"):
        a.transfer_sync_read("127.0.0.1:1#x|0|0|0", ReadOnly(), 4096)


def test_transfer_engine_device_managed_buffers():
    """TransferEngine(buffer_device="sim"): managed buffers are device memory; the byte helpers
    copy through libconnex; transfers move device to device; tensors are accepted as buffers."""
    kw = dict(heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS, pool_bytes=1 << 20)
    with TransferEngine(buffer_device="sim", **kw) as a, \
            TransferEngine(buffer_device="sim", **kw) as b:
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        x = a.allocate_managed_buffer(8192)
        y = b.allocate_managed_buffer(8192)
        assert x and y
        assert a.get_engine().memory_kind(x, 8192) == "sim"
        data = os.urandom(8192)
        assert a.write_bytes_to_buffer(x, data, 8192) == 0
        assert a.read_bytes_from_buffer(x, 8192) == data
        assert a.transfer_sync_write(b.get_session_id(), x, y, 8192) == 0
        assert b.read_bytes_from_buffer(y, 8192) == data
        dev = SimTensor(4096, cai=False)
        try:
            assert a.register_memory(dev) == 0                 # capacity from the tensor
            assert a.transfer_sync_read(b.get_session_id(), dev, y) == 0   # length too
            assert dev.read() == data[:4096]
            assert a.unregister_memory(dev) == 0
        finally:
            dev.free()
    with pytest.raises(ValueError):
        TransferEngine(buffer_device="tpu")


def test_cuda_managed_buffers_without_cuda_fail_cleanly():
    """buffer_device="cuda" where no CUDA device is usable: initialize returns CX_ENOMEM (the
    pool cannot be had) and says why; nothing is left running."""
    if cxlib().cx_mem_kind(b"x", 1) != 0:
        pytest.skip("unexpected memory kind for host memory")
    import ctypes
    p = ctypes.c_void_p()
    if cxlib().cx_mem_alloc(connex_c.CX_MEM_CUDA, 0, 4096, ctypes.byref(p)) == 0:
        cxlib().cx_mem_free(p)
        pytest.skip("a CUDA device is usable here")
    te = TransferEngine(buffer_device="cuda:0", pool_bytes=1 << 20)
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == connex_c.CX_ENOMEM
    assert te.engine is None


def test_no_torch_import():
    import subprocess
    import sys
    code = ("import sys, connex_c, connex_c.mooncake\n"
            "e = connex_c.Engine('notorch')\n"
            "b = bytearray(64); e.register_memory(b); e.close()\n"
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]
