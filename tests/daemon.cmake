# Tests of loomd (daemon/), its API contract (api/openapi.yaml) and loomctl.
# Unit tests link loom_daemon; integration tests start the real loomd on an
# ephemeral loopback port (--listen 127.0.0.1:0, URL read from loomd.addr).
if(TARGET loom_daemon)
    add_executable(test_store ${CMAKE_CURRENT_LIST_DIR}/unit/test_store.c)
    target_link_libraries(test_store PRIVATE loom_daemon)
    loom_warnings(test_store)
    add_test(NAME unit.store COMMAND test_store)
    set_tests_properties(unit.store PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)

    # Billing: hour-cut usage rows, end causes and the --bill-causes policy.
    add_executable(test_billing ${CMAKE_CURRENT_LIST_DIR}/unit/test_billing.c)
    target_link_libraries(test_billing PRIVATE loom_daemon)
    loom_warnings(test_billing)
    add_test(NAME unit.billing COMMAND test_billing)
    set_tests_properties(unit.billing PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()

# Integration: the real loomd driven with libcurl.
if(TARGET loomd)
    add_library(loom_daemon_harness STATIC ${CMAKE_CURRENT_LIST_DIR}/integration/daemon_harness.c)
    target_include_directories(loom_daemon_harness PUBLIC ${CMAKE_CURRENT_LIST_DIR}/integration)
    target_link_libraries(loom_daemon_harness PUBLIC loom_common PkgConfig::CURL PkgConfig::JANSSON)
    loom_warnings(loom_daemon_harness)

    add_executable(test_daemon_api ${CMAKE_CURRENT_LIST_DIR}/integration/test_daemon_api.c)
    target_link_libraries(test_daemon_api PRIVATE loom_daemon_harness)
    loom_warnings(test_daemon_api)
    add_test(NAME integration.daemon_api COMMAND test_daemon_api $<TARGET_FILE:loomd>)
    set_tests_properties(integration.daemon_api PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 120)
endif()
if(TARGET loomd)
    add_executable(test_daemon_crash ${CMAKE_CURRENT_LIST_DIR}/integration/test_daemon_crash.c)
    target_link_libraries(test_daemon_crash PRIVATE loom_daemon_harness PkgConfig::SQLITE
                          Threads::Threads)
    loom_warnings(test_daemon_crash)
    add_test(NAME integration.daemon_crash COMMAND test_daemon_crash $<TARGET_FILE:loomd>)
    set_tests_properties(integration.daemon_crash PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 120)
endif()
# Benchmark (not a test): build/bin/bench_daemon build/bin/loomd [--jobs N] [--seconds S]
if(TARGET loomd)
    add_executable(bench_daemon ${CMAKE_CURRENT_LIST_DIR}/bench/bench_daemon.c)
    target_link_libraries(bench_daemon PRIVATE loom_daemon_harness Threads::Threads)
    loom_warnings(bench_daemon)
endif()
if(TARGET loom_daemon)
    add_executable(test_daemon_openapi ${CMAKE_CURRENT_LIST_DIR}/unit/test_daemon_openapi.c)
    target_link_libraries(test_daemon_openapi PRIVATE loom_daemon)
    loom_warnings(test_daemon_openapi)
    add_test(NAME unit.openapi_routes
             COMMAND test_daemon_openapi ${CMAKE_SOURCE_DIR}/api/openapi.yaml)
    set_tests_properties(unit.openapi_routes PROPERTIES LABELS "unit;sanitize")
    add_test(NAME unit.openapi_spec_drift
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/check_openapi_spec_drift.sh
                     $<TARGET_FILE:test_daemon_openapi> ${CMAKE_SOURCE_DIR}/api/openapi.yaml)
    set_tests_properties(unit.openapi_spec_drift PROPERTIES LABELS unit)
endif()
if(TARGET loomd AND TARGET loomctl)
    add_test(NAME integration.daemon_curl
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/test_daemon_curl.sh
                     $<TARGET_FILE:loomd> $<TARGET_FILE:loomctl>)
    set_tests_properties(integration.daemon_curl PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 60 SKIP_RETURN_CODE 77)
    add_test(NAME integration.daemon_tls
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/test_daemon_tls.sh
                     $<TARGET_FILE:loomd> $<TARGET_FILE:loomctl>
                     $<$<TARGET_EXISTS:loom-agent>:$<TARGET_FILE:loom-agent>>
                     $<$<TARGET_EXISTS:loom-worker>:$<TARGET_FILE:loom-worker>>
                     $<$<TARGET_EXISTS:loom-data>:$<TARGET_FILE:loom-data>>)
    set_tests_properties(integration.daemon_tls PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 180 SKIP_RETURN_CODE 77)
    add_test(NAME integration.daemon_tokens
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/test_daemon_tokens.sh
                     $<TARGET_FILE:loomd>)
    set_tests_properties(integration.daemon_tokens PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 120 SKIP_RETURN_CODE 77)
    add_test(NAME integration.daemon_audit
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/test_daemon_audit.sh
                     $<TARGET_FILE:loomd>)
    set_tests_properties(integration.daemon_audit PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
# Every error code the sources answer with is a row of api/errors.h (with its status).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
    add_test(NAME unit.error_codes
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/check_error_codes.py
                     ${CMAKE_SOURCE_DIR})
    set_tests_properties(unit.error_codes PROPERTIES LABELS unit)
endif()
add_test(NAME unit.openapi_yaml
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/check_daemon_openapi_yaml.sh
                 ${CMAKE_SOURCE_DIR}/api/openapi.yaml)
set_tests_properties(unit.openapi_yaml PROPERTIES LABELS unit SKIP_RETURN_CODE 77)
if(TARGET loom_daemon)
    add_executable(test_daemon_http ${CMAKE_CURRENT_LIST_DIR}/unit/test_daemon_http.c)
    target_link_libraries(test_daemon_http PRIVATE loom_daemon)
    loom_warnings(test_daemon_http)
    add_test(NAME unit.daemon_http COMMAND test_daemon_http)
    set_tests_properties(unit.daemon_http PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)
endif()
# The attempt supervisor is a pure function (like sched.c): its test compiles
# daemon/supervise.c alone and does not need the rest of loomd.
add_executable(test_supervise ${CMAKE_CURRENT_LIST_DIR}/unit/test_supervise.c
               ${CMAKE_SOURCE_DIR}/daemon/supervise.c)
loom_warnings(test_supervise)
add_test(NAME unit.supervise COMMAND test_supervise)
set_tests_properties(unit.supervise PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)

# Abuse limits: waves of dropped log-follow streams of a running job (loom-agent
# + fake_worker) and half-open connections; /healthz and an authenticated GET
# stay under 1 s and no CLOSE_WAIT piles up (tests/integration/test_abuse_limits.py).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET fake_worker)
    add_test(NAME integration.daemon_abuse_limits
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_abuse_limits.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.daemon_abuse_limits PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 60)
endif()

# Preemption's victim choice is pure (daemon/preempt.c over daemon/sched.c).
add_executable(test_preempt ${CMAKE_CURRENT_LIST_DIR}/unit/test_preempt.c
               ${CMAKE_SOURCE_DIR}/daemon/preempt.c ${CMAKE_SOURCE_DIR}/daemon/sched.c)
loom_warnings(test_preempt)
add_test(NAME unit.preempt COMMAND test_preempt)
set_tests_properties(unit.preempt PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)

# The straggler / comm-bound diagnosis (daemon/diagnose.c): pure, compiled alone.
add_executable(test_diagnose ${CMAKE_CURRENT_LIST_DIR}/unit/test_diagnose.c
               ${CMAKE_SOURCE_DIR}/daemon/diagnose.c)
target_include_directories(test_diagnose PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(test_diagnose PRIVATE PkgConfig::JANSSON m)
loom_warnings(test_diagnose)
add_test(NAME unit.diagnose COMMAND test_diagnose)
set_tests_properties(unit.diagnose PROPERTIES LABELS "unit;sanitize")

# What diagnosis sampling costs (tests/bench/bench_diag.py; docs/perf.md
# "Diagnosis cost"): two pairs of short runs with LOOM_DIAG=1 / 0, so the
# script keeps working and the switch keeps doing what it says (rank_step
# lines, and in the full path the per-rank series reaching loomd, only with
# sampling on). Full runs: python3 tests/bench/bench_diag.py worker|cluster build/bin.
if(Python3_FOUND AND TARGET loom-worker)
    add_test(NAME bench.diag_worker_smoke
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/bench_diag.py worker
                     ${CMAKE_BINARY_DIR}/bin --smoke)
    set_tests_properties(bench.diag_worker_smoke PROPERTIES LABELS bench TIMEOUT 180)
endif()
if(Python3_FOUND AND TARGET loom-worker AND TARGET loomd AND TARGET loom-agent)
    add_test(NAME bench.diag_cluster_smoke
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/bench_diag.py cluster
                     ${CMAKE_BINARY_DIR}/bin --smoke)
    set_tests_properties(bench.diag_cluster_smoke PROPERTIES LABELS bench TIMEOUT 240)
endif()
if(Python3_FOUND AND TARGET loom-worker)
    add_test(NAME bench.diag_ab_smoke
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/bench_diag.py worker
                     ${CMAKE_BINARY_DIR}/bin --smoke --ab 2)
    set_tests_properties(bench.diag_ab_smoke PROPERTIES LABELS bench TIMEOUT 120)
endif()
# The pieces of that cost timed alone (bench_diag_cost: the rank_step line,
# a clock read, the parse, diag_add at world 2..512); the smoke checks its
# own counts.
if(TARGET loom_engine)
    add_executable(bench_diag_cost ${CMAKE_CURRENT_LIST_DIR}/bench/bench_diag_cost.c
                   ${CMAKE_SOURCE_DIR}/daemon/diagnose.c)
    target_include_directories(bench_diag_cost PRIVATE ${CMAKE_SOURCE_DIR})
    target_link_libraries(bench_diag_cost PRIVATE loom_engine PkgConfig::JANSSON m)
    loom_warnings(bench_diag_cost)
    add_test(NAME bench.diag_cost_smoke COMMAND bench_diag_cost 2000)
    set_tests_properties(bench.diag_cost_smoke PROPERTIES LABELS bench TIMEOUT 60)
endif()
# A straggler made with SIGSTOP/SIGCONT from outside (20 ms of every 30 ms)
# through loomd, an agent and the real worker: named once, not before.
if(Python3_FOUND AND TARGET loom-worker AND TARGET loomd AND TARGET loom-agent)
    add_test(NAME integration.straggler_stop
             COMMAND ${Python3_EXECUTABLE}
                     ${CMAKE_CURRENT_LIST_DIR}/integration/test_straggler_stop.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.straggler_stop PROPERTIES LABELS integration TIMEOUT 150)
endif()
