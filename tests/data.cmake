# Tests of the data area: worker/data, worker/checkpoint, worker/safetensors and the
# loom-data tool. The unit tests compile the modules they test directly (not the whole
# loom_engine) so they do not depend on the rest of the engine.
set(LOOM_DATA_SRC ${CMAKE_SOURCE_DIR}/worker/data.c)
set(LOOM_CKPT_SRC ${CMAKE_SOURCE_DIR}/worker/checkpoint.c ${CMAKE_SOURCE_DIR}/worker/safetensors.c)

add_executable(test_data ${CMAKE_CURRENT_LIST_DIR}/unit/test_data.c ${LOOM_DATA_SRC})
target_link_libraries(test_data PRIVATE loom_common PkgConfig::JANSSON)
loom_warnings(test_data)
add_test(NAME unit.data COMMAND test_data)
set_tests_properties(unit.data PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)

add_executable(test_checkpoint ${CMAKE_CURRENT_LIST_DIR}/unit/test_checkpoint.c ${LOOM_CKPT_SRC})
target_link_libraries(test_checkpoint PRIVATE loom_common PkgConfig::JANSSON PkgConfig::CRYPTO
                      Threads::Threads)
loom_warnings(test_checkpoint)
add_test(NAME unit.checkpoint COMMAND test_checkpoint)
set_tests_properties(unit.checkpoint PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)

add_executable(test_safetensors ${CMAKE_CURRENT_LIST_DIR}/unit/test_safetensors.c
               ${CMAKE_SOURCE_DIR}/worker/safetensors.c ${CMAKE_SOURCE_DIR}/api/model.c)
target_link_libraries(test_safetensors PRIVATE loom_common PkgConfig::JANSSON PkgConfig::CRYPTO m)
loom_warnings(test_safetensors)
add_test(NAME unit.safetensors COMMAND test_safetensors)
set_tests_properties(unit.safetensors PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
# The export read back by python3's json + struct (skipped, not passed, without python3).
add_test(NAME unit.safetensors_python
         COMMAND sh -c "command -v python3 >/dev/null || { echo 'SKIP: python3 not found'; exit 77; }; exec python3 \"$1\" \"$2\""
                 sh ${CMAKE_CURRENT_LIST_DIR}/unit/check_safetensors.py $<TARGET_FILE:test_safetensors>)
set_tests_properties(unit.safetensors_python PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 60)

add_test(NAME unit.data_prepare
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/data_prepare_test.sh $<TARGET_FILE:loom-data>)
set_tests_properties(unit.data_prepare PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)

# Benchmark (not a test): build-*/bin/bench_data [DIR]; numbers in docs/perf.md.
add_executable(bench_data ${CMAKE_CURRENT_LIST_DIR}/bench/bench_data.c ${LOOM_DATA_SRC}
               ${LOOM_CKPT_SRC})
target_link_libraries(bench_data PRIVATE loom_common PkgConfig::JANSSON PkgConfig::CRYPTO)
loom_warnings(bench_data)

# Mutation fuzzing of the safetensors and .bin parsers (deterministic, ~1 s).
add_executable(fuzz_data ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_data.c ${LOOM_DATA_SRC}
               ${CMAKE_SOURCE_DIR}/worker/safetensors.c)
target_link_libraries(fuzz_data PRIVATE loom_common PkgConfig::JANSSON PkgConfig::CRYPTO)
loom_warnings(fuzz_data)
add_test(NAME unit.fuzz_data COMMAND fuzz_data 2000)
set_tests_properties(unit.fuzz_data PROPERTIES LABELS "unit;sanitize" TIMEOUT 120)
