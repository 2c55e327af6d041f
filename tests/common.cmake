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

# common/ modules: buffer, files, clocks, tokens (one test program each).
foreach(mod buf fsutil clock token)
    add_executable(test_common_${mod} ${CMAKE_CURRENT_LIST_DIR}/unit/test_common_${mod}.c)
    target_link_libraries(test_common_${mod} PRIVATE loom_common)
    loom_warnings(test_common_${mod})
    add_test(NAME unit.common_${mod} COMMAND test_common_${mod})
    set_tests_properties(unit.common_${mod} PROPERTIES LABELS "unit;sanitize")
endforeach()
