# Tests of api/ (model table, job spec, planner). Owner: api.
foreach(t model jobspec planner)
    add_executable(test_${t} ${CMAKE_CURRENT_LIST_DIR}/unit/test_${t}.c)
    target_link_libraries(test_${t} PRIVATE loom_api loom_common m)
    loom_warnings(test_${t})
    add_test(NAME unit.api.${t} COMMAND test_${t})
    set_tests_properties(unit.api.${t} PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endforeach()
# Planner estimate vs the engine's real allocation on the CPU backend.
if(TARGET loom_engine)
    add_executable(test_planner_engine ${CMAKE_CURRENT_LIST_DIR}/unit/test_planner_engine.c)
    target_link_libraries(test_planner_engine PRIVATE loom_engine loom_api loom_common m)
    loom_warnings(test_planner_engine)
    add_test(NAME unit.api.planner_engine COMMAND test_planner_engine)
    set_tests_properties(unit.api.planner_engine PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
# loomctl plan --local prints the tables and a recommendation without a server.
if(TARGET loomctl)
    add_test(NAME unit.api.loomctl_plan_local
             COMMAND sh -c "echo '{\"model\":{\"family\":\"llama\",\"preset\":\"70b\"},\"train\":{\"micro_batch\":1,\"global_batch_tokens\":1048576}}' | $<TARGET_FILE:loomctl> plan - --local --nodes 1 --gpu H100-80GB > plan.out && grep -q '^fits       NO' plan.out && grep -q 'GiB/GPU > 80 GiB' plan.out && grep -q '^recommend  dp=.*zero_stage=3 offload_optimizer=true' plan.out")
    set_tests_properties(unit.api.loomctl_plan_local PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
# Benchmark (not a test): build-*/bin/bench_api [iterations]
add_executable(bench_api ${CMAKE_CURRENT_LIST_DIR}/bench/bench_api.c)
target_link_libraries(bench_api PRIVATE loom_api loom_common m)
loom_warnings(bench_api)
# The same comparison on the CUDA backend (bf16); skipped (77) without a GPU.
if(LOOM_HAVE_CUDA AND TARGET test_planner_engine)
    add_test(NAME gpu.api.planner_engine COMMAND test_planner_engine cuda)
    set_tests_properties(gpu.api.planner_engine PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
                                                           TIMEOUT 120)
endif()
