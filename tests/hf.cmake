# Hugging Face models (worker/hf*.c): import, score and generate against an
# independent torch reference, export round trip, malformed directories, and
# import under tp2 / pp2 / dp2 ZeRO-3. Needs a python3 with numpy and torch
# (Debian's python3-numpy, python3-torch; tools/setup.sh installs them):
# the first such python3 on /usr/bin or PATH runs the script; without one the
# tests are reported as skipped, never as passed.
if(TARGET loom_engine)
    add_executable(test_hf_config ${CMAKE_CURRENT_LIST_DIR}/unit/test_hf_config.c)
    target_link_libraries(test_hf_config PRIVATE loom_engine)
    loom_warnings(test_hf_config)
    add_test(NAME unit.hf.config COMMAND test_hf_config)
    set_tests_properties(unit.hf.config PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
if(TARGET loom-worker)
    foreach(part forward export bad parallel)
        add_test(NAME integration.hf.${part}
                 COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\" \"$2\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                         ${CMAKE_CURRENT_LIST_DIR}/hf/test_hf.py $<TARGET_FILE:loom-worker> ${part})
        set_tests_properties(integration.hf.${part} PROPERTIES LABELS "integration"
                             SKIP_RETURN_CODE 77 TIMEOUT 600)
    endforeach()
    # the worker's import, export and parallel load paths under the sanitizers too
    # (forward spends its time in torch, not in the worker)
    foreach(part export bad parallel)
        set_tests_properties(integration.hf.${part} PROPERTIES LABELS "integration;sanitize")
    endforeach()
endif()
if(TARGET loom-worker AND LOOM_HAVE_CUDA)
    add_test(NAME gpu.hf.score
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\" \"$2\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/hf/test_hf.py $<TARGET_FILE:loom-worker> cuda)
    set_tests_properties(gpu.hf.score PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
# the CUDA backend's decode operations (attention_decode, rope_at, rope_set_freqs;
# worker/cuda/k_decode.cu) against double references computed in the test
if(TARGET loom_engine AND LOOM_HAVE_CUDA)
    add_executable(test_gpu_decode ${CMAKE_CURRENT_LIST_DIR}/gpu/test_decode.c)
    target_link_libraries(test_gpu_decode PRIVATE loom_engine m)
    loom_warnings(test_gpu_decode)
    add_test(NAME gpu.decode COMMAND test_gpu_decode)
    set_tests_properties(gpu.decode PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
