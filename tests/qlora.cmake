# QLoRA (train.quantize_base "nf4", worker/nf4.c): the NF4 quantizer's round trip against
# an independent numpy implementation of the QLoRA / bitsandbytes scheme (tests/qlora/
# nf4_tool.c runs Loom's quantizer over the test's values), the error against bf16, and a
# tiny HF llama QLoRA run of the real loom-worker on cpu whose loss curve matches a torch
# float64 reference over the same (numpy-)dequantized base. Needs python3 with numpy and
# torch (Debian's python3-numpy / python3-torch, installed by tools/setup.sh); reported as
# skipped without them, never as passed.
if(TARGET loom_engine)
    add_executable(nf4_tool ${CMAKE_CURRENT_LIST_DIR}/qlora/nf4_tool.c)
    target_link_libraries(nf4_tool PRIVATE loom_engine)
    loom_warnings(nf4_tool)
endif()
if(TARGET loom-worker AND TARGET nf4_tool)
    add_test(NAME integration.qlora.nf4
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\" \"$2\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/qlora/test_qlora.py $<TARGET_FILE:loom-worker>
                     $<TARGET_FILE:nf4_tool>)
    set_tests_properties(integration.qlora.nf4 PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
