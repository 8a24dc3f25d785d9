#!/usr/bin/env bash
# Makes a build runnable on a GPU machine that lacks connex-c's libraries (UCX, libfabric, libzmq,
# cmocka and what they load): copies every shared library the build's programs load, but glibc's,
# the compiler runtime's and the NVIDIA driver's, into BUILD/runtime-libs, and UCX's transport
# modules into BUILD/runtime-libs/ucx (UCX looks for them beside libucs). tests/gpu/run.sh puts
# BUILD/runtime-libs first on LD_LIBRARY_PATH when it is there.
#
# The build must sit at the same path on the GPU machine as where it was configured: its tests
# name their helpers by absolute path. The target's glibc must be at least this host's.
# Usage: tests/gpu/bundle.sh BUILD
set -euo pipefail
build=${1:?usage: tests/gpu/bundle.sh BUILD}
[ -f "$build/CMakeCache.txt" ] || { echo "bundle: $build holds no configured build" >&2; exit 1; }
out=$build/runtime-libs
rm -rf "$out"
mkdir -p "$out/ucx"

# glibc, the compiler runtime and the driver come from the target machine; a copy from here
# would shadow a newer one there.
skip='^(ld-linux.*|libc|libm|libdl|librt|libpthread|libresolv|libutil|libgcc_s|libstdc\+\+|libcuda|libnvidia-.*)\.so'

elfs=$(find "$build" -path "$out" -prune -o -type f \( -perm -u+x -o -name '*.so*' \) -print |
  while read -r f; do head -c4 "$f" | grep -q ELF && echo "$f"; done)
ucx_dir=$(dirname "$(ldconfig -p | awk '/libucs\.so\.0 / {print $NF; exit}')")/ucx
modules=$(ls "$ucx_dir"/libuct_*.so.0 2>/dev/null || true)

# shellcheck disable=SC2086
for lib in $( (for f in $elfs $modules; do ldd "$f" 2>/dev/null; done) | awk '/=> \// {print $3}' | sort -u); do
  name=$(basename "$lib")
  if [[ $name =~ $skip ]] || [[ $lib == "$(cd "$build" && pwd)"/* ]]; then
    continue
  fi
  cp -L "$lib" "$out/$name"
done
for m in $modules; do cp -L "$m" "$out/ucx/"; done
echo "bundle: $(ls "$out" | grep -c '\.so') libraries and $(ls "$out/ucx" | wc -l) UCX modules in $out ($(du -sh "$out" | cut -f1))"
