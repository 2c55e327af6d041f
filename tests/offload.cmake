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
    foreach(part world1 dp2 resume delayed)
        add_test(NAME integration.offload.${part}
                 COMMAND test_offload_equiv $<TARGET_FILE:loom-worker> ${part})
        set_tests_properties(integration.offload.${part} PROPERTIES LABELS "integration;sanitize"
                             TIMEOUT 300 SKIP_RETURN_CODE 77)
    endforeach()
endif()
# The CPU AdamW of the offload (worker/offload_adamw.h): every kernel set of
# the CPU against a scalar reference, bit for bit; against torch.optim.AdamW's
# formula in numpy (float64) to a few ulps; the thread pool.
if(TARGET loom_engine)
    add_executable(test_offload_adamw ${CMAKE_CURRENT_LIST_DIR}/unit/test_offload_adamw.c)
    target_link_libraries(test_offload_adamw PRIVATE loom_engine m)
    loom_warnings(test_offload_adamw)
    add_test(NAME unit.offload.adamw COMMAND test_offload_adamw)
    set_tests_properties(unit.offload.adamw PROPERTIES LABELS "unit;sanitize" TIMEOUT 120)
    add_test(NAME unit.offload.adamw_torch_formula
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\"; fi; done; echo 'SKIP: no python3 with numpy'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/unit/test_offload_adamw_ref.py
                     $<TARGET_FILE:test_offload_adamw>)
    set_tests_properties(unit.offload.adamw_torch_formula PROPERTIES LABELS "unit" TIMEOUT 120
                         SKIP_RETURN_CODE 77)
    # Benchmark (not a test): bin/bench_offload_adamw [GIB] [THREADS...]: GB/s of the
    # update beside the memcpy bandwidth of the same threads (tests/gpu/device/bench_offload.sh).
    add_executable(bench_offload_adamw ${CMAKE_SOURCE_DIR}/tests/bench/bench_offload_adamw.c)
    target_link_libraries(bench_offload_adamw PRIVATE loom_engine m)
    loom_warnings(bench_offload_adamw)
endif()
