"""Turning Python arguments into C arguments, with TypeError/ValueError for anything the C layer
would have to guess about. The core checks every pointer against its region registry, so a raw
address that is wrong gives CX_EINVAL, not a crash; the checks here catch what the core cannot
see (a Python buffer shorter than the length asked for, a read-only buffer as a destination)."""

import ctypes

from . import _tensor
from ._lib import CX_MSG_MAX

_U64_MAX = (1 << 64) - 1
_INT_MAX = (1 << 31) - 1


class _Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


class _ReadOnlyView:
    """Holds a PEP 3118 export of a read-only buffer (bytes, a read-only numpy array) so that
    its address stays valid while the C call uses it; ctypes.from_buffer only takes writable
    ones."""

    def __init__(self, obj):
        self._held = False
        self._view = _Py_buffer()
        get = ctypes.pythonapi.PyObject_GetBuffer
        get.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
        get.restype = ctypes.c_int
        get(obj, ctypes.byref(self._view), 0)  # PyBUF_SIMPLE: contiguous bytes
        self._held = True
        self.address = self._view.buf or 0

    def __del__(self):
        if self._held:
            rel = ctypes.pythonapi.PyBuffer_Release
            rel.argtypes = [ctypes.POINTER(_Py_buffer)]
            rel.restype = None
            rel(ctypes.byref(self._view))
            self._held = False


def _name_of(obj):
    return type(obj).__name__


def check_int(value, what, lo=0, hi=_U64_MAX):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an int, not %s" % (what, _name_of(value)))
    if value < lo or value > hi:
        raise ValueError("%s out of range [%d, %d]: %d" % (what, lo, hi, value))
    return value


def length(n, what="length"):
    return check_int(n, what)


def remote_addr(addr, what="remote address"):
    return check_int(addr, what)


def timeout(ms):
    """None or a negative number waits forever (-1); otherwise whole milliseconds."""
    if ms is None:
        return -1
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise TypeError("timeout_ms must be a number or None, not %s" % _name_of(ms))
    if ms != ms:
        raise ValueError("timeout_ms is NaN")
    if ms < 0:
        return -1
    return int(min(ms, _INT_MAX))


class Pointer:
    """A local address, what keeps it valid, the size of the object behind it when known, and
    the device the object says it lives on ("cpu", ("cuda", ordinal), or None for a raw
    address, whose kind only libconnex can tell)."""

    __slots__ = ("address", "size", "keep", "device")

    def __init__(self, address, size=None, keep=None, device=None):
        self.address = address
        self.size = size
        self.keep = keep
        self.device = device

    @property
    def is_device(self):
        return self.device is not None and self.device != "cpu"

    def length(self, n, what):
        """n, or the object's size when n is None; checked against the object's size."""
        if n is None:
            if self.size is None:
                raise TypeError("%s: give the length for a raw address" % what)
            return self.size
        length(n, what + " length")
        self.check_len(n, what)
        return n

    def check_len(self, n, what):
        if self.size is not None and n > self.size:
            raise ValueError("%s: length %d exceeds the %d bytes of the object given"
                             % (what, n, self.size))


def _has(obj, name):
    """hasattr that also says no when the attribute raises something other than
    AttributeError (torch raises for __cuda_array_interface__ of a CPU tensor)."""
    try:
        getattr(obj, name)
    except Exception:
        return False
    return True


def pointer(obj, writable, what="buffer"):
    """Accept an int address, an object with __cuda_array_interface__ (device memory: torch,
    cupy, numba), an object with data_ptr() (torch.Tensor), a buffer-protocol object
    (bytearray, numpy array, mmap, memoryview), or a DLPack object (__dlpack__ and
    __dlpack_device__: jax, cupy, numpy, ...)."""
    if isinstance(obj, bool):
        raise TypeError("%s must be an address, a tensor or a buffer, not bool" % what)
    if isinstance(obj, int):
        if obj <= 0 or obj > _U64_MAX:
            raise ValueError("%s address out of range: %d" % (what, obj))
        return Pointer(obj)
    if isinstance(obj, str):
        raise TypeError("%s must be an address, a tensor or a buffer, not str" % what)
    if _has(obj, "__cuda_array_interface__"):
        return _from_tensor(_tensor.from_cuda_array_interface(obj, what), writable, what)
    if hasattr(obj, "data_ptr") and callable(obj.data_ptr):
        return _tensor_pointer(obj, what)
    try:
        mv = memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
            return _from_tensor(_tensor.from_dlpack(obj, what), writable, what)
        raise TypeError("%s must be an int address, a DLPack object, an object with "
                        "__cuda_array_interface__ or data_ptr(), or a buffer-protocol object, "
                        "not %s" % (what, _name_of(obj))) from None
    with mv:
        if not mv.c_contiguous:
            raise ValueError("%s must be C-contiguous" % what)
        size = mv.nbytes
        readonly = mv.readonly
    if size == 0:
        raise ValueError("%s is empty" % what)
    if readonly:
        if writable:
            raise ValueError("%s is read-only (%s) but is written to" % (what, _name_of(obj)))
        view = _ReadOnlyView(obj)
        return Pointer(view.address, size, view, "cpu")
    # from_buffer pins the object: a bytearray cannot be resized while this export lives.
    with memoryview(obj) as mv2:
        flat = mv2.cast("B") if (mv2.ndim != 1 or mv2.format != "B") else mv2
        cbuf = (ctypes.c_char * size).from_buffer(flat)
    return Pointer(ctypes.addressof(cbuf), size, cbuf, "cpu")


