"""Packaging: `pip install ./python` works offline and gives a package that finds libconnex
next to itself or through CONNEX_LIB; the wheel builds offline; one version everywhere.
(`cmake --install --component python` is tested by tests/install/run.sh.)"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

import connex_c

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pip_ok():
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    return r.returncode == 0


needs_pip = pytest.mark.skipif(not _pip_ok(), reason="no pip for this python (python3-pip)")
PIP_OFFLINE = ["--no-build-isolation", "--no-deps", "--no-index", "--disable-pip-version-check",
               "--no-cache-dir"]


def _source_copy(tmp_path):
    """python/ without its tests, so the in-tree build leaves the checkout untouched."""
    src = tmp_path / "src"
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__", "libconnex.so*"))
    return src


def _run(code, path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("CONNEX_LIB", "PYTHONPATH")}
    e.update(PYTHONPATH=str(path), **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60, cwd=str(path))


@needs_pip
def test_pip_install_offline_and_library_lookup(tmp_path):
    src = _source_copy(tmp_path)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", *PIP_OFFLINE, "--target",
                        str(target), str(src)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    dist = glob.glob(str(target / "connex_c-*.dist-info"))
    assert dist and dist[0].endswith("connex_c-%s.dist-info" % connex_c.__version__)

    lib = os.path.abspath(connex_c.library_path())
    probe = "import connex_c; print(connex_c.library_path()); print(connex_c.__version__)"
    r = _run(probe, target, CONNEX_LIB=lib)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [lib, connex_c.__version__]

    shutil.copy(lib, target / "connex_c" / "libconnex.so")       # next to the package
    r = _run(probe + "\ne = connex_c.Engine('pkg'); print(e.local_url); e.close()", target)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[0] == str(target / "connex_c" / "libconnex.so") and "#pkg|0|0|0" in out[2]


@needs_pip
def test_wheel_builds_offline_and_carries_a_library_put_beside_the_package(tmp_path):
    src = _source_copy(tmp_path)
    shutil.copy(os.path.abspath(connex_c.library_path()), src / "connex_c" / "libconnex.so")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", *PIP_OFFLINE, "-w",
                        str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = glob.glob(str(tmp_path / "dist" / "connex_c-*.whl"))
    assert len(wheels) == 1 and "-%s-" % connex_c.__version__ in wheels[0]
    import zipfile
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "connex_c/libconnex.so" in names and "connex_c/transfer_engine.py" in names


def test_one_version():
    """_version.py is the source; CMake derives the library's and connex.pc's from it."""
    lib = os.path.abspath(connex_c.library_path())
    pc = os.path.join(os.path.dirname(lib), "connex.pc")
    if not os.path.exists(pc):
        pytest.skip("no connex.pc beside %s (not a build tree)" % lib)
    with open(pc) as f:
        ver = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("Version:")]
    assert ver == [connex_c.__version__]
    real = os.path.realpath(lib)
    assert real.endswith("libconnex.so." + connex_c.__version__) or "libconnex.so" in real
