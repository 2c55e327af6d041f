# Rendezvous (daemon/rdzv.c): the node-check scope answers as the attempt scope
# (the attempt scope itself is covered by integration.cluster.rdzv).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd)
    add_test(NAME integration.rdzv_scopes
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_rdzv_scopes.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.rdzv_scopes PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
