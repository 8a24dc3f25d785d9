#!/usr/bin/env bash
# Runs the test suite with ctest, retrying timing failures once and crashes never.
#
#   tests/run.sh <build dir> [ctest args ...]     e.g. tests/run.sh build -j2 -L unit
#   tests/run.sh --why <build dir>                 why each test of the last run failed
#
# ctest runs once with the given arguments. Each failed test is classified:
#   CRASH   ctest saw a signal or an exception (SegFault, Subprocess aborted, Bus error ...), or
#           the test's output holds a sanitizer report, a failed C assertion, a glibc heap or
#           stack check, a cmocka "Test failed with exception", or the harness's
#           "cxt: peer ... crashed" (tests/cxt.c: a peer process died on a signal), or a
#           process's own fault handler's line ("terminated with signal N", UCX's "Caught
#           signal N (", the harness's "cxt: Caught signal N (" for a fault on a thread other
#           than the test's, tests/cxt_fault.c; connex-bench soak's "FAIL: CRASH": a survivor
#           died);
#   TIMING  anything else: a cmocka assertion, a timeout, a watchdog.
# A CRASH fails the run at once, without a retry. When every failure is TIMING, the failed tests
# run once more (ctest --rerun-failed) and the run passes only if they all pass then. ctest's
# own closing line ("N% tests passed, M tests failed out of T") ends the output either way.
# Each try's ctest log and console output are kept in <build dir>/Testing/Temporary/
# (run-try<k>.log, run-try<k>.out); `--why` (and .ci/failures) print from them, per try, each
# failed test labelled CRASH or TIMING with the lines that say why.
set -uo pipefail

# Lines of a test's output that make its failure a CRASH (extended regular expressions).
crash_re='ERROR: (Address|Leak|Thread|Memory)Sanitizer|WARNING: (Thread|Address)Sanitizer|runtime error:|SUMMARY: (Address|Leak|Thread|UndefinedBehavior)Sanitizer|Assertion `.*failed|double free or corruption|free\(\): |malloc\(\): |realloc\(\): |malloc_consolidate\(\)|corrupted size vs|munmap_chunk\(\)|\*\*\* stack smashing|Test failed with exception|cxt: peer .* crashed|terminated with signal [0-9]+|Caught signal [0-9]+ \\(|FAIL: CRASH'
# Lines worth showing for a TIMING failure.
why_re='\[  ERROR|\[  FAILED|FAIL|[Ff]ailure|error:|ERROR: |did not|no [A-Z]+ within|WATCHDOG|cxt: peer .* (exited|crashed)|Traceback|^E  '

