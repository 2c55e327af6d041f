# Memory that ZeRO-2/3 and pipeline parallelism promise is really allocated
# (owner: mem; docs/internals/comm.md "Memory"): reported bytes == bytes live
# in a counting backend == the formulas, table-driven, forked ranks over Gloo.
if(TARGET loom_engine)
    add_executable(test_zero_mem ${CMAKE_CURRENT_LIST_DIR}/unit/test_zero_mem.c)
    target_link_libraries(test_zero_mem PRIVATE loom_engine)
    loom_warnings(test_zero_mem)
    add_test(NAME unit.mem.zero COMMAND test_zero_mem)
    set_tests_properties(unit.mem.zero PROPERTIES LABELS "unit;sanitize" TIMEOUT 120
                         SKIP_RETURN_CODE 77)
endif()