def _from_tensor(t, writable, what):
    if writable and t.readonly:
        raise ValueError("%s is read-only but is written to" % what)
    if t.address > _U64_MAX:
        raise ValueError("%s address out of range: %d" % (what, t.address))
    return Pointer(t.address, t.size, t.keep, t.device)


def _tensor_pointer(t, what):
    addr = t.data_ptr()
    if isinstance(addr, bool) or not isinstance(addr, int):
        raise TypeError("%s.data_ptr() returned %s, not an int" % (what, _name_of(addr)))
    if addr <= 0:
        raise ValueError("%s.data_ptr() is null (empty tensor?)" % what)
    if hasattr(t, "is_contiguous") and not t.is_contiguous():
        raise ValueError("%s is not contiguous" % what)
    size = None
    if hasattr(t, "element_size") and hasattr(t, "numel"):
        size = int(t.element_size()) * int(t.numel())
    elif hasattr(t, "nbytes"):
        size = int(t.nbytes)
    device = None
    dev = getattr(t, "device", None)         # torch.device: .type "cpu" / "cuda", .index
    if getattr(dev, "type", None) == "cpu":
        device = "cpu"
    elif getattr(dev, "type", None) == "cuda":
        device = ("cuda", dev.index if isinstance(dev.index, int) else -1)
    return Pointer(addr, size, t, device)


def message(msg):
    if isinstance(msg, str):
        raise TypeError("message must be bytes-like, not str (encode it)")
    try:
        data = bytes(memoryview(msg))
    except TypeError:
        raise TypeError("message must be bytes-like, not %s" % _name_of(msg)) from None
    if len(data) > CX_MSG_MAX:
        raise ValueError("message of %d bytes exceeds CX_MSG_MAX (%d)" % (len(data), CX_MSG_MAX))
    return data


def peer(p):
    """A URL `ip:port#model|stage|shard|replica`, a bare LID string, or a LID tuple."""
    if isinstance(p, bytes):
        p = p.decode("utf-8")
    if isinstance(p, (tuple, list)):
        if len(p) != 4:
            raise ValueError("a peer LID tuple is (model, stage, shard, replica), got %d items"
                             % len(p))
        model = p[0]
        if not isinstance(model, str):
            raise TypeError("LID model must be str, not %s" % _name_of(model))
        nums = [check_int(x, "LID " + n, 0, 0xFFFFFFFF)
                for x, n in zip(p[1:], ("stage", "shard", "replica"))]
        p = "%s|%d|%d|%d" % (model, nums[0], nums[1], nums[2])
    if not isinstance(p, str):
        raise TypeError("peer must be a URL, a LID string or a LID tuple, not %s" % _name_of(p))
    if not p or "\0" in p:
        raise ValueError("peer must be a non-empty string without NUL: %r" % p)
    return p.encode("utf-8")


def text(s, what, allow_none=True):
    if s is None and allow_none:
        return None
    if not isinstance(s, str):
        raise TypeError("%s must be str, not %s" % (what, _name_of(s)))
    if "\0" in s:
        raise ValueError("%s contains NUL" % what)
    return s.encode("utf-8")


def timeout_s(s, what="timeout_s"):
    """Seconds (int or float) to whole milliseconds; None, a negative number or infinity wait
    forever (-1)."""
    if s is None:
        return -1
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise TypeError("%s must be a number of seconds or None, not %s" % (what, _name_of(s)))
    if s != s:
        raise ValueError("%s is NaN" % what)
    if s < 0 or s == float("inf"):
        return -1
    return int(min(s * 1000.0, _INT_MAX))


def lid(x, what="LID"):
    """A member's LID as `model|stage|shard|replica` bytes: a LID tuple, a LID string, or a URL
    (its part after '#')."""
    b = peer(x)
    if b"#" in b:
        b = b.split(b"#", 1)[1]
        if not b:
            raise ValueError("%s: URL %r has no LID after '#'" % (what, x))
    return b


def pattern(p, what="pattern"):
    """A LID pattern `model|stage|shard|replica` (any field may be `*`); the core parses it."""
    if isinstance(p, bytes):
        p = p.decode("utf-8")
    if not isinstance(p, str):
        raise TypeError("%s must be str like 'model|1|*|*', not %s" % (what, _name_of(p)))
    if not p or "\0" in p:
        raise ValueError("%s must be a non-empty string without NUL: %r" % (what, p))
    return p.encode("utf-8")
