"""Finding libconnex: CONNEX_LIB wins and a bad one is reported clearly."""

import os
import subprocess
import sys

import connex_c

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **env):
    e = dict(os.environ, PYTHONPATH=PKG_ROOT, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60)


def test_library_found_and_versioned():
    path = connex_c.library_path()
    assert os.path.exists(path) or "/" not in path
    assert connex_c.strerror(-2)


def test_bad_connex_lib_is_a_clear_error():
    r = _run("import connex_c\n"
             "try:\n    connex_c.Engine('x')\n"
             "except connex_c.LibraryNotFound as e:\n    print('LNF', e)\n",
             CONNEX_LIB="/nonexistent/libconnex.so")
    assert r.returncode == 0, r.stderr
    assert "LNF" in r.stdout and "CONNEX_LIB" in r.stdout and "/nonexistent" in r.stdout


def test_import_never_needs_the_library():
    r = _run("import connex_c; print('ok')", CONNEX_LIB="/nonexistent")
    assert r.returncode == 0 and "ok" in r.stdout


def test_connex_lib_may_name_the_directory():
    d = os.path.dirname(connex_c.library_path())
    r = _run("import connex_c; print(connex_c.library_path())", CONNEX_LIB=d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.join(d, "libconnex.so")
