# The namespaced multi-host cluster (tests/cluster/netns_cluster.py): loomd
# and loom-agents in Linux network namespaces joined by veth pairs on a
# bridge, each host with its own 10.77.0.x address. Needs root and `ip netns`;
# elsewhere it exits 77 with "not run: ..." and ctest reports it as Not Run
# (SKIP_RETURN_CODE), never as passed, as the gpu tests do. Label netns:
# .ci/run runs it on its own with a fixed budget (180 s).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loom-worker)
    add_test(NAME integration.netns.cluster
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/cluster/netns_cluster.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.netns.cluster PROPERTIES LABELS "netns" TIMEOUT 180
                         SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()
