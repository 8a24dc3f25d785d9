#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time from its committed
# corpus. New inputs go to <build>/corpus-out/<target>/, which is kept and grows from run to run
# (each run starts from it and the committed seeds); the committed seeds are only rewritten with
# --merge, which folds what corpus-out adds in coverage into corpus/<target>/ (libFuzzer's
# -merge=1: only inputs with new coverage are copied, as files named by their hash). Any crash
# fails the script and leaves the input under <build>/artifacts/; add it to corpus/<target>/ once
# fixed, so the replay tests (ctest -L fuzz) keep it fixed.
#   tests/fuzz/run.sh [--merge] [seconds per target, default 60] [target ...]
#   (targets: url ctl auth zmq ucx fi etcd; none: every corpus/<t>/ whose fuzz_<t> this build
#   has, so zmq/ucx/fi where built). CX_FUZZ_BUILD=dir (default build-fuzz), CX_FUZZ_JOBS=n
#   (default 2), CX_FUZZ_MERGE=1 same as --merge.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
merge="${CX_FUZZ_MERGE:-0}"
if [ "${1:-}" = "--merge" ]; then merge=1; shift; fi
secs="${1:-60}"
shift || true
build="${CX_FUZZ_BUILD:-$repo/build-fuzz}"
jobs="${CX_FUZZ_JOBS:-2}"

cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCONNEX_FUZZ=ON >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for c in "$here"/corpus/*/; do
    t="$(basename "$c")"
    grep -q "fuzz_$t:" <(make -C "$build" help 2>/dev/null | sed 's/^\.\.\. //; s/$/:/') && targets+=("$t")
  done
fi
cmake --build "$build" -j"$jobs" --target $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null

mkdir -p "$build/artifacts"
fail=0
for t in "${targets[@]}"; do
  out="$build/corpus-out/$t"
  mkdir -p "$out"
  echo "=== fuzz_$t: ${secs}s on $(ls "$here/corpus/$t" | wc -l) seeds and $(ls "$out" | wc -l) kept inputs"
  # New inputs go to the kept dir (first argument); the seed dir is only read.
  before=$(ls "$out" | wc -l)
  if ! ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$build/artifacts/fuzz_${t}-" \
       "$out" "$here/corpus/$t" >"$build/artifacts/fuzz_$t.log" 2>&1; then
    echo "!!! fuzz_$t found a crash: see $build/artifacts/fuzz_$t.log"
    grep -E "ERROR|SUMMARY|Test unit written" "$build/artifacts/fuzz_$t.log" | head -5 || true
    fail=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/artifacts/fuzz_$t.log" | tr '\n' ' '
  echo "kept corpus $out: $before -> $(ls "$out" | wc -l) inputs"
  if [ "$merge" = 1 ]; then
    n0=$(ls "$here/corpus/$t" | wc -l)
    ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 "$build/tests/fuzz/fuzz_$t" -merge=1 -max_len=65536 \
      -timeout=10 -rss_limit_mb=2048 "$here/corpus/$t" "$out" >"$build/artifacts/fuzz_$t.merge.log" 2>&1 \
      || { echo "!!! fuzz_$t: merge failed: see $build/artifacts/fuzz_$t.merge.log"; fail=1; }
    echo "merged into corpus/$t: $n0 -> $(ls "$here/corpus/$t" | wc -l) files (commit the new ones)"
  fi
done
exit $fail
