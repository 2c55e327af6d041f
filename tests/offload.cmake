# Optimizer offload (worker/offload.h): engine-level checks (host state,
# memory accounting, parallel init) and the real loom-worker with the
# offload on vs off (world 1, dp 2 with ZeRO 1-3, checkpoint cross-resume).
if(TARGET loom_engine)
    add_executable(test_offload ${CMAKE_CURRENT_LIST_DIR}/unit/test_offload.c)
    target_link_libraries(test_offload PRIVATE loom_engine)
    loom_warnings(test_offload)
    add_test(NAME unit.offload.engine COMMAND test_offload)
    set_tests_properties(unit.offload.engine PROPERTIES LABELS "unit;sanitize" TIMEOUT 300)
endif()
if(TARGET loom-worker)
    add_executable(test_offload_equiv ${CMAKE_CURRENT_LIST_DIR}/integration/test_offload_equiv.c)
    target_link_libraries(test_offload_equiv PRIVATE loom_engine PkgConfig::JANSSON m)
    loom_warnings(test_offload_equiv)
    foreach(part world1 dp2 resume)
        add_test(NAME integration.offload.${part}
                 COMMAND test_offload_equiv $<TARGET_FILE:loom-worker> ${part})
        set_tests_properties(integration.offload.${part} PROPERTIES LABELS "integration;sanitize"
                             TIMEOUT 300 SKIP_RETURN_CODE 77)
    endforeach()
endif()
