"""A target written for Mooncake Transfer Engine: it imports `mooncake.engine`, initializes on
TARGET_SERVER_NAME, keeps its managed buffer registered and waits. tests/test_mooncake.py runs
it, unchanged, with python/shim on PYTHONPATH so that `mooncake.engine` is connex_c."""

import os
import sys
import time

from mooncake.engine import TransferEngine


def main():
    name = os.getenv("TARGET_SERVER_NAME", "127.0.0.1:12345")
    metadata = os.getenv("MC_METADATA_SERVER", "P2PHANDSHAKE")
    protocol = os.getenv("PROTOCOL", "tcp")
    engine = TransferEngine()
    rc = engine.initialize(name, metadata, protocol, "")
    if rc != 0:
        print("initialize failed: %d" % rc, flush=True)
        return 1
    buf = engine.allocate_managed_buffer(1 << 20)
    if buf == 0:
        print("allocate_managed_buffer failed", flush=True)
        return 1
    print("target ready on %s" % name, flush=True)
    deadline = time.monotonic() + float(os.getenv("TARGET_LIFETIME_S", "120"))
    while time.monotonic() < deadline:
        line = sys.stdin.readline()
        if not line or line.strip() == "exit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
