# Tests of common/ and repository-wide checks.
add_executable(test_config ${CMAKE_CURRENT_LIST_DIR}/unit/test_config.c)
target_link_libraries(test_config PRIVATE loom_common)
loom_warnings(test_config)
add_test(NAME unit.config COMMAND test_config)
set_tests_properties(unit.config PROPERTIES LABELS unit)

find_program(CLANG_FORMAT NAMES clang-format clang-format-14)
if(CLANG_FORMAT)
    add_test(NAME lint.clang_format
             COMMAND ${CMAKE_SOURCE_DIR}/tests/check_format.sh ${CLANG_FORMAT}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(lint.clang_format PROPERTIES LABELS "unit;lint")
endif()
