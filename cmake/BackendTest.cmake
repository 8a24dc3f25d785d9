# connex_backend_test(<exe> SOURCE <test.c> OBJECTS <object library> LIBS <libs...>)
# A backend alone behind the shared fake core (tests/fake_core), linked with cmocka: the backend's
# objects, the fake core and the core's logging, options and process look-ups (proc.c), and the
# harness's report of faults on threads other than the test's (tests/cxt_fault.c). Returns
# without a target where cmocka is missing or tests are off (CONNEX_TESTS, declared by the root
# after the backends: unset means ON).
function(connex_backend_test exe)
  cmake_parse_arguments(BT "" "SOURCE;OBJECTS" "LIBS" ${ARGN})
  if(DEFINED CONNEX_TESTS AND NOT CONNEX_TESTS)
    return()
  endif()
  pkg_check_modules(CX_BT_CMOCKA IMPORTED_TARGET cmocka)
  if(NOT CX_BT_CMOCKA_FOUND)
    return()
  endif()
  enable_testing()
  add_executable(${exe} ${BT_SOURCE} ${PROJECT_SOURCE_DIR}/tests/fake_core/fake_core.c
                 ${PROJECT_SOURCE_DIR}/core/src/log.c ${PROJECT_SOURCE_DIR}/core/src/options.c
                 ${PROJECT_SOURCE_DIR}/core/src/proc.c $<TARGET_OBJECTS:${BT_OBJECTS}>
                 $<TARGET_OBJECTS:connex_be_util> ${PROJECT_SOURCE_DIR}/tests/cxt_fault.c)
  target_include_directories(${exe} PRIVATE ${PROJECT_SOURCE_DIR}/core/include ${PROJECT_SOURCE_DIR}/backends
                             ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests/fake_core)
  target_link_libraries(${exe} PRIVATE ${BT_LIBS} PkgConfig::CX_BT_CMOCKA Threads::Threads)
endfunction()
