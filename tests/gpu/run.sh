#!/usr/bin/env bash
# GPU check for connex-c, for a machine with an NVIDIA GPU (the device tool's H200, say).
#   1. builds with CUDA reachable (libcuda.so.1 through dlopen: no nvcc needed)
#   2. runs gpu/'s cases on real device memory (CONNEX_GPU_TEST_KIND=cuda)
#   3. runs conformance_gpu (label "gpu_staging") and conformance_data (zmq) with CUDA buffers
#      (CONNEX_TEST_MEM=cuda: two processes on one GPU)
#   4. prints staging bandwidth 16 KiB .. 64 MiB against plain cuMemcpy (connex-gpu-check)
#   5. connex-bench transfer --mem cuda: every variant host to host, then staged on both sides,
#      beside the device's copy rate (JSON: gpu_bench.json beside the log)
# Exit: 0 all passed, 1 a failure, 2 no GPU here (said plainly, nothing else run).
# Usage: tests/gpu/run.sh [build-dir]   (default: build-gpucheck; output also in $OUT when set)
# A build that tests/gpu/bundle.sh prepared (it holds runtime-libs/) is used as it is: built
# elsewhere, for a GPU machine without the -dev packages. CONNEX_GPU_BENCH=0 skips step 5.
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
# The driver's library is found through ld.so's cache, LD_LIBRARY_PATH, or where container
# images mount the driver (/usr/local/nvidia).
have_cuda=0
if ldconfig -p | grep -q 'libcuda\.so\.1 '; then
  have_cuda=1
else
  for d in ${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    if [ -e "$d/libcuda.so.1" ]; then
      have_cuda=1
      case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d ;; esac
      break
    fi
  done
fi
if [ $have_cuda = 0 ]; then
  echo "NO GPU: libcuda.so.1 (the NVIDIA driver) is not installed here; nothing to check." >&2
  echo "        (gpu/'s CPU tests cover the staging pipeline on the simulated device: ctest -L gpu)" >&2
  exit 2
fi

jobs=$(nproc 2>/dev/null || echo 2)
fail=0
# A bundled build as it is; else the whole project when its tree configures; else gpu/ alone,
# the part this check is about.
if [ -d "$build/runtime-libs" ]; then
  export LD_LIBRARY_PATH=$build/runtime-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "== using the bundled build in $build (runtime-libs first on LD_LIBRARY_PATH)"
elif cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONNEX_TESTS=ON >"$build/cmake.log" 2>&1 \
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
(cd "$build" && CONNEX_GPU_TEST_KIND=cuda timeout 300 ctest -L '^gpu$' -E 'cuda_absent|cuda_stub|stage_env' --output-on-failure) || fail=1
echo "== gpu/ cases on the simulated device (same binary, for comparison)"
(cd "$build" && timeout 300 ctest -L '^gpu$' --output-on-failure) || fail=1

if ! (cd "$build" && ctest -N -L gpu_staging 2>/dev/null | grep -q 'Total Tests: [1-9]'); then
  echo "== conformance with GPU buffers: not in this build (label 'gpu_staging'); skipped"
else
  # conformance_gpu: device buffers on either side or both, kill and timeout mid-staging, every
  # backend variant. zmq first: it always stages, so it is the reference for the others.
  echo "== staging conformance on CUDA memory (CONNEX_TEST_MEM=cuda conformance_gpu, zmq)"
  (cd "$build" && CONNEX_TEST_MEM=cuda timeout 300 ctest -R '^conformance_gpu_zmq$' --output-on-failure) || fail=1
  echo "== staging conformance on CUDA memory, the other backend variants"
  (cd "$build" && CONNEX_TEST_MEM=cuda timeout 400 ctest -L gpu_staging -E '_zmq$' -j "$((jobs < 6 ? jobs : 6))" --output-on-failure) || fail=1
  echo "== data conformance with the peers' regions in CUDA memory (zmq: target-side device copies)"
  (cd "$build" && CONNEX_TEST_MEM=cuda timeout 300 ctest -R '^conformance_data_zmq$' --output-on-failure) || fail=1
fi

echo "== staging bandwidth (device 0): staged GPU->host->net->host->GPU vs plain cuMemcpy"
CONNEX_LOG=${CONNEX_LOG:-warn} timeout 300 "$check" || fail=1
echo "== staging bandwidth with 1 MiB chunks, 16 slots"
timeout 300 "$check" --chunk 1048576 --slots 16 || fail=1

bench=$(find "$build" -name connex-bench -type f -perm -u+x | head -1)
if [ "${CONNEX_GPU_BENCH:-1}" = 0 ] || [ -z "$bench" ]; then
  echo "== connex-bench --mem cuda: skipped"
else
  # 16 KiB shows the staging's fixed cost, 64 MiB its pipelined rate (docs/gpu.md).
  echo "== connex-bench transfer --mem cuda (staged on both sides) beside host to host"
  timeout 420 "$bench" transfer --mem cuda --backend ucx_tcp,ucx_shm,libfabric_tcp,libfabric_shm,zmq \
    --sizes 16K,1M,64M --ops read,write --iters 30 --budget-ms 1000 --baselines none \
    --json "$(dirname "$log")/gpu_bench.json" || fail=1
  # A batch of device-memory blocks: its staged entries share the pipeline (docs/gpu.md).
  echo "== connex-bench transfer --mem cuda --batch 64 beside 64 async ops"
  timeout 300 "$bench" transfer --mem cuda --batch 64 --backend ucx_tcp,libfabric_tcp,zmq \
    --sizes 64K,1M --ops read,write --iters 20 --budget-ms 1000 --baselines none \
    --json "$(dirname "$log")/gpu_batch.json" || fail=1
fi

echo "== result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
