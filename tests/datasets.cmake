# Datasets beyond .bin shards: `loom-data prepare --tokenizer` (text, jsonl, chat, completion
# to .bin + .mask shards) against @huggingface/tokenizers on golden examples, its error
# cases and counts (tests/datasets/prepare_test.py; node and the npm packages of tests/tok,
# installed by tools/setup.sh; missing ones fail the test); and the masked loss of the worker
# on cpu against a torch reference cross-entropy over the unmasked targets
# (tests/datasets/test_masked_loss.py; python3 with numpy and torch, else skipped).
add_test(NAME integration.datasets.prepare
         COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/datasets/prepare_test.py
                 $<TARGET_FILE:loom-data>)
set_tests_properties(integration.datasets.prepare PROPERTIES LABELS integration TIMEOUT 300)
if(TARGET loom-worker)
    add_test(NAME integration.datasets.masked_loss
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/datasets/test_masked_loss.py
                     $<TARGET_FILE:loom-worker>)
    set_tests_properties(integration.datasets.masked_loss PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 300)
    # The step's loss and gradient are the mean over its counted targets (two micro-batches
    # of 1 and 14 counted targets): loss and grad_norm against a float64 torch autograd
    # reference (tests/datasets/test_loss_norm.py).
    add_test(NAME integration.datasets.loss_norm
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/datasets/test_loss_norm.py
                     $<TARGET_FILE:loom-worker>)
    set_tests_properties(integration.datasets.loss_norm PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 300)
    # train.packing "document" on cpu: three documents in one window equal each document run
    # on its own (Llama with RoPE, GPT-2 with learned positions) against float64 torch
    # autograd (tests/datasets/test_packing.py).
    add_test(NAME integration.datasets.packing
             COMMAND sh -c "for p in /usr/bin/python3 python3; do if \"$p\" -c 'import numpy, torch' 2>/dev/null; then exec \"$p\" \"$0\" \"$1\"; fi; done; echo 'SKIP: no python3 with numpy and torch'; exit 77"
                     ${CMAKE_CURRENT_LIST_DIR}/datasets/test_packing.py
                     $<TARGET_FILE:loom-worker>)
    set_tests_properties(integration.datasets.packing PROPERTIES LABELS "integration;sanitize"
                         SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()

# Tokenizing inside a job: loom-stage (the agent's staging step) tokenizes jsonl, completion
# and webdataset data (tars made by Python's tarfile) into the node cache before the worker
# starts; ids against a byte-level tokenizer written by the test, the cache reused by a second
# job, 1 and 2 threads equal, bad records fail the job (tests/datasets/stage_tokenize_test.py).
if(TARGET loom-stage)
    add_test(NAME integration.datasets.stage_tokenize
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/datasets/stage_tokenize_test.py
                     $<TARGET_FILE:loom-stage>)
    set_tests_properties(integration.datasets.stage_tokenize PROPERTIES
                         LABELS "integration;sanitize" TIMEOUT 120)
    # the token cache's cap: least recently used entries evicted, never one a running job
    # holds (tests/datasets/stage_cache_evict_test.py)
    add_test(NAME integration.datasets.stage_cache_evict
             COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/datasets/stage_cache_evict_test.py
                     $<TARGET_FILE:loom-stage>)
    set_tests_properties(integration.datasets.stage_cache_evict PROPERTIES
                         LABELS "integration;sanitize" TIMEOUT 120)
endif()
