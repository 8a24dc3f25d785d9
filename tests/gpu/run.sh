#!/usr/bin/env bash
# GPU check for connex-c, for a machine with an NVIDIA GPU (the device tool's H200, say).
#   1. builds with CUDA reachable (libcuda.so.1 through dlopen: no nvcc needed)
#   2. runs gpu/'s cases on real device memory (CONNEX_GPU_TEST_KIND=cuda)
#   3. runs conformance_gpu (label "gpu_staging") and conformance_data (zmq) with CUDA buffers
#      (CONNEX_TEST_MEM=cuda: two processes on one GPU)
#   4. prints staging bandwidth 16 KiB .. 64 MiB against plain cuMemcpy (connex-gpu-check)
# Exit: 0 all passed, 1 a failure, 2 no GPU here (said plainly, nothing else run).
# Usage: tests/gpu/run.sh [build-dir]   (default: build-gpucheck; output also in $OUT when set)
set -u -o pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpucheck}
log=${OUT:-$build}/gpu_check.log
mkdir -p "$build" "$(dirname "$log")"
exec > >(tee "$log") 2>&1

echo "== connex-c GPU check: $(date -u +%FT%TZ) on $(hostname)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader
else
  echo "nvidia-smi: not found"
fi
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
  echo "NO GPU: libcuda.so.1 (the NVIDIA driver) is not installed here; nothing to check." >&2
  echo "        (gpu/'s CPU tests cover the staging pipeline on the simulated device: ctest -L gpu)" >&2
  exit 2
fi

jobs=$(nproc 2>/dev/null || echo 2)
fail=0
# The whole project when its tree configures; else gpu/ alone, the part this check is about.
if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONNEX_TESTS=ON >"$build/cmake.log" 2>&1 \
   && cmake --build "$build" -j "$jobs" >"$build/build.log" 2>&1; then
  echo "== built the project in $build"
else
  echo "== the full project did not build (see $build/cmake.log, build.log); building gpu/ alone"
  wrap=$build/gpu-only-src
  mkdir -p "$wrap"
  ln -sfn "$root/core" "$wrap/core"
  cat >"$wrap/CMakeLists.txt" <<EOW
cmake_minimum_required(VERSION 3.20)
project(connex_gpu_only C)
set(CMAKE_C_STANDARD 11)
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
add_compile_options(-Wall -Wextra -D_GNU_SOURCE)
set(CONNEX_TESTS ON)
enable_testing()
add_subdirectory($root/gpu gpu)
EOW
  build=$build/gpu-only
  cmake -S "$wrap" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$wrap/cmake.log" 2>&1 \
    && cmake --build "$build" -j "$jobs" >"$wrap/build.log" 2>&1 \
    || { echo "BUILD FAILED"; tail -30 "$wrap/build.log"; exit 1; }
fi
check=$(find "$build" -name connex-gpu-check -type f -perm -u+x | head -1)

echo "== gpu/ cases on CUDA device memory"
(cd "$build" && CONNEX_GPU_TEST_KIND=cuda timeout 300 ctest -L gpu -E 'cuda_absent|cuda_stub|stage_env' --output-on-failure) || fail=1
echo "== gpu/ cases on the simulated device (same binary, for comparison)"
(cd "$build" && timeout 300 ctest -L gpu --output-on-failure) || fail=1

if ! (cd "$build" && ctest -N -L gpu_staging 2>/dev/null | grep -q 'Total Tests: [1-9]'); then
  echo "== conformance with GPU buffers: not in this build (label 'gpu_staging'); skipped"
else
  # conformance_gpu: device buffers on either side or both, kill and timeout mid-staging, every
  # backend variant. zmq first: it always stages, so it is the reference for the others.
  echo "== staging conformance on CUDA memory (CONNEX_TEST_MEM=cuda conformance_gpu, zmq)"
  (cd "$build" && CONNEX_TEST_MEM=cuda timeout 300 ctest -R '^conformance_gpu_zmq$' --output-on-failure) || fail=1
  echo "== staging conformance on CUDA memory, the other backend variants"
  (cd "$build" && CONNEX_TEST_MEM=cuda timeout 400 ctest -L gpu_staging -E '_zmq$' -j 4 --output-on-failure) || fail=1
  echo "== data conformance with the peers' regions in CUDA memory (zmq: target-side device copies)"
  (cd "$build" && CONNEX_TEST_MEM=cuda timeout 300 ctest -R '^conformance_data_zmq$' --output-on-failure) || fail=1
fi

echo "== staging bandwidth (device 0): staged GPU->host->net->host->GPU vs plain cuMemcpy"
CONNEX_LOG=${CONNEX_LOG:-warn} timeout 300 "$check" || fail=1
echo "== staging bandwidth with 1 MiB chunks, 16 slots"
timeout 300 "$check" --chunk 1048576 --slots 16 || fail=1

echo "== result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
