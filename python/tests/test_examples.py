"""docs/examples/python: each example runs to its end and prints what its scenario promises."""

import os
import re
import subprocess
import sys

import pytest

import connex_c

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(os.path.dirname(PKG_ROOT), "docs", "examples", "python")

pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="no docs/examples/python")


def _run(name, *args):
    env = dict(os.environ, PYTHONPATH=PKG_ROOT,
               CONNEX_LIB=os.path.abspath(connex_c.library_path()))
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_mobile_endpoints():
    out = _run("mobile_endpoints.py")
    assert "every step went as expected" in out and "!!" not in out
    assert re.search(r"'in flight when A died': ok, taken by replica B, handed over", out)
    ups = re.findall(r"replica A up at (\S+)", out)
    assert len(ups) == 3
    assert ups[1] == ups[0]                     # the rejoin: the same URL
    assert ups[2] != ups[0] and ups[2].endswith("#demo|1|0|0")   # the move: same LID, new port
    assert out.count("taken by replica A") >= 4 and out.count("taken by replica B") >= 4
    assert "'nobody to take it': peer failed" in out
    assert "steps handed over: 1;" in out


def test_pipeline_moves_a_tensor():
    pytest.importorskip("numpy")
    for args in ((), ("--dlpack", "--batches", "3")):
        out = _run("pipeline.py", *args)
        n = 3 if args else 4
        assert "%d of %d micro-batches checked out" % (n, n) in out
        assert out.count("checksum matches") == n
        assert out.count("[stage 1] micro-batch") == n
        assert ("by DLPack" in out) == bool(args)
