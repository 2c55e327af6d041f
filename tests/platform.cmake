# Tests of the platform API: the event stream, webhooks and artifacts
# (daemon/events.h, daemon/webhooks.h, daemon/artifacts.h).
if(TARGET loom_daemon)
    add_executable(test_platform_api ${CMAKE_CURRENT_LIST_DIR}/unit/test_platform_api.c)
    target_link_libraries(test_platform_api PRIVATE loom_daemon)
    loom_warnings(test_platform_api)
    # The signature reference is the openssl command line (an independent HMAC).
    find_program(LOOM_OPENSSL_BIN openssl)
    if(NOT LOOM_OPENSSL_BIN)
        set(LOOM_OPENSSL_BIN openssl) # tools/setup.sh installs it; the test fails without
    endif()
    add_test(NAME unit.platform_api COMMAND test_platform_api ${LOOM_OPENSSL_BIN})
    set_tests_properties(unit.platform_api PROPERTIES LABELS "unit;sanitize" TIMEOUT 60)
endif()
# Integration: loomd + loom-agents + fake_worker on loopback, one ctest per scenario.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loomctl)
    foreach(sc events sse sse_fanout sse_fanout_pool agent_foreign metrics_auth metrics_private artifact_ttl artifact_ttl_node webhooks webhook_private webhook_connect_check webhook_crash webhook_slow webhook_stop webhook_timeout artifacts event_ring cli_wait artifacts_node)
        add_test(NAME integration.platform.${sc}
                 COMMAND ${Python3_EXECUTABLE}
                         ${CMAKE_CURRENT_LIST_DIR}/integration/test_platform_api.py
                         ${CMAKE_BINARY_DIR}/bin ${sc})
        set_tests_properties(integration.platform.${sc} PROPERTIES LABELS "integration;sanitize"
                             SKIP_RETURN_CODE 77 TIMEOUT 180)
    endforeach()
endif()
# Benchmark (not a test): build/bin/bench_events build/bin/loomd [--subscribers N] [--jobs J]
# [--rate R]; results in docs/perf.md.
if(TARGET loomd)
    add_executable(bench_events ${CMAKE_CURRENT_LIST_DIR}/bench/bench_events.c)
    target_link_libraries(bench_events PRIVATE loom_daemon_harness Threads::Threads)
    loom_warnings(bench_events)
    # Webhook delivery throughput (docs/perf.md); the ctest runs it tiny, once with a slow
    # receiver: it fails unless every (event, webhook) pair arrives signed.
    add_executable(bench_webhooks ${CMAKE_CURRENT_LIST_DIR}/bench/bench_webhooks.c)
    target_link_libraries(bench_webhooks PRIVATE loom_daemon_harness PkgConfig::CRYPTO
                          Threads::Threads)
    loom_warnings(bench_webhooks)
    add_test(NAME bench.webhooks_smoke
             COMMAND bench_webhooks $<TARGET_FILE:loomd> --receivers 3 --webhooks 4 --jobs 20
                     --rate 50 --slow 1 --slow-ms 300 --timeout-s 60)
    set_tests_properties(bench.webhooks_smoke PROPERTIES LABELS bench TIMEOUT 120)
endif()
# The API contract: api/openapi.yaml against the route table and the handlers' error statuses,
# and against third-party tools (Debian's JSON::Validator lints it; OpenAPI::Client, generated
# from it, drives a real loomd).
if(Python3_FOUND)
    add_test(NAME unit.openapi_errors
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/check_openapi_errors.py
                     ${CMAKE_SOURCE_DIR})
    set_tests_properties(unit.openapi_errors PROPERTIES LABELS unit SKIP_RETURN_CODE 77)
endif()
find_program(LOOM_PERL_BIN perl)
if(LOOM_PERL_BIN AND TARGET loomd)
    add_test(NAME integration.openapi_client
             COMMAND ${LOOM_PERL_BIN} ${CMAKE_CURRENT_LIST_DIR}/integration/test_openapi_client.pl
                     ${CMAKE_BINARY_DIR}/bin ${CMAKE_SOURCE_DIR}/api/openapi.yaml)
    set_tests_properties(integration.openapi_client PROPERTIES LABELS integration
                         SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
