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
# The fast NF4 quantizer (pthreads, threshold comparisons) against the serial reference,
# byte for byte, on 1, 2 and 7 threads; and its benchmark (docs/perf.md "NF4
# quantization"), run tiny as a smoke test.
if(TARGET loom_engine)
    add_executable(test_nf4_threads ${CMAKE_CURRENT_LIST_DIR}/unit/test_nf4_threads.c)
    target_link_libraries(test_nf4_threads PRIVATE loom_engine)
    loom_warnings(test_nf4_threads)
    add_test(NAME unit.nf4.threads COMMAND test_nf4_threads)
    set_tests_properties(unit.nf4.threads PROPERTIES LABELS "unit;sanitize" TIMEOUT 300)
    # tp shards of an NF4 base: the dequantized shard equals the whole tensor's slice, bit
    # for bit (the shard functions, and the engine storage of every tp rank on cpu)
    add_executable(test_nf4_shard ${CMAKE_CURRENT_LIST_DIR}/unit/test_nf4_shard.c)
    target_link_libraries(test_nf4_shard PRIVATE loom_engine)
    loom_warnings(test_nf4_shard)
    add_test(NAME unit.nf4.shard COMMAND test_nf4_shard)
    set_tests_properties(unit.nf4.shard PROPERTIES LABELS "unit;sanitize" TIMEOUT 300)
    add_executable(bench_nf4 ${CMAKE_CURRENT_LIST_DIR}/bench/bench_nf4.c)
    target_link_libraries(bench_nf4 PRIVATE loom_engine)
    loom_warnings(bench_nf4)
    add_test(NAME bench.nf4.smoke COMMAND bench_nf4 --n 100003 --threads 3 --reps 1)
    set_tests_properties(bench.nf4.smoke PROPERTIES LABELS "bench" TIMEOUT 120)
endif()
# The NF4 storage path (nf4_put: pipelined upload, bf16 pieces, serial quantizer) on the
# cpu backend; tests/gpu.cmake runs the same program on cuda (gpu.nf4_upload).
if(TARGET loom_engine)
    add_executable(test_nf4_upload_cpu ${CMAKE_CURRENT_LIST_DIR}/gpu/test_nf4_upload.c)
    target_link_libraries(test_nf4_upload_cpu PRIVATE loom_engine m)
    loom_warnings(test_nf4_upload_cpu)
    add_test(NAME unit.nf4.upload_cpu COMMAND test_nf4_upload_cpu cpu)
    set_tests_properties(unit.nf4.upload_cpu PROPERTIES LABELS "unit" TIMEOUT 300)
endif()
