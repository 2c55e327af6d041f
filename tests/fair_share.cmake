# Fair shared fleet: tenant QoS, time limits and job dependencies against a
# real loomd with loom-agents running fake_worker (tests/integration/test_fair_share.py).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent)
    foreach(sc qos time_limit after fair_share preempt array budget)
        add_test(NAME integration.fair_share.${sc}
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_fair_share.py
                         ${CMAKE_BINARY_DIR}/bin ${sc})
        set_tests_properties(integration.fair_share.${sc} PROPERTIES LABELS "integration;sanitize"
                             SKIP_RETURN_CODE 77 TIMEOUT 120)
    endforeach()
endif()

# The dependency decision is a pure function (like supervise.c): its test
# compiles daemon/deps.c alone.
add_executable(test_deps ${CMAKE_CURRENT_LIST_DIR}/unit/test_deps.c ${CMAKE_SOURCE_DIR}/daemon/deps.c)
loom_warnings(test_deps)
add_test(NAME unit.deps COMMAND test_deps)
set_tests_properties(unit.deps PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)

# Fair share: the usage decay and the scheduler's equal-priority order (both pure).
add_executable(test_fairshare ${CMAKE_CURRENT_LIST_DIR}/unit/test_fairshare.c
               ${CMAKE_SOURCE_DIR}/daemon/fairshare.c ${CMAKE_SOURCE_DIR}/daemon/sched.c)
target_link_libraries(test_fairshare PRIVATE m)
loom_warnings(test_fairshare)
add_test(NAME unit.fairshare COMMAND test_fairshare)
set_tests_properties(unit.fairshare PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)

# Budgets of running jobs: the stop / warn decision (pure, budget.c alone).
add_executable(test_budget ${CMAKE_CURRENT_LIST_DIR}/unit/test_budget.c
               ${CMAKE_SOURCE_DIR}/daemon/budget.c)
target_link_libraries(test_budget PRIVATE m)
loom_warnings(test_budget)
add_test(NAME unit.budget COMMAND test_budget)
set_tests_properties(unit.budget PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)

# Benchmark of the pure scheduling pass and victim choice at fleet scale
# (docs/perf.md): build/bin/bench_sched_pass [--nodes 1000 --jobs 10000 ...].
# The smoke run checks every pass's placements on a small fleet.
add_executable(bench_sched_pass ${CMAKE_CURRENT_LIST_DIR}/bench/bench_sched_pass.c
               ${CMAKE_SOURCE_DIR}/daemon/sched.c ${CMAKE_SOURCE_DIR}/daemon/preempt.c)
target_link_libraries(bench_sched_pass PRIVATE loom_common m)
loom_warnings(bench_sched_pass)
add_test(NAME bench.sched_pass_smoke
         COMMAND bench_sched_pass --nodes 50 --jobs 500 --tenants 10 --passes 2)
set_tests_properties(bench.sched_pass_smoke PROPERTIES LABELS "unit" TIMEOUT 60)

# The budget scenario runs the real worker twice: room for a loaded machine.
if(TEST integration.fair_share.budget)
    set_tests_properties(integration.fair_share.budget PROPERTIES TIMEOUT 240)
endif()
