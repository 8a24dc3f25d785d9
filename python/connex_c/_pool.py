"""The registered arena behind TransferEngine.allocate_managed_buffer.

Registration is expensive (pinning, a key per backend, a HELLO update to every peer), so managed
buffers are carved out of a few large registered arenas instead of registered one by one:
first fit, 64-byte aligned, neighbours merged on free. A host arena is anonymous mmap memory
(page aligned, zero filled); a device arena comes from cx_mem_alloc (CUDA, or the simulated
device). Either lives until the pool is closed."""

import bisect
import ctypes
import mmap
import threading

ALIGN = 64


def _round(n, a):
    return (n + a - 1) // a * a


class _Arena:
    def __init__(self, size):
        self.mm = mmap.mmap(-1, size)
        self.cbuf = (ctypes.c_char * size).from_buffer(self.mm)
        self.base = ctypes.addressof(self.cbuf)
        self.size = size
        self.free = [(0, size)]          # sorted (offset, length)

    def alloc(self, n):
        for i, (off, ln) in enumerate(self.free):
            if ln >= n:
                if ln == n:
                    del self.free[i]
                else:
                    self.free[i] = (off + n, ln - n)
                return self.base + off
        return 0

    def release(self, addr, n):
        off = addr - self.base
        i = bisect.bisect_left(self.free, (off, 0))
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:
            i -= 1
            off, n = self.free[i][0], self.free[i][1] + n
            del self.free[i]
        if i < len(self.free) and off + n == self.free[i][0]:
            n += self.free[i][1]
            del self.free[i]
        self.free.insert(i, (off, n))

    def close(self):
        del self.cbuf
        self.mm.close()


class _DeviceArena(_Arena):
    """size bytes of device memory: kind CX_MEM_CUDA or CX_MEM_SIM, from libconnex."""

    def __init__(self, size, lib, kind, device):
        p = ctypes.c_void_p()
        rc = lib.cx_mem_alloc(kind, device, size, ctypes.byref(p))
        if rc != 0:
            raise MemoryError("cx_mem_alloc(kind %d, device %d, %d bytes): %d"
                              % (kind, device, size, rc))
        self._lib = lib
        self.base = p.value
        self.size = size
        self.free = [(0, size)]

    def close(self):
        if self.base:
            self._lib.cx_mem_free(self.base)
            self.base = 0


class ManagedPool:
    """Sub-allocates registered arenas. register(addr, size) and unregister(addr) are the
    engine's; they return 0 or a negative code."""

    def __init__(self, register, unregister, arena_bytes, new_arena=None):
        """new_arena(size) makes an arena (default: host memory); it may raise MemoryError."""
        self._register = register
        self._unregister = unregister
        self._arena_bytes = arena_bytes
        self._new_arena = new_arena or _Arena
        self._arenas = []
        self._live = {}                  # address -> (arena, rounded length)
        self._lock = threading.Lock()

    def allocate(self, length):
        """An address of `length` bytes in registered memory, or 0 when none can be had."""
        n = _round(max(length, 1), ALIGN)
        with self._lock:
            for a in self._arenas:
                addr = a.alloc(n)
                if addr:
                    self._live[addr] = (a, n)
                    return addr
            try:
                a = self._new_arena(max(self._arena_bytes, _round(n, mmap.PAGESIZE)))
            except (MemoryError, OSError):
                return 0
            if self._register(a.base, a.size) != 0:
                a.close()
                return 0
            self._arenas.append(a)
            addr = a.alloc(n)
            self._live[addr] = (a, n)
            return addr

    def reserve(self):
        """Register the first arena now (it is the engine's first region, which peers find
        with get_first_buffer_address). True when the pool has an arena."""
        with self._lock:
            if self._arenas:
                return True
            try:
                a = self._new_arena(self._arena_bytes)
            except (MemoryError, OSError):
                return False
            if self._register(a.base, a.size) != 0:
                a.close()
                return False
            self._arenas.append(a)
            return True

    def first_arena(self):
        """(base, size) of the first arena, or None."""
        with self._lock:
            return (self._arenas[0].base, self._arenas[0].size) if self._arenas else None

    def free(self, addr, length):
        """True when addr was allocated here with this length, and is now free."""
        with self._lock:
            ent = self._live.get(addr)
            if ent is None or _round(max(length, 1), ALIGN) != ent[1]:
                return False
            del self._live[addr]
            ent[0].release(addr, ent[1])
            return True

    def contains(self, addr, length):
        """Whether [addr, addr+length) lies inside one arena (for the byte copy helpers)."""
        with self._lock:
            return any(a.base <= addr and addr + length <= a.base + a.size for a in self._arenas)

    def stats(self):
        with self._lock:
            return {"arenas": len(self._arenas), "arena_bytes": sum(a.size for a in self._arenas),
                    "allocated": len(self._live),
                    "allocated_bytes": sum(n for _, n in self._live.values())}

    def close(self, engine_alive=True):
        with self._lock:
            for a in self._arenas:
                if engine_alive:
                    self._unregister(a.base)
                a.close()
            self._arenas = []
            self._live = {}
