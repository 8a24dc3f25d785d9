#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds a program against it twice: with
# find_package(connex) and with pkg-config; then installs the Python package (component python)
# and checks that it loads the installed library and has the library's version.
# Usage: run.sh <build dir>
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" CONNEX_BACKEND=zmq "$tmp/cm/app" | grep -q '#app|0|0|0'
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
cc "$here/app.c" -o "$tmp/app_pc" $(pkg-config --cflags --libs connex)
LD_LIBRARY_PATH="$tmp/prefix/lib" CONNEX_BACKEND=zmq "$tmp/app_pc" | grep -q '#app|0|0|0'
echo "install: find_package and pkg-config consumers build and run"

py=$(command -v /usr/bin/python3 || command -v python3 || true)
if [ -n "$py" ]; then
  cmake --install "$build" --prefix "$tmp/prefix" --component python >/dev/null
  site=$(dirname "$(find "$tmp/prefix" -type d -name connex_c | head -n1)")
  got=$(cd "$tmp" && env -u CONNEX_LIB PYTHONPATH="$site" CONNEX_BACKEND=zmq "$py" -c \
        'import connex_c; print(connex_c.library_path(), connex_c.__version__)')
  case "$got" in
    "$tmp/prefix/"*"/libconnex.so $(pkg-config --modversion connex)") ;;
    *) echo "installed connex_c: '$got', want the installed library and version $(pkg-config --modversion connex)"; exit 1 ;;
  esac
  echo "install: the Python package finds the installed library ($got)"
fi
