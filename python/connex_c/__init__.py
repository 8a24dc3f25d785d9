"""connex_c: Python binding of connex-c (libconnex) through ctypes.

    from connex_c import Engine
    with Engine("llama-8b", stage=1) as e:
        print(e.local_url)

libconnex.so is looked up at first use: $CONNEX_LIB (the file or its directory), then the build
trees build/ and build-*/ of the source checkout this package lives in (newest first), then the
system linker path. LibraryNotFound says where it looked.
"""

from ._lib import CX_CLASS_BACKGROUND, CX_CLASS_CRITICAL
from ._lib import (CX_EAGAIN, CX_EAUTH, CX_EINPROGRESS, CX_ECLOSED, CX_EINVAL, CX_ENOMEM, CX_EPEER, CX_ERR,
                   CX_ETIMEDOUT, CX_EUNSUPPORTED, CX_MSG_MAX, CX_OK, LibraryNotFound, strerror)
from ._lib import lib as _lib
from .engine import BatchOp, ConnexError, Engine, EngineClosed, InvalidArgument, Message, PutSignal
from .group import Group, GroupClosed, Step, WaitTimeout
from ._lib import CX_PICK_LEAST_INFLIGHT, CX_PICK_ROUND_ROBIN
from ._lib import CX_MEM_CUDA, CX_MEM_HOST, CX_MEM_SIM
from ._version import __version__
from .transfer_engine import TransferEngine, TransferNotify, TransferOpcode, default_lid


def library_path():
    """The libconnex file in use (loads it)."""
    return _lib().connex_path


def set_log_level(level):
    """0 error, 1 warn, 2 info, 3 debug (as CONNEX_LOG)."""
    _lib().cx_log_set_level(_args_int(level))


def _args_int(v):
    from ._args import check_int
    return check_int(v, "level", 0, 3)


__all__ = ["Engine", "TransferEngine", "PutSignal", "BatchOp", "Message", "ConnexError", "EngineClosed",
           "InvalidArgument", "LibraryNotFound", "library_path", "set_log_level", "strerror",
           "default_lid", "TransferNotify", "TransferOpcode", "CX_MEM_HOST", "CX_MEM_CUDA",
           "CX_MEM_SIM", "__version__", "CX_OK", "CX_ERR", "CX_EPEER", "CX_ETIMEDOUT", "CX_EINVAL",
           "CX_ENOMEM", "CX_EUNSUPPORTED", "CX_ECLOSED", "CX_EAUTH", "CX_EAGAIN", "CX_EINPROGRESS", "CX_MSG_MAX",
           "CX_CLASS_CRITICAL", "CX_CLASS_BACKGROUND",
           "Group", "Step", "GroupClosed", "WaitTimeout", "CX_PICK_ROUND_ROBIN",
           "CX_PICK_LEAST_INFLIGHT"]