# classify <ctest log> <console output>: one line per failed test, "CRASH<TAB>name<TAB>why" or
# "TIMING<TAB>name<TAB>why". The console output gives ctest's reason (only it says "SegFault");
# the log gives each test's own output, unmixed with the others'.
classify() {
  local log=$1 out=$2
  awk -v crash_re="$crash_re" -v out="$out" '
    BEGIN {
      # ctest console, "The following tests FAILED:" list: "  3 - name (Reason)"
      while (out != "" && (getline l < out) > 0) {
        if (l ~ /^The following tests FAILED:/) { inlist = 1; continue }
        if (inlist && l ~ /^[ \t]+[0-9]+ - /) {
          sub(/^[ \t]+[0-9]+ - /, "", l)
          r = l; sub(/^.* \(/, "", r); sub(/\)[^)]*$/, "", r)
          n = l; sub(/ \([^(]*\)[^(]*$/, "", n)
          reason[n] = r
        } else if (inlist) inlist = 0
      }
    }
    /^[0-9]+\/[0-9]+ Testing: / { name = $3; nb = 0; delete buf; inout = 0; next }
    /^<end of output>/ { inout = 0 }
    inout { buf[nb++] = $0 }
    /^Output:/ { inout = 1; getline; next }
    /^Test Failed/ {
      seen[name] = 1
      r = (name in reason) ? reason[name] : ""
      why = ""
      if (r != "" && r != "Failed" && r != "Timeout") why = "ctest: " r
      for (i = 0; i < nb; i++)
        if (buf[i] ~ crash_re) { why = why (why == "" ? "" : " | ") buf[i]; if (length(why) > 600) break }
      if (why != "") printf "CRASH\t%s\t%s\n", name, why
      else printf "TIMING\t%s\t%s\n", name, (r == "" ? "Failed" : r)
    }
    END {   # in the FAILED list but not in the log (not run, say): not retried
      for (n in reason) if (!(n in seen)) printf "CRASH\t%s\tctest: %s\n", n, reason[n]
    }
  ' "$log"
}

# why <build dir>: per try, each failed test with its class, the lines that say why, its last lines.
why() {
  local dir=$1 tmp="$1/Testing/Temporary" k any=0
  for k in 1 2; do
    local log="$tmp/run-try$k.log" out="$tmp/run-try$k.out"
    [ -f "$log" ] || continue
    any=1
    echo "=== why tests failed ($dir, try $k) ==="
    while IFS=$'\t' read -r cls name reason; do
      echo "--- $name: $cls ($reason)"
      awk -v name="$name" -v re="$crash_re|$why_re" '
        /^[0-9]+\/[0-9]+ Testing: / { mine = ($3 == name); nb = 0; next }
        /^<end of output>/ { inout = 0 }
        mine && inout { buf[nb++] = $0 }
        /^Output:/ { inout = 1; getline; next }
        mine && /^Test Failed/ {
          shown = 0
          for (i = 0; i < nb; i++) if (buf[i] ~ re && shown < 25) { print "  " buf[i]; shown++ }
          print "  ... last lines:"
          for (i = (nb > 12 ? nb - 12 : 0); i < nb; i++) print "  " buf[i]
          mine = 0
        }' "$log"
    done < <(classify "$log" "$out")
  done
  if [ $any = 0 ] && [ -f "$tmp/LastTest.log" ]; then   # a plain ctest run: the log alone
    cp "$tmp/LastTest.log" "$tmp/run-try1.log" && : >"$tmp/run-try1.out" && why "$dir"
  fi
}

if [ "${1:-}" = "--why" ]; then
  why "${2:-build}"
  exit 0
fi
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: tests/run.sh <build dir> [ctest args ...] | --why <build dir>" >&2; exit 2; }
dir=$(cd "$1" && pwd)
shift
tmp="$dir/Testing/Temporary"
mkdir -p "$tmp"
rm -f "$tmp"/run-try*.log "$tmp"/run-try*.out

# try <k> [extra ctest args]: runs ctest in the build dir, keeps its log and console output.
try() {
  local k=$1
  shift
  rm -f "$tmp/LastTest.log"
  (cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$tmp/run-try$k.out"
  local rc=${PIPESTATUS[0]}
  [ -f "$tmp/LastTest.log" ] && cp "$tmp/LastTest.log" "$tmp/run-try$k.log"
  return "$rc"
}

try 1 "$@" && exit 0
rc=$?
[ -f "$tmp/run-try1.log" ] || exit "$rc"   # ctest itself failed (no tests, bad arguments)
mapfile -t verdicts < <(classify "$tmp/run-try1.log" "$tmp/run-try1.out")
crashed=0 timing=()
for v in "${verdicts[@]}"; do
  IFS=$'\t' read -r cls name reason <<<"$v"
  if [ "$cls" = CRASH ]; then
    echo "tests/run.sh: CRASH in $name, not retried: $reason"
    crashed=1
  else
    timing+=("$name")
  fi
done
if [ $crashed = 1 ] || [ ${#timing[@]} = 0 ]; then
  exit "$rc"
fi
total=$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$tmp/run-try1.out" | tail -1)
echo "tests/run.sh: ${#timing[@]} test(s) failed (TIMING), running them once more: ${timing[*]}"
try 2 --rerun-failed "$@"
rc=$?
if [ $rc = 0 ]; then
  echo "tests/run.sh: passed on the retry: ${timing[*]}"
  # The run's result, as ctest --repeat until-pass:2 would have closed it.
  echo "100% tests passed, 0 tests failed out of ${total:-?}"
fi
exit $rc
