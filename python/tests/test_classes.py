"""Traffic classes through connex_c: read_async / write_async in both classes, chunk counts,
bad classes refused before the call."""

import pytest

from peer import pattern

from connex_c import CX_CLASS_BACKGROUND, CX_CLASS_CRITICAL, Engine

N = 3 * (1 << 20) + 5     # not a multiple of the chunk


def test_async_both_classes(peers):
    e = Engine("pytest", stage=10, background_chunk=1 << 20)
    try:
        peer = peers.start("--model", "stage0", "--size", N, "--seed", 5)
        remote = peer.hello["addr"]
        buf = bytearray(N)
        assert e.register_memory(buf) == 0
        for cls in (CX_CLASS_CRITICAL, CX_CLASS_BACKGROUND):
            buf[:] = bytes(N)
            before = e.stats()["background_chunks"]
            h = e.read_async(peer.url, buf, remote, N, cls)
            assert h.wait() == 0
            assert buf == pattern(N, 5)
            chunks = e.stats()["background_chunks"] - before
            # 4 chunks of 1 MiB, more when the critical read just before made them smaller
            assert chunks >= 4 if cls == CX_CLASS_BACKGROUND else chunks == 0
        src = pattern(65536, 9)
        buf[:65536] = src
        h = e.write_async(peer.url, buf, remote + 4096, 65536, CX_CLASS_BACKGROUND)
        assert h.wait() == 0
        assert bytes.fromhex(peer.request("dump", off=4096, n=65536)["hex"]) == src
        assert e.stats()["ops_in_flight"] == 0
        with pytest.raises(ValueError):
            e.read_async(peer.url, buf, remote, 16, 2)
        with pytest.raises(TypeError):
            e.read_async(peer.url, buf, remote, 16, "background")
        assert e.unregister_memory(buf) == 0
    finally:
        e.close()


def test_classes_off_config():
    e = Engine("pytest", stage=11, classes_off=True, credits_critical=3, credits_background=1)
    e.close()
