"""The ctypes mirrors of connex.h structures match the C compiler's layout."""

import ctypes
import os
import shutil
import subprocess

import pytest

from connex_c._lib import STRUCTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = os.path.join(ROOT, "core", "include")


def _c_name(py_field):
    return "from" if py_field == "from_" else py_field


@pytest.mark.skipif(not shutil.which("cc") or not os.path.exists(
    os.path.join(INCLUDE, "connex", "connex.h")), reason="needs cc and the source tree's header")
def test_struct_layout_matches_header(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "connex/connex.h"',
             'int main(void) {']
    for sname, st in STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (sname, sname))
        for f, _ in st._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));'
                         % (sname, f, sname, _c_name(f)))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-I", INCLUDE, str(src), "-o", str(exe)], check=True,
                   timeout=60)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in got.splitlines():
        sname, field, value = line.split()
        st = STRUCTS[sname]
        mine = ctypes.sizeof(st) if field == "sizeof" else getattr(st, field).offset
        assert mine == int(value), "%s.%s: ctypes %d, C %s" % (sname, field, mine, value)
