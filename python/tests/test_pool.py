"""The managed-buffer allocator alone (no library needed)."""

import ctypes

from connex_c._pool import ALIGN, ManagedPool


class FakeReg:
    def __init__(self, fail=False):
        self.regs = {}
        self.fail = fail

    def register(self, addr, n):
        if self.fail:
            return -5
        self.regs[addr] = n
        return 0

    def unregister(self, addr):
        return 0 if self.regs.pop(addr, None) else -4


def test_alloc_free_reuse_and_merge():
    r = FakeReg()
    pool = ManagedPool(r.register, r.unregister, 1 << 16)
    a = pool.allocate(100)
    b = pool.allocate(1000)
    c = pool.allocate(ALIGN)
    assert a and b and c
    assert len(r.regs) == 1, "one arena registered for small buffers"
    assert a % ALIGN == 0 and b % ALIGN == 0 and c % ALIGN == 0
    assert b >= a + 100 and c >= b + 1000, "no overlap"
    ctypes.memset(b, 0x5A, 1000)
    assert ctypes.string_at(b, 1000) == b"\x5a" * 1000
    assert pool.free(b, 1000)
    assert not pool.free(b, 1000), "double free refused"
    assert not pool.free(a, 5000), "wrong length refused"
    assert pool.free(a, 100) and pool.free(c, ALIGN)
    st = pool.stats()
    assert st["allocated"] == 0 and st["allocated_bytes"] == 0
    # everything merged back: the whole arena is one block again
    big = pool.allocate(1 << 16)
    assert big == min(a, b, c)
    pool.close()
    assert r.regs == {}


def test_grows_with_a_new_arena_and_fails_cleanly():
    r = FakeReg()
    pool = ManagedPool(r.register, r.unregister, 1 << 12)
    x = pool.allocate(1 << 12)
    y = pool.allocate(3 << 12)          # larger than an arena: its own arena
    assert x and y and len(r.regs) == 2
    assert pool.contains(y, 3 << 12) and not pool.contains(y, (3 << 12) + 1)
    pool.close()
    bad = ManagedPool(FakeReg(fail=True).register, r.unregister, 1 << 12)
    assert bad.allocate(10) == 0, "registration failure gives 0, as Mooncake"
