# Tests of the tokenizers (data/tok*): the C unit test on small hand-made files, and the
# comparisons with real third-party tokenizers on >= 1 MB corpora (tests/tok/tok_test.sh):
# GPT-2 against npm gpt-3-encoder and @huggingface/tokenizers, Llama 3 against
# llama3-tokenizer-js and @huggingface/tokenizers, a tiktoken-style file from cl100k ranks
# against js-tiktoken, Qwen2-style and SentencePiece-converted
# layouts against @huggingface/tokenizers, SentencePiece against Debian's
# spm_encode/spm_decode and python3-sentencepiece. A missing reference (tools/setup.sh
# installs them) makes the test fail with a message, never pass.
add_executable(test_tok ${CMAKE_CURRENT_LIST_DIR}/unit/test_tok.c)
target_link_libraries(test_tok PRIVATE loom_tok Threads::Threads)
loom_warnings(test_tok)
add_test(NAME unit.tok COMMAND test_tok)
set_tests_properties(unit.tok PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)

foreach(ref gpt2 llama3 cl100k variants chat)
    add_test(NAME integration.tok_${ref}
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/tok/tok_test.sh ${ref} $<TARGET_FILE:loom-data>)
    set_tests_properties(integration.tok_${ref} PROPERTIES LABELS integration TIMEOUT 300)
endforeach()
add_test(NAME unit.tok_spm
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/tok/tok_test.sh spm $<TARGET_FILE:loom-data>)
set_tests_properties(unit.tok_spm PROPERTIES LABELS "unit;sanitize" TIMEOUT 180)

# Benchmark (not a test): tests/bench/bench_tok.sh build runs bench_tok beside the JS
# tokenizers; numbers in docs/perf.md.
add_executable(bench_tok ${CMAKE_CURRENT_LIST_DIR}/bench/bench_tok.c)
target_link_libraries(bench_tok PRIVATE loom_tok Threads::Threads)
loom_warnings(bench_tok)
