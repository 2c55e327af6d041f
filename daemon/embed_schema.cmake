# Embeds schema/NNN_name.sql migrations into loomd at build time as a sorted
# C table (schema_migrations[] in schema_embedded.c), so the binary carries
# its schema and applies it in order at start-up (see daemon/store.c).
file(GLOB LOOM_SCHEMA_FILES ${CMAKE_SOURCE_DIR}/schema/[0-9][0-9][0-9]_*.sql)
list(SORT LOOM_SCHEMA_FILES)
set(LOOM_SCHEMA_C ${CMAKE_CURRENT_BINARY_DIR}/schema_embedded.c)
add_custom_command(
    OUTPUT ${LOOM_SCHEMA_C}
    COMMAND ${CMAKE_COMMAND} -DOUT=${LOOM_SCHEMA_C} -DSCHEMA_DIR=${CMAKE_SOURCE_DIR}/schema
            -P ${CMAKE_CURRENT_SOURCE_DIR}/embed_schema_gen.cmake
    DEPENDS ${LOOM_SCHEMA_FILES} ${CMAKE_CURRENT_SOURCE_DIR}/embed_schema_gen.cmake
    COMMENT "Embedding schema migrations")
# Re-glob when a migration is added: CONFIGURE_DEPENDS on the folder listing.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/schema)
set(LOOM_DAEMON_GENERATED ${LOOM_SCHEMA_C})
