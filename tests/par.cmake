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
    add_executable(test_pp_schedule ${CMAKE_CURRENT_LIST_DIR}/unit/test_pp_schedule.c)
    target_link_libraries(test_pp_schedule PRIVATE loom_engine m)
    loom_warnings(test_pp_schedule)
    add_test(NAME unit.par.pp_schedule COMMAND test_pp_schedule)
    set_tests_properties(unit.par.pp_schedule PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()

# TP / PP equivalence of the real loom-worker (--nproc, <= 4 ranks) against
# the single-process curve; pipeline and memory figures; checkpoint reshard.
if(TARGET loom_engine AND TARGET loom-worker)
    add_executable(test_par_equiv ${CMAKE_CURRENT_LIST_DIR}/integration/test_par_equiv.c)
    target_link_libraries(test_par_equiv PRIVATE loom_engine PkgConfig::JANSSON m)
    loom_warnings(test_par_equiv)
    foreach(part tp pp mix ckpt budget)
        add_test(NAME integration.par.${part} COMMAND test_par_equiv $<TARGET_FILE:loom-worker> ${part})
        set_tests_properties(integration.par.${part} PROPERTIES LABELS integration TIMEOUT 300
                             SKIP_RETURN_CODE 77)
    endforeach()
    # tp x pp checkpoint reshard: quick enough for the sanitizer build too
    set_tests_properties(integration.par.ckpt PROPERTIES LABELS "integration;sanitize")
endif()

# tp2 x pp2 through loomd's HTTP rendezvous with real agents (reuses the cluster harness).
find_package(Python3 COMPONENTS Interpreter)
if(LOOM_HAVE_GLOO AND Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loom-worker
   AND TARGET loom-data)
    add_test(NAME integration.par.cluster
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_layout_cluster.py
                     ${CMAKE_BINARY_DIR}/bin tp=2,pp=2)
    set_tests_properties(integration.par.cluster PROPERTIES LABELS integration TIMEOUT 240
                         SKIP_RETURN_CODE 77)
endif()

# Pipeline timing split: a stage's waits on its neighbours are exposed
# communication, not compute, in the per-rank step records (worker/pp.c).
if(Python3_FOUND AND TARGET loom-worker AND TARGET loom-data)
    add_test(NAME integration.par.pp_timing
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_pp_timing.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.par.pp_timing PROPERTIES LABELS integration TIMEOUT 120)
endif()
