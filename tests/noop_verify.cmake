# Checks that can fail: connex-demo and connex-bench transfer say they verify every transfer, so
# with data ops turned into no-ops that return 0 (noop_preload.c, through LD_PRELOAD) each must
# exit non-zero and name the op that failed; without the module both must pass.
#   cmake -DPRELOAD=<cx_noop_preload.so> -DDEMO=<connex-demo> -DBENCH=<connex-bench> -P noop_verify.cmake
# The demo runs on the backend of CONNEX_BACKEND (ctest sets zmq), the bench on zmq.
foreach(v PRELOAD DEMO BENCH)
  if(NOT ${v})
    message(FATAL_ERROR "noop_verify: -D${v}=... missing")
  endif()
endforeach()

set(bench_args transfer --backend zmq --sizes 4K,64K --iters 6 --budget-ms 200 --quiet --baselines none)
set(failures 0)

# run(<name> <ops|""> <skip> <expect: ok|fail> <regex the output must match> <command...>)
function(run name ops skip expect regex)
  if(ops)
    set(ENV{LD_PRELOAD} "${PRELOAD}")
    set(ENV{CXT_NOOP_OPS} "${ops}")
    set(ENV{CXT_NOOP_SKIP} "${skip}")
  else()
    unset(ENV{LD_PRELOAD})
    unset(ENV{CXT_NOOP_OPS})
    unset(ENV{CXT_NOOP_SKIP})
  endif()
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 60)
  unset(ENV{LD_PRELOAD})
  string(TIMESTAMP t1 "%s")
  math(EXPR dt "${t1} - ${t0}")
  set(all "${out}\n${err}")
  set(bad "")
  if(expect STREQUAL "ok" AND NOT rc EQUAL 0)
    set(bad "exit status ${rc}, expected 0")
  elseif(expect STREQUAL "fail" AND (rc EQUAL 0 OR NOT rc MATCHES "^[0-9]+$"))
    set(bad "exit status '${rc}', expected a non-zero exit")
  endif()
  if(NOT bad AND NOT all MATCHES "${regex}")
    set(bad "no line matching '${regex}'")
  endif()
  if(bad)
    message("noop_verify: ${name}: FAILED: ${bad}\n---- output ----\n${all}\n----")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  else()
    message("noop_verify: ${name}: ok (exit ${rc}, ${dt} s)")
  endif()
endfunction()

# Without the module: everything verifies.
run(demo "" 0 ok "all steps ok" ${DEMO} --quick)
run(bench "" 0 ok "put_signal +64 KiB [^\n]*ok \\(every op checked on arrival" ${BENCH} ${bench_args})

# One kind at a time, the first call let through: a check of the first op alone does not pass.
run(demo_noop_read read 1 fail "\nread +4 KiB [^\n]*FAIL: op 1: data differs" ${DEMO} --quick)
run(demo_noop_write write 1 fail "\nwrite +4 KiB [^\n]*FAIL: op 1: peer's memory differs" ${DEMO} --quick)
run(demo_noop_put_signal put_signal 1 fail
    "\nput_signal +4 KiB [^\n]*FAIL: op 1: data not in place when the signal arrived" ${DEMO} --quick)
# The bench checks warm-up ops too; 3 let through reach past its warm-up (2 ops here) into the
# timed loop and across sizes: 64K fails at its first op.
run(bench_noop_read read 3 fail "read +4 KiB [^\n]*FAIL: op 3: data differs" ${BENCH} ${bench_args})
run(bench_noop_write write 3 fail "write +4 KiB [^\n]*FAIL: op 3: written data not at the peer"
    ${BENCH} ${bench_args})
run(bench_noop_put_signal put_signal 3 fail
    "put_signal +4 KiB [^\n]*FAIL: op 3: data not in place when the signal arrived" ${BENCH} ${bench_args})
run(bench_noop_read_later read 10 fail "read +64 KiB [^\n]*FAIL: op 2: data differs" ${BENCH} ${bench_args})
# --mem sim: both sides' memory on the simulated device, checked through host copies; the host
# run of the same variant goes first, and the staged table pairs the two.
run(bench_mem "" 0 ok "write +64 KiB +zmq \\[sim,sim\\][^\n]*ok \\(every op checked at the peer[^\n]*\n.*zmq +write +64 KiB sim,sim"
    ${BENCH} ${bench_args} --mem sim)
run(bench_mem_noop_read read 3 fail "read +4 KiB +zmq \\[sim,sim\\][^\n]*FAIL: op 0: data differs" ${BENCH}
    ${bench_args} --mem sim)

if(failures GREATER 0)
  message(FATAL_ERROR "noop_verify: ${failures} case(s) failed")
endif()
