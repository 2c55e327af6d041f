# Tests of loomd (daemon/), its API contract (api/openapi.yaml) and loomctl.
# Unit tests link loom_daemon; integration tests start the real loomd on an
# ephemeral loopback port (--listen 127.0.0.1:0, URL read from loomd.addr).
if(TARGET loom_daemon)
    add_executable(test_store ${CMAKE_CURRENT_LIST_DIR}/unit/test_store.c)
    target_link_libraries(test_store PRIVATE loom_daemon)
    loom_warnings(test_store)
    add_test(NAME unit.store COMMAND test_store)
    set_tests_properties(unit.store PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
