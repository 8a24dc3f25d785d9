"""The Mooncake-style surface, used the way pipeline code uses it: stage 0 stages activations in a
managed buffer, stage 1 reads them with transfer_sync_read, stage 0 frees the slot."""

import os

import pytest

from conftest import HB_MS, HB_TIMEOUT_MS

from connex_c import CX_EINVAL, CX_EUNSUPPORTED, TransferEngine, default_lid


@pytest.fixture
def te():
    t = TransferEngine(heartbeat_ms=HB_MS, heartbeat_timeout_ms=HB_TIMEOUT_MS)
    assert t.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    yield t
    t.close()


def test_pipeline_stage_read_free(te, peers):
    stage0 = peers.start("--te")
    session = stage0.hello["session"]                 # "127.0.0.1:<port>", as Mooncake's
    port = stage0.hello["port"]
    assert session == "127.0.0.1:%d" % port
    assert stage0.hello["url"] == "127.0.0.1:%d#te-127.0.0.1|0|0|%d" % (port, port)

    port1 = te.get_rpc_port()
    assert te.get_local_url().endswith("#%s|0|0|%d" % default_lid("127.0.0.1", port1)[0::3])

    for step in range(5):
        data = os.urandom(100000 + step * 4093)
        slot = stage0.request("stage", data=data.hex())
        assert slot["rc"] == 0 and slot["addr"]
        dst = te.allocate_managed_buffer(len(data))
        assert dst
        assert te.transfer_sync_read(session, dst, slot["addr"], len(data)) == 0
        assert te.read_bytes_from_buffer(dst, len(data)) == data
        freed = stage0.request("free", addr=slot["addr"], len=slot["len"])
        assert freed["rc"] == 0 and freed["pool"]["allocated"] == 0
        assert te.free_managed_buffer(dst, len(data)) == 0
    assert freed["pool"]["arenas"] == 1, "slots are reused, not re-registered"

    # the other direction: push into a slot the peer allocated
    data = os.urandom(8192)
    slot = stage0.request("stage", data=bytes(8192).hex())
    src = te.allocate_managed_buffer(8192)
    assert te.write_bytes_to_buffer(src, data, 8192) == 0
    assert te.transfer_sync_write(session, src, slot["addr"], 8192) == 0
    assert bytes.fromhex(stage0.request("peek", addr=slot["addr"], len=8192)["hex"]) == data
    assert te.batch_transfer_sync_read(session, [src, src + 4096], [slot["addr"]] * 2,
                                       [4096, 4096]) == 0
    assert te.read_bytes_from_buffer(src, 8192) == data[:4096] * 2
    assert te.free_managed_buffer(src, 8192) == 0


def test_user_registered_memory(te, peers):
    stage0 = peers.start("--te")
    slot = stage0.request("stage", data=b"abcdefgh".hex() * 512)
    buf = bytearray(4096)
    assert te.register_memory(buf, 4096) == 0
    assert te.transfer_sync_read(stage0.hello["session"], buf, slot["addr"], 4096) == 0
    assert buf == b"abcdefgh" * 512
    assert te.unregister_memory(buf) == 0


def test_transfer_engine_bad_arguments(te):
    with pytest.raises(ValueError):
        te.write_bytes_to_buffer(4096, b"x", 1)          # not memory this engine knows
    with pytest.raises(ValueError):
        te.read_bytes_from_buffer(4096, 1)
    a = te.allocate_managed_buffer(64)
    with pytest.raises(ValueError):
        te.write_bytes_to_buffer(a, b"xy", 3)            # length beyond the data given
    with pytest.raises(TypeError):
        te.write_bytes_to_buffer(a, "text", 4)
    assert te.free_managed_buffer(a, 128) == CX_EINVAL   # wrong length
    assert te.free_managed_buffer(a + 8, 64) == CX_EINVAL
    assert te.free_managed_buffer(a, 64) == 0
    assert te.free_managed_buffer(a, 64) == CX_EINVAL    # twice
    with pytest.raises(ValueError):
        te.transfer_sync_read("127.0.0.1", a, 4096, 8)   # target without a port
    with pytest.raises(ValueError):
        te.transfer_sync_read("127.0.0.1:notaport", a, 4096, 8)
    with pytest.raises(TypeError):
        te.transfer_sync_read(None, a, 4096, 8)


def test_initialize_forms():
    t = TransferEngine()
    with pytest.raises(RuntimeError):
        t.get_rpc_port()                                  # before initialize
    with pytest.raises(ValueError):
        t.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "")
    with pytest.raises(ValueError):
        t.initialize("127.0.0.1:99999", "P2PHANDSHAKE", "tcp", "")
    assert t.initialize("127.0.0.1", "etcd://10.0.0.1:2379", "tcp", "") == CX_EUNSUPPORTED
    assert t.initialize("127.0.0.1:0#llama|1|0|2", "P2PHANDSHAKE", "tcp", "mlx5_0") == 0
    assert t.get_local_url().endswith("#llama|1|0|2")
    t.close()
    t = TransferEngine()
    assert t.initialize("localhost", "llama|3|0|0", "auto", "") == 0
    assert t.get_local_url().startswith("127.0.0.1:")
    assert t.get_local_url().endswith("#llama|3|0|0")
    t.close()
