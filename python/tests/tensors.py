"""Test tensors that expose one protocol only, over host memory (numpy) or over the simulated
device's memory (cx_mem_alloc(CX_MEM_SIM)), so the binding is tested without torch or cupy."""

import ctypes

import connex_c
from connex_c import _tensor
from connex_c._lib import lib as cxlib

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object


class DLPackOnly:
    """Forwards numpy's DLPack export and nothing else (no buffer protocol)."""

    def __init__(self, arr):
        self._a = arr

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class SimTensor:
    """n bytes of simulated-device memory seen as a CUDA tensor, through DLPack and/or
    __cuda_array_interface__ (shape and strides in bytes of uint8, or of `itemsize`)."""

    def __init__(self, n, dlpack=True, cai=True, shape=None, strides=None, itemsize=1,
                 device_type=2):
        lib = cxlib()
        p = ctypes.c_void_p()
        rc = lib.cx_mem_alloc(connex_c.CX_MEM_SIM, 0, n, ctypes.byref(p))
        assert rc == 0, rc
        self._lib = lib
        self.ptr = p.value
        self.n = n
        self.shape = tuple(shape or (n // itemsize,))
        self.strides = strides         # in elements for DLPack, bytes for the CAI
        self.itemsize = itemsize
        self.device_type = device_type
        self._dl = dlpack
        self._cai = cai
        self._keep = []

    def __getattr__(self, name):
        if name == "__cuda_array_interface__" and self.__dict__.get("_cai"):
            return {"shape": self.shape, "typestr": "|u%d" % self.itemsize,
                    "data": (self.ptr, False), "version": 3,
                    "strides": None if self.strides is None else
                    tuple(s * self.itemsize for s in self.strides)}
        if name in ("__dlpack__", "__dlpack_device__") and self.__dict__.get("_dl"):
            return getattr(self, "_" + name.strip("_"))
        raise AttributeError(name)

    def _dlpack_device(self):
        return (self.device_type, 0)

    def _dlpack(self, stream=None):
        nd = len(self.shape)
        shape = (ctypes.c_int64 * nd)(*self.shape)
        strides = (ctypes.c_int64 * nd)(*self.strides) if self.strides else None
        mt = _tensor.DLManagedTensor()
        t = mt.dl_tensor
        t.data = self.ptr
        t.device.device_type = self.device_type
        t.device.device_id = 0
        t.ndim = nd
        t.dtype.code, t.dtype.bits, t.dtype.lanes = 1, 8 * self.itemsize, 1
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        self._keep.append((mt, shape, strides))       # no deleter: this object owns it all
        return _capsule_new(ctypes.addressof(mt), b"dltensor", None)

    def write(self, data):
        assert self._lib.cx_mem_copy(self.ptr, bytes(data), len(data)) == 0

    def read(self, n=None):
        n = self.n if n is None else n
        out = ctypes.create_string_buffer(n)
        assert self._lib.cx_mem_copy(out, self.ptr, n) == 0
        return out.raw

    def free(self):
        if self.ptr:
            self._lib.cx_mem_free(self.ptr)
            self.ptr = 0
