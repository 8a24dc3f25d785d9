#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds a program against it twice: with
# find_package(connex) and with pkg-config. Usage: run.sh <build dir>
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
