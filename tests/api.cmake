# Tests of api/ (model table, job spec, planner). Owner: api.
foreach(t model jobspec planner)
    add_executable(test_${t} ${CMAKE_CURRENT_LIST_DIR}/unit/test_${t}.c)
    target_link_libraries(test_${t} PRIVATE loom_api loom_common m)
    loom_warnings(test_${t})
    add_test(NAME unit.api.${t} COMMAND test_${t})
    set_tests_properties(unit.api.${t} PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endforeach()
