# Tests of the training engine (worker/: backend, model, optimizer, train loop).
if(TARGET loom_engine)
    add_executable(test_ops ${CMAKE_CURRENT_LIST_DIR}/unit/test_ops.c)
    target_link_libraries(test_ops PRIVATE loom_engine)
    loom_warnings(test_ops)
    add_test(NAME unit.engine.ops COMMAND test_ops)
    set_tests_properties(unit.engine.ops PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
