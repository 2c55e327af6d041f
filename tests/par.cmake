# Tests of the parallelism area (owner: par): activation recompute, tensor
# parallelism, pipeline schedules; docs/parallelism.md. Multi-process tests
# run the real loom-worker with --nproc over Gloo; without Gloo they report
# skipped (77), never passed.
if(TARGET loom_engine)
    add_executable(test_par ${CMAKE_CURRENT_LIST_DIR}/unit/test_par.c)
    target_link_libraries(test_par PRIVATE loom_engine m)
    loom_warnings(test_par)
    foreach(part recompute slice)
        add_test(NAME unit.par.${part} COMMAND test_par ${part})
        set_tests_properties(unit.par.${part} PROPERTIES LABELS "unit;sanitize" TIMEOUT 120)
    endforeach()
endif()
