# Embeds the web view's static files (daemon/ui/*) into loomd at build time as
# a C table (ui_files[] in ui_embedded.c, see daemon/ui.h), so the binary
# serves /ui without files on disk or any external CDN.
#
# Included from daemon/CMakeLists.txt after embed_schema.cmake (it appends to
# LOOM_DAEMON_GENERATED). The same file runs in script mode (cmake -P) as the
# generator: OUT is the C file to write, UI_DIR the folder to embed.
if(CMAKE_SCRIPT_MODE_FILE)
    file(GLOB files RELATIVE ${UI_DIR} ${UI_DIR}/*)
    list(SORT files)
    set(body "/* Generated from the files in daemon/ui by daemon/embed_ui.cmake. Do not edit. */\n")
    string(APPEND body "#include \"daemon/ui.h\"\n\nconst struct ui_file ui_files[] = {\n")
    set(count 0)
    foreach(name ${files})
        if(IS_DIRECTORY ${UI_DIR}/${name} OR name MATCHES "^\\.")
            continue()
        endif()
        if(NOT name MATCHES "^[A-Za-z0-9_.-]+$")
            message(FATAL_ERROR "daemon/ui/${name}: file names must be [A-Za-z0-9_.-]")
        endif()
        file(READ ${UI_DIR}/${name} content HEX)
        string(LENGTH "${content}" hexlen)
        math(EXPR len "${hexlen} / 2")
        string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${content}")
        string(APPEND body "    {\"${name}\", (const unsigned char[]){${bytes}0x00}, ${len}},\n")
        math(EXPR count "${count}+1")
    endforeach()
    string(APPEND body "};\nconst int ui_files_count = ${count};\n")
    file(WRITE ${OUT}.tmp "${body}")
    execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
    return()
endif()

file(GLOB LOOM_UI_FILES ${CMAKE_CURRENT_SOURCE_DIR}/ui/*)
set(LOOM_UI_C ${CMAKE_CURRENT_BINARY_DIR}/ui_embedded.c)
add_custom_command(
    OUTPUT ${LOOM_UI_C}
    COMMAND ${CMAKE_COMMAND} -DOUT=${LOOM_UI_C} -DUI_DIR=${CMAKE_CURRENT_SOURCE_DIR}/ui
            -P ${CMAKE_CURRENT_SOURCE_DIR}/embed_ui.cmake
    DEPENDS ${LOOM_UI_FILES} ${CMAKE_CURRENT_SOURCE_DIR}/embed_ui.cmake
    COMMENT "Embedding the web view (daemon/ui)")
# Re-glob when a file is added to daemon/ui.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ui)
list(APPEND LOOM_DAEMON_GENERATED ${LOOM_UI_C})
