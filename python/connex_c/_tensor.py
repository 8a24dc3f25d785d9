"""Tensors handed over by the two protocols that tensor libraries share, read with ctypes only
(no torch, cupy or numpy import):

- DLPack: `__dlpack_device__()` says where the memory is, `__dlpack__()` gives a PyCapsule named
  "dltensor" holding a DLManagedTensor. The capsule is kept, not consumed: as long as it lives
  the producer keeps the memory alive, and when it is collected the producer's own capsule
  destructor releases the tensor (the protocol's rule for a capsule whose name was not changed
  to "used_dltensor").
- `__cuda_array_interface__` (version 0-3): a dict with data (address, read-only flag), shape,
  typestr and strides; the memory is device memory (CUDA, or managed).

Each gives a Tensor: address, byte size, the device ("cpu" or ("cuda", ordinal)) and what keeps
the memory alive. Memory that is not one dense C-ordered block is refused with ValueError."""

import ctypes

# DLDeviceType (dlpack.h)
_KDL_CPU = 1
_KDL_CUDA = 2
_KDL_CUDA_HOST = 3      # pinned host memory: host addressable
_KDL_CUDA_MANAGED = 13
_KDL_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
              9: "vpi", 10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed",
              14: "oneapi", 15: "webgpu", 16: "hexagon"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]

_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid.restype = ctypes.c_int
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_ptr.restype = ctypes.c_void_p


class Tensor:
    """address, size (bytes), device ("cpu" or ("cuda", ordinal)), readonly, keep."""

    __slots__ = ("address", "size", "device", "readonly", "keep")

    def __init__(self, address, size, device, readonly, keep):
        self.address = address
        self.size = size
        self.device = device
        self.readonly = readonly
        self.keep = keep

    @property
    def is_device(self):
        return self.device != "cpu"


def _dense(shape, strides, itemsize, what):
    """Refuse strides that are not those of a dense C-ordered block (size-1 dimensions may
    carry any stride, as DLPack and numpy allow)."""
    if strides is None:
        return
    want = itemsize
    for dim, st in zip(reversed(shape), reversed(strides)):
        if dim != 1 and st != want:
            raise ValueError("%s is not contiguous (shape %s, strides %s): copy it into a "
                             "contiguous tensor first" % (what, tuple(shape), tuple(strides)))
        want *= dim


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def from_dlpack(obj, what):
    try:
        dev_type, dev_id = obj.__dlpack_device__()
    except Exception as exc:
        raise TypeError("%s: __dlpack_device__() failed: %s" % (what, exc)) from None
    dev_type, dev_id = int(dev_type), int(dev_id)
    if dev_type in (_KDL_CPU, _KDL_CUDA_HOST):
        device = "cpu"
    elif dev_type in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        device = ("cuda", dev_id)
    else:
        raise ValueError("%s: DLPack device %s is not supported (host, CUDA and CUDA managed "
                         "memory are)" % (what, _KDL_NAMES.get(dev_type, dev_type)))
    try:
        # stream=None: the producer orders its work before the export on the legacy default
        # stream; the transfer that follows reads or writes the memory after that.
        cap = obj.__dlpack__(stream=None) if device != "cpu" else obj.__dlpack__()
    except BufferError as exc:
        raise ValueError("%s: __dlpack__() refused the export: %s" % (what, exc)) from None
    except TypeError:
        cap = obj.__dlpack__()
    if not _capsule_valid(cap, b"dltensor"):
        raise TypeError("%s: __dlpack__() did not return an unconsumed 'dltensor' capsule" % what)
    mt = DLManagedTensor.from_address(_capsule_ptr(cap, b"dltensor"))
    t = mt.dl_tensor
    if t.device.device_type != dev_type:
        raise ValueError("%s: the capsule's device (%d) differs from __dlpack_device__ (%d)"
                         % (what, t.device.device_type, dev_type))
    ndim = t.ndim
    if ndim < 0 or ndim > 64:
        raise ValueError("%s: DLPack tensor with %d dimensions" % (what, ndim))
    shape = [t.shape[i] for i in range(ndim)]
    if any(d < 0 for d in shape):
        raise ValueError("%s: negative DLPack shape %s" % (what, shape))
    bits = t.dtype.bits * max(t.dtype.lanes, 1)
    if bits % 8:
        raise ValueError("%s: DLPack element of %d bits is not whole bytes" % (what, bits))
    itemsize = bits // 8
    strides = None
    if t.strides:
        strides = [t.strides[i] * itemsize for i in range(ndim)]   # DLPack counts elements
    _dense(shape, strides, itemsize, what)
    size = _prod(shape) * itemsize
    addr = (t.data or 0) + t.byte_offset
    if size == 0 or addr == 0:
        raise ValueError("%s is empty" % what)
    return Tensor(addr, size, device, False, (obj, cap))


def _itemsize(typestr, what):
    if not isinstance(typestr, str) or len(typestr) < 3 or not typestr[2:].isdigit():
        raise ValueError("%s: __cuda_array_interface__ typestr %r is not like '<f4'"
                         % (what, typestr))
    return int(typestr[2:])


def from_cuda_array_interface(obj, what):
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError("%s: __cuda_array_interface__ is %s, not a dict"
                        % (what, type(cai).__name__))
    try:
        data = cai["data"]
        shape = tuple(int(x) for x in cai["shape"])
        typestr = cai["typestr"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError("%s: malformed __cuda_array_interface__ (%s)" % (what, exc)) from None
    if not isinstance(data, tuple) or len(data) != 2:
        raise ValueError("%s: __cuda_array_interface__ data must be (address, read_only)" % what)
    if cai.get("mask") is not None:
        raise ValueError("%s: a masked __cuda_array_interface__ is not supported" % what)
    itemsize = _itemsize(typestr, what)
    strides = cai.get("strides")
    if strides is not None:
        strides = tuple(int(x) for x in strides)
        if len(strides) != len(shape):
            raise ValueError("%s: strides %s do not match shape %s" % (what, strides, shape))
    _dense(shape, strides, itemsize, what)
    addr = int(data[0] or 0)
    size = _prod(shape) * itemsize
    if size == 0 or addr == 0:
        raise ValueError("%s is empty" % what)
    # The protocol has no device ordinal; the memory's own context says which (the C library
    # asks the driver when it registers it).
    return Tensor(addr, size, ("cuda", -1), bool(data[1]), obj)
