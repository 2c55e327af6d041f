# model.init_from resolved by loomd at submit (daemon/initfrom.c, api/hf_config.c):
# an HF directory given alone, forks of a finished job (job:<id>[@<step>]) and a
# PEFT adapter directory continued with train.lora (its base resolved from the adapter),
# through a real loomd + loom-agent + cpu loom-worker on loopback, checked against
# the independent torch forward of tests/hf. Needs a python3 with numpy and torch
# (tools/setup.sh installs Debian's); without one the tests are reported as skipped.
if(TARGET loomd AND TARGET loom-agent AND TARGET loom-worker)
    foreach(sc hf fork peft)
        add_test(NAME integration.init_from.${sc}
                 COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\" \"$2\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                         ${CMAKE_CURRENT_LIST_DIR}/integration/test_init_from.py
                         ${CMAKE_BINARY_DIR}/bin ${sc})
        set_tests_properties(integration.init_from.${sc} PROPERTIES LABELS "integration"
                             SKIP_RETURN_CODE 77 TIMEOUT 600)
    endforeach()
endif()
if(TARGET loom_daemon)
    add_executable(test_initfrom ${CMAKE_CURRENT_LIST_DIR}/unit/test_initfrom.c)
    target_link_libraries(test_initfrom PRIVATE loom_daemon)
    loom_warnings(test_initfrom)
    add_test(NAME unit.init_from COMMAND test_initfrom)
    set_tests_properties(unit.init_from PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
