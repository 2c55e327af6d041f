# Tests of the GPU fleet support: the GPU type table (api/gpu_types.c), the
# architectures a CUDA build carries, the agent's GPU inventory parser and the
# price API.
add_executable(test_gpu_types ${CMAKE_CURRENT_LIST_DIR}/unit/test_gpu_types.c)
target_link_libraries(test_gpu_types PRIVATE loom_api loom_common m)
loom_warnings(test_gpu_types)
add_test(NAME unit.api.gpu_types COMMAND test_gpu_types)
set_tests_properties(unit.api.gpu_types PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)

# Fat-binary architectures of loom-worker and libloom_cuda.a; "Not Run" (77) in a
# build without the CUDA backend.
set(LOOM_ARCH_CHECK_LIST "${CMAKE_CUDA_ARCHITECTURES}")
if(NOT LOOM_HAVE_CUDA)
    set(LOOM_ARCH_CHECK_LIST "80-real;86-real;89-real;90-real;90-virtual")
endif()
string(REPLACE ";" "," LOOM_ARCH_CHECK_LIST "${LOOM_ARCH_CHECK_LIST}") # one argument
add_test(NAME unit.gpu_arch_check
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/gpu_arch_check.sh ${CMAKE_BINARY_DIR}/bin
                 ${CMAKE_BINARY_DIR}/lib "${LOOM_ARCH_CHECK_LIST}")
set_tests_properties(unit.gpu_arch_check PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 120)

# The agent's GPU inventory over recorded NVML answers (tests/unit/nvml/).
if(TARGET loom_agent_lib)
    add_executable(test_gpu_inventory ${CMAKE_CURRENT_LIST_DIR}/unit/test_gpu_inventory.c)
    target_link_libraries(test_gpu_inventory PRIVATE loom_agent_lib)
    loom_warnings(test_gpu_inventory)
    add_test(NAME unit.agent.gpu_inventory
             COMMAND test_gpu_inventory ${CMAKE_CURRENT_LIST_DIR}/unit/nvml)
    set_tests_properties(unit.agent.gpu_inventory PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)
endif()

# loomd with typed nodes registered over the agent protocol: nodes, prices,
# submit-time fit, placement by gpu_type, plan costs, usage at type prices.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd)
    add_test(NAME integration.fleet
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_fleet.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.fleet PROPERTIES LABELS "integration;sanitize" TIMEOUT 120)
endif()

# Node pools, labels and NVLink islands: PATCH /v1/nodes/{id}, selectors at
# submit and in placement, tp groups inside one island.
if(Python3_FOUND AND TARGET loomd)
    add_test(NAME integration.node_pools
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_node_pools.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.node_pools PROPERTIES LABELS "integration;sanitize" TIMEOUT 120)
endif()

# The worker's start-up memory check (worker/memcheck.c): verdicts and meminfo parsing.
add_executable(test_memcheck ${CMAKE_CURRENT_LIST_DIR}/unit/test_memcheck.c
               ${CMAKE_SOURCE_DIR}/worker/memcheck.c)
loom_warnings(test_memcheck)
add_test(NAME unit.memcheck COMMAND test_memcheck)
set_tests_properties(unit.memcheck PROPERTIES LABELS "unit;sanitize")

# The planner against a real cpu run through loomd (step time within a stated factor, at the
# node's measured peak), and the worker's start-up OUT_OF_MEMORY for an oversized plan.
if(Python3_FOUND AND TARGET loomd AND TARGET loom-worker)
    add_test(NAME integration.planner_real
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_planner_real.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.planner_real PROPERTIES LABELS "integration" TIMEOUT 300
                         SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()

# Saw-tooth utilization in the heartbeat telemetry -> a SAWTOOTH diagnosis
# (daemon/diagnose.c), as a job event and a job.diagnosis event.
if(Python3_FOUND AND TARGET loomd)
    add_test(NAME integration.sawtooth
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_sawtooth.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.sawtooth PROPERTIES LABELS "integration;sanitize" TIMEOUT 60)
endif()
