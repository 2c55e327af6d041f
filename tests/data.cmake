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
