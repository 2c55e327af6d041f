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
