# After qlora.cmake (the glob's order), which defines nf4_tool.
# QLoRA over dp2 (ZeRO 0-2), pp2 and pp2 x dp2 against one process, the merged export
# against numpy's dequant(base) + alpha/r B A, the tp refusal (tests/lora/test_qlora_par.py)
if(TARGET loom-worker AND TARGET nf4_tool)
    add_test(NAME integration.qlora.par
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\" \"$2\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/lora/test_qlora_par.py $<TARGET_FILE:loom-worker>
                     $<TARGET_FILE:nf4_tool>)
    set_tests_properties(integration.qlora.par PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
