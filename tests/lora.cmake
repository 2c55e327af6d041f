# LoRA fine-tuning (worker/lora.c): adapter gradients by finite differences (unit), and
# the real loom-worker's 10-step loss curve, exports and refusals against an independent
# torch reference (integration; needs python3 with numpy and torch, Debian's
# python3-numpy / python3-torch, which tools/setup.sh installs; without them the test is
# reported as skipped, never as passed).
if(TARGET loom_engine)
    add_executable(test_lora_grad ${CMAKE_CURRENT_LIST_DIR}/unit/test_lora_grad.c)
    target_link_libraries(test_lora_grad PRIVATE loom_engine)
    loom_warnings(test_lora_grad)
    add_test(NAME unit.lora.grad COMMAND test_lora_grad)
    set_tests_properties(unit.lora.grad PROPERTIES LABELS "unit;sanitize" TIMEOUT 120)
endif()
if(TARGET loom-worker)
    add_test(NAME integration.lora.train
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/lora/test_lora.py $<TARGET_FILE:loom-worker>)
    set_tests_properties(integration.lora.train PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
if(TARGET loom_engine)
    add_executable(test_fp8base ${CMAKE_CURRENT_LIST_DIR}/unit/test_fp8base.c)
    target_link_libraries(test_fp8base PRIVATE loom_engine)
    loom_warnings(test_fp8base)
    add_test(NAME unit.lora.fp8base COMMAND test_fp8base)
    set_tests_properties(unit.lora.fp8base PROPERTIES LABELS "unit;sanitize" TIMEOUT 120)
endif()
