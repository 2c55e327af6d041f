# Tests of the training engine (worker/: backend, model, optimizer, train loop).
if(TARGET loom_engine)
    foreach(t ops optim train worker_tuning)
        add_executable(test_${t} ${CMAKE_CURRENT_LIST_DIR}/unit/test_${t}.c)
        target_link_libraries(test_${t} PRIVATE loom_engine)
        loom_warnings(test_${t})
        add_test(NAME unit.engine.${t} COMMAND test_${t})
        set_tests_properties(unit.engine.${t} PROPERTIES LABELS "unit;sanitize" TIMEOUT 120)
    endforeach()
    # test_train runs hundreds of forward passes: ~40 s in the -O0 sanitizer build.
    set_tests_properties(unit.engine.train PROPERTIES LABELS "unit")
    # The same gradient checks on the baseline (non-AVX2) kernel set.
    add_test(NAME unit.engine.ops_baseline COMMAND test_ops)
    set_tests_properties(unit.engine.ops_baseline PROPERTIES LABELS "unit;sanitize" TIMEOUT 120
                         ENVIRONMENT "LOOM_CPU_ISA=baseline")
    # Benchmark (not a test): build/bin/bench_cpu; numbers in docs/perf.md.
    add_executable(bench_cpu ${CMAKE_CURRENT_LIST_DIR}/bench/bench_cpu.c)
    target_link_libraries(bench_cpu PRIVATE loom_engine)
    loom_warnings(bench_cpu)
endif()

# loom-worker end to end: training, determinism, resume, SIGTERM, exit codes.
if(TARGET loom-worker)
    add_executable(test_worker ${CMAKE_CURRENT_LIST_DIR}/integration/test_worker.c)
    target_link_libraries(test_worker PRIVATE loom_engine)
    loom_warnings(test_worker)
    add_test(NAME integration.engine.worker COMMAND test_worker $<TARGET_FILE:loom-worker>)
    set_tests_properties(integration.engine.worker PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 300)
endif()

# Quick-start corpus: a small model lowers the validation loss (skipped without the corpus).
if(TARGET loom-worker AND TARGET loom-data)
    add_test(NAME integration.engine.quickstart
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/engine_quickstart.sh
                     $<TARGET_FILE:loom-data> $<TARGET_FILE:loom-worker>)
    set_tests_properties(integration.engine.quickstart PROPERTIES LABELS "integration"
                         SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
