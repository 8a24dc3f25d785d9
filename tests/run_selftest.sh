#!/usr/bin/env bash
# Checks tests/run.sh on a generated CMake project whose tests fail on their first try and pass
# on the second (a state file per test): a crash must fail the run without a retry, a timing
# failure must pass after a visible retry, a skip (exit 77) is no failure.
#   tests/run_selftest.sh <tests/run.sh> <scratch dir>        (ctest: run_sh_selftest, label unit)
set -uo pipefail
runner=$1
work=$2
rm -rf "$work"
mkdir -p "$work/src"
fails=0
bad() { echo "run_selftest: FAIL: $*"; fails=$((fails + 1)); }

# once <name> <first-try command>: the first try runs the command, later tries exit 0.
cat >"$work/src/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(run_selftest NONE)
enable_testing()
function(once name first)
  add_test(NAME ${name} COMMAND sh -c "if [ -e ${name}.tried ]; then echo second try; exit 0; fi; touch ${name}.tried; ${first}")
endfunction()
once(segv_once "kill -SEGV $$")
once(abort_once "kill -ABRT $$")
once(cmocka_once "echo '[  ERROR   ] --- 0 != 1'; echo '[   LINE   ] --- t.c:10: error: Failure!'; exit 1")
once(timeout_once "sleep 5")
set_tests_properties(timeout_once PROPERTIES TIMEOUT 1)
once(asan_once "echo '==42==ERROR: AddressSanitizer: heap-use-after-free on address 0x1'; exit 1")
once(ubsan_once "echo 'x.c:3:5: runtime error: signed integer overflow'; exit 1")
once(lsan_once "echo '==42==ERROR: LeakSanitizer: detected memory leaks'; exit 23")
once(assert_once "echo 'prog: x.c:9: f: Assertion `p != NULL'\"'\"' failed.'; exit 1")
once(cmocka_sig_once "echo '[  ERROR   ] t: Test failed with exception: Segmentation fault(11)'; exit 1")
once(peer_once "echo 'cxt: peer peer|0|0|1 pid 77 crashed with signal 6'; echo '[  FAILED  ] 1 test(s)'; exit 1")
once(handler_once "echo 'prog:25130 terminated with signal 11 at PC=7fc6a11af1f7 SP=7fc69f087000.  Backtrace:'; exit 1")
once(ucxsig_once "echo '[vm:1:0:2] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)'; exit 1")
once(soak_once "echo 'libfabric_shm 0/20 FAIL: CRASH: the survivor exited (status 1) without a result'; exit 1")
add_test(NAME skip COMMAND sh -c "echo 'cxt: SKIPPED: needs root'; exit 77")
set_tests_properties(skip PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME fine COMMAND true)
EOF
cmake -S "$work/src" -B "$work/b" >/dev/null || { echo "run_selftest: cmake failed"; exit 1; }

# run <regex>: a fresh first try for the matching tests, the runner's exit status in $rc and its
# output in $work/out.
run() {
  rm -f "$work"/b/*.tried
  bash "$runner" "$work/b" -R "$1" >"$work/out" 2>&1
  rc=$?
}

for t in segv abort asan ubsan lsan assert cmocka_sig peer handler ucxsig soak; do
  run "^(${t}_once|fine)\$"
  [ $rc != 0 ] || bad "$t: a crash on the first try passed the run"
  grep -q "CRASH in ${t}_once, not retried" "$work/out" || bad "$t: not reported as a CRASH"
  grep -q "second try" "$work/out" && bad "$t: retried"
  bash "$runner" --why "$work/b" >"$work/why"; grep -q -- "--- ${t}_once: CRASH" "$work/why" || bad "$t: --why does not say CRASH"
done

for t in cmocka timeout; do
  run "^(${t}_once|fine|skip)\$"
  [ $rc = 0 ] || { bad "$t: a timing failure that passed on the retry failed the run"; cat "$work/out"; }
  grep -q "running them once more: ${t}_once" "$work/out" || bad "$t: the retry is not visible"
  grep -q "passed on the retry: ${t}_once" "$work/out" || bad "$t: the passing retry is not said"
  tail -1 "$work/out" | grep -q "^100% tests passed, 0 tests failed out of 3\$" || bad "$t: no closing line"
  bash "$runner" --why "$work/b" >"$work/why"; grep -q -- "--- ${t}_once: TIMING" "$work/why" || bad "$t: --why does not say TIMING"
done

# A timing failure beside a crash: no retry for either.
run "^(cmocka_once|segv_once)\$"
[ $rc != 0 ] || bad "crash + timing: passed"
grep -q "running them once more" "$work/out" && bad "crash + timing: retried"

# All pass, one skip: passes at once, ctest's own closing line last but the skip list.
run "^(fine|skip)\$"
[ $rc = 0 ] || bad "pass + skip: failed"
grep -q "^100% tests passed, 0 tests failed out of 2\$" "$work/out" || bad "pass + skip: no closing line"
grep -q "skip (Skipped)" "$work/out" || bad "pass + skip: the skip is not shown"

[ $fails = 0 ] && echo "run_selftest: all checks passed" && rm -rf "$work"
exit $((fails > 0))
