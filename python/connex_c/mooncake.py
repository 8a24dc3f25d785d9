"""Mooncake's module names, served by connex_c: a program written for Mooncake Transfer Engine
(`from mooncake.engine import TransferEngine`) runs unchanged once they are mapped.

Either put python/shim on PYTHONPATH (it holds a `mooncake` package whose `engine` module is
this one), or map them in-process before the program imports them:

    import connex_c.mooncake
    connex_c.mooncake.install()        # sys.modules["mooncake"], ["mooncake.engine"]
    from mooncake.engine import TransferEngine

This module is what `mooncake.engine` then is: TransferEngine, TransferOpcode, TransferNotify
and the SUPPORT_* flags of Mooncake's module."""

import sys
import types

from .transfer_engine import TransferEngine, TransferNotify, TransferOpcode

# Mooncake's compile-time feature flags. CUDA memory is detected at run time (docs/gpu.md);
# the transports Mooncake builds in are not connex backends.
SUPPORT_CUDA = True
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "SUPPORT_CUDA", "SUPPORT_EFA",
           "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_INTRA_NVLINK", "install"]


def install():
    """Make `import mooncake.engine` (and `from mooncake import engine`) give this module.
    Returns the `mooncake` package module. A real mooncake already imported is replaced."""
    this = sys.modules[__name__]
    pkg = types.ModuleType("mooncake")
    pkg.__path__ = []                  # a package, so that `mooncake.engine` resolves
    pkg.engine = this
    sys.modules["mooncake"] = pkg
    sys.modules["mooncake.engine"] = this
    return pkg
