# Tests of the comm area: worker/comm (interface, rendezvous, local backend),
# worker/gloo (cpu collectives), DP/ZeRO equivalence and the all-reduce
# benchmark. Owner: comm. Multi-process tests fork their ranks (2-4) from the
# test binary with a file: rendezvous in a fresh temp dir; without Gloo they
# report skipped (77), never passed.
if(TARGET loom_engine)
    add_executable(test_comm ${CMAKE_CURRENT_LIST_DIR}/unit/test_comm.c)
    target_link_libraries(test_comm PRIVATE loom_engine PkgConfig::MHD PkgConfig::JANSSON)
    loom_warnings(test_comm)
    add_test(NAME unit.comm.basic COMMAND test_comm basic)
    set_tests_properties(unit.comm.basic PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
    foreach(part collectives failure http)
        add_test(NAME unit.comm.${part} COMMAND test_comm ${part})
        set_tests_properties(unit.comm.${part} PROPERTIES LABELS "unit;sanitize" TIMEOUT 120
                             SKIP_RETURN_CODE 77)
    endforeach()

    # DP/ZeRO equivalence of the real loom-worker (--nproc) against the
    # single-process run; memory formulas; reshard and bit-exact resume.
    if(TARGET loom-worker)
        add_executable(test_dp_equiv ${CMAKE_CURRENT_LIST_DIR}/integration/test_dp_equiv.c)
        target_link_libraries(test_dp_equiv PRIVATE loom_engine PkgConfig::JANSSON m)
        loom_warnings(test_dp_equiv)
        foreach(part dp2 dp4 reshard launcher)
            add_test(NAME integration.comm.dp_${part}
                     COMMAND test_dp_equiv $<TARGET_FILE:loom-worker> ${part})
            set_tests_properties(integration.comm.dp_${part} PROPERTIES LABELS integration
                                 TIMEOUT 300 SKIP_RETURN_CODE 77)
        endforeach()
        # quick enough for the sanitizer build too
        set_tests_properties(integration.comm.dp_reshard integration.comm.dp_launcher
                             PROPERTIES LABELS "integration;sanitize")
    endif()

    # The all-reduce benchmark (docs/perf.md); its smoke run checks results.
    add_executable(bench_allreduce ${CMAKE_CURRENT_LIST_DIR}/bench/bench_allreduce.c)
    target_link_libraries(bench_allreduce PRIVATE loom_engine)
    loom_warnings(bench_allreduce)
    add_test(NAME unit.comm.bench_smoke
             COMMAND bench_allreduce --ranks 2,3 --min-mb 0.25 --max-mb 1 --iters 2)
    set_tests_properties(unit.comm.bench_smoke PROPERTIES LABELS unit TIMEOUT 60
                         SKIP_RETURN_CODE 77)

    # The nccl backend on 2-4 GPUs (label gpu; exit 77 without 2 GPUs).
    if(TARGET loom_nccl)
        add_executable(test_comm_nccl ${CMAKE_CURRENT_LIST_DIR}/gpu/test_comm_nccl.c)
        target_link_libraries(test_comm_nccl PRIVATE loom_engine CUDA::cudart_static m)
        loom_warnings(test_comm_nccl)
        add_test(NAME gpu.comm.nccl COMMAND test_comm_nccl)
        set_tests_properties(gpu.comm.nccl PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
    endif()

    # DP through loomd's HTTP rendezvous with real agents (reuses the cluster harness).
    find_package(Python3 COMPONENTS Interpreter)
    if(LOOM_HAVE_GLOO AND Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loom-worker
       AND TARGET loom-data)
        add_test(NAME integration.comm.dp_cluster
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_layout_cluster.py
                         ${CMAKE_BINARY_DIR}/bin dp=2,zero_stage=3)
        set_tests_properties(integration.comm.dp_cluster PROPERTIES LABELS integration TIMEOUT 240
                             SKIP_RETURN_CODE 77)
    endif()
endif()
