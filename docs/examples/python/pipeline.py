"""pipeline: two pipeline stages moving an activation tensor, on loopback.

Stage 0 (this process) computes an activation tensor per micro-batch and puts it straight into
stage 1's registered input tensor with put_signal: the bytes land first, then the message that
says which micro-batch they are. Stage 1 (a child process, this script with --stage1) runs its
"layer" on the tensor in place and answers with a checksum, which stage 0 checks. The tensors
are numpy arrays handed to connex_c as they are (buffer protocol, or DLPack with --dlpack);
stage 0 finds stage 1's input tensor with peer_first_region (its first registered memory).

    python3 pipeline.py [--dlpack] [--batches N]     exit 0 when every micro-batch checked out

Needs numpy, connex_c importable (pip install ./python, or PYTHONPATH=python) and libconnex."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

import connex_c

SHAPE = (256, 1024)            # a micro-batch: 256 tokens x 1024 hidden, float32 (1 MiB)
HB = dict(heartbeat_ms=200, heartbeat_timeout_ms=1000)


class DLPackView:
    """Hands over only the DLPack protocol of an array (what jax or cupy arrays offer)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def stage1_main():
    x = np.zeros(SHAPE, dtype=np.float32)                 # the input activations land here
    with connex_c.Engine("pipe", stage=1, **HB) as e:
        assert e.register_memory(x) == 0                   # length from the array
        print(e.local_url, flush=True)
        while True:
            m = e.recv_msg(10000)
            if m is None:
                return 1
            hdr = json.loads(m.data)
            if hdr.get("stop"):
                return 0
            y = np.maximum(x, 0.0) * 2.0                   # the "layer": ReLU, scaled
            e.send_msg(m.url, json.dumps({"batch": hdr["batch"],
                                          "sum": float(y.sum(dtype=np.float64))}).encode())
            print("  [stage 1] micro-batch %d: %s %s in place, layer done"
                  % (hdr["batch"], hdr["dtype"], tuple(hdr["shape"])), flush=True)


def stage0_main(batches, dlpack):
    act = np.empty(SHAPE, dtype=np.float32)               # stage 0's output activations
    with connex_c.Engine("pipe", stage=0, **HB) as e:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--stage1"],
                                 stdout=subprocess.PIPE, text=True, bufsize=1)
        try:
            url = child.stdout.readline().strip()
            echo = threading.Thread(target=lambda: [sys.stdout.write(ln) for ln in child.stdout])
            echo.start()
            print("stage 0 %s -> stage 1 %s (tensors by %s)"
                  % (e.local_url, url, "DLPack" if dlpack else "buffer protocol"))
            assert e.register_memory(DLPackView(act) if dlpack else act) == 0
            assert e.connect(url, 5000) == 0
            dst, dst_len = e.peer_first_region(url)      # stage 1's input tensor
            assert dst_len == act.nbytes, (dst_len, act.nbytes)
            print("  stage 1's input tensor: 0x%x, %d bytes (its first region)" % (dst, dst_len))
            rng = np.random.default_rng(7)
            ok = 0
            for b in range(batches):
                act[:] = rng.standard_normal(SHAPE, dtype=np.float32)
                want = float((np.maximum(act, 0.0) * 2.0).sum(dtype=np.float64))
                hdr = json.dumps({"batch": b, "dtype": str(act.dtype), "shape": act.shape})
                t0 = time.monotonic()
                src = DLPackView(act) if dlpack else act
                rc = e.put_signal(url, src, dst, None, hdr.encode()).wait(10000)
                reply = e.recv_msg(10000) if rc == 0 else None
                time.sleep(0.01)                           # stage 1's line first
                ms = (time.monotonic() - t0) * 1000
                got = json.loads(reply.data) if reply is not None else {}
                good = rc == 0 and got.get("batch") == b and \
                    abs(got.get("sum", -1.0) - want) <= 1e-6 * max(1.0, abs(want))
                ok += good
                print("  stage 0: micro-batch %d, %d bytes: put_signal %s, stage 1's checksum %s"
                      " (%.1f ms)" % (b, act.nbytes, connex_c.strerror(rc),
                                      "matches" if good else "WRONG: %r" % got, ms))
            e.send_msg(url, json.dumps({"stop": True}).encode())
            child.wait(10)
            echo.join(10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        print("%d of %d micro-batches checked out" % (ok, batches))
        return 0 if ok == batches and child.returncode == 0 else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--stage1"]:
        sys.exit(stage1_main())
    dl = "--dlpack" in args
    n = 4
    if "--batches" in args:
        n = int(args[args.index("--batches") + 1])
    sys.exit(stage0_main(n, dl))
