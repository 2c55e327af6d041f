# The cpu peak for MFU (agent/cpupeak.h, worker/cpu_peak.h): a real loomd, one
# agent with one cpu device and the real loom-worker; the node's measured
# cpu_peak_gflops and the job's per-step mfu (tests/integration/test_cpu_peak.py).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loom-worker
   AND TARGET loom-data)
    add_test(NAME integration.cpu_peak
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_cpu_peak.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.cpu_peak PROPERTIES LABELS integration SKIP_RETURN_CODE 77
                         TIMEOUT 120)
endif()
