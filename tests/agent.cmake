# Tests of the agent area: scheduler, loom-agent, attempts, rendezvous,
# cluster integration (real loomd + agents on loopback), benchmark.
# test_sched compiles daemon/sched.c directly: it is a pure function and the
# test must not depend on the rest of loomd building.
add_executable(test_sched ${CMAKE_CURRENT_LIST_DIR}/unit/test_sched.c
               ${CMAKE_SOURCE_DIR}/daemon/sched.c)
loom_warnings(test_sched)
add_test(NAME unit.sched COMMAND test_sched)
set_tests_properties(unit.sched PROPERTIES LABELS "unit;sanitize")

# Stand-in worker for cluster and fault tests (see tests/fake_worker.c).
add_executable(fake_worker ${CMAKE_CURRENT_LIST_DIR}/fake_worker.c)
target_link_libraries(fake_worker PRIVATE loom_api PkgConfig::JANSSON)
loom_warnings(fake_worker)

# Cluster integration tests: real loomd + 2 agents (--cpu-devices 2) on
# loopback with fake_worker; one ctest per scenario so they run in parallel.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent)
    foreach(sc happy crash crash_no_retry hang node_lost loomd_restart agent_restart
               agent_restart_kill cancel rdzv sched quota_priority soak)
        add_test(NAME integration.cluster.${sc}
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_cluster.py
                         ${CMAKE_BINARY_DIR}/bin ${sc})
        set_tests_properties(integration.cluster.${sc} PROPERTIES LABELS "integration;sanitize"
                             SKIP_RETURN_CODE 77 TIMEOUT 120)
    endforeach()
    # The real loom-worker (tiny GPT-2 on the cpu backend) under agents. Not
    # in the sanitizer run: the engine's own tests cover its sanitizer state.
    foreach(sc real_worker real_worker_retry)
        add_test(NAME integration.cluster.${sc}
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_cluster.py
                         ${CMAKE_BINARY_DIR}/bin ${sc})
        set_tests_properties(integration.cluster.${sc} PROPERTIES LABELS integration
                             SKIP_RETURN_CODE 77 TIMEOUT 120)
    endforeach()
endif()

# Supervision and inventory of loom-agent, with fake_worker as the worker.
add_executable(test_agent_task ${CMAKE_CURRENT_LIST_DIR}/unit/test_agent_task.c)
target_link_libraries(test_agent_task PRIVATE loom_agent_lib)
loom_warnings(test_agent_task)
add_test(NAME unit.agent_task COMMAND test_agent_task $<TARGET_FILE:fake_worker>)
set_tests_properties(unit.agent_task PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)

# The scheduler benchmark in a small configuration, so the script keeps
# working (full run: python3 tests/bench/bench_sched.py build/bin; docs/perf.md).
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent)
    add_test(NAME bench.sched_smoke
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bench/bench_sched.py
                     ${CMAKE_BINARY_DIR}/bin --latency-jobs 5 --tiny-jobs 20 --node-timeout 3)
    set_tests_properties(bench.sched_smoke PROPERTIES LABELS integration TIMEOUT 120)
endif()

# The workers' listen address (agent/commaddr.c), against the loopback interface.
add_executable(test_commaddr ${CMAKE_CURRENT_LIST_DIR}/unit/test_commaddr.c)
target_link_libraries(test_commaddr PRIVATE loom_agent_lib)
loom_warnings(test_commaddr)
add_test(NAME unit.commaddr COMMAND test_commaddr)
set_tests_properties(unit.commaddr PROPERTIES LABELS "unit;sanitize")
