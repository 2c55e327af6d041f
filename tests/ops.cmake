# Tests of the operations area (owner: ops): the embedded web view (daemon/ui),
# its headless-Chromium test, deploy/ (Grafana dashboard vs. loomd's metrics,
# example configs vs. --help).
if(TARGET loom_daemon)
    add_executable(test_ui ${CMAKE_CURRENT_LIST_DIR}/unit/test_ui.c)
    target_link_libraries(test_ui PRIVATE loom_daemon)
    loom_warnings(test_ui)
    add_test(NAME unit.ui_embed COMMAND test_ui ${CMAKE_SOURCE_DIR}/daemon/ui)
    set_tests_properties(unit.ui_embed PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)
endif()

# The web view in headless Chromium (label ui, not unit: it needs Debian's
# chromium and `npm ci` in tests/ui; it installs nothing and exits 77 =
# skipped when either is missing). LOOM_UI_SCREENSHOTS=docs refreshes the
# screenshots under docs/.
if(TARGET loomd AND TARGET loom-agent AND TARGET loom-worker)
    find_program(LOOM_NODE node)
    if(LOOM_NODE)
        add_test(NAME ui.web_view COMMAND ${LOOM_NODE} ${CMAKE_CURRENT_LIST_DIR}/ui/ui_test.mjs
                                          ${CMAKE_BINARY_DIR}/bin)
    else()
        add_test(NAME ui.web_view COMMAND sh -c "echo 'SKIP: node (nodejs) not found'; exit 77")
    endif()
    set_tests_properties(ui.web_view PROPERTIES LABELS "ui" SKIP_RETURN_CODE 77 TIMEOUT 150)
endif()

# deploy/: the Grafana dashboard queries only metrics and labels loomd exports
# (real loomd + agent + fake_worker, a few seconds); the example configs are
# what gen_conf_examples.sh makes from --help and both binaries accept them;
# the systemd units verify and stay hardened.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET fake_worker)
    add_test(NAME unit.ops_dashboard_metrics
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/ops_dashboard_metrics.py
                     ${CMAKE_BINARY_DIR}/bin ${CMAKE_SOURCE_DIR})
    set_tests_properties(unit.ops_dashboard_metrics PROPERTIES LABELS "unit" TIMEOUT 60
                         SKIP_RETURN_CODE 77)
endif()
if(TARGET loomd AND TARGET loom-agent)
    add_test(NAME unit.ops_conf_examples
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/ops_conf_examples.sh
                     ${CMAKE_BINARY_DIR}/bin ${CMAKE_SOURCE_DIR})
    set_tests_properties(unit.ops_conf_examples PROPERTIES LABELS "unit" TIMEOUT 60)
    add_test(NAME unit.ops_systemd_units
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/ops_systemd_units.sh
                     ${CMAKE_BINARY_DIR}/bin ${CMAKE_SOURCE_DIR})
    set_tests_properties(unit.ops_systemd_units PROPERTIES LABELS "unit" TIMEOUT 60
                         SKIP_RETURN_CODE 77)
endif()
if(TARGET loomd)
    add_test(NAME integration.ops_backup
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/integration/ops_backup.sh ${CMAKE_BINARY_DIR}/bin
                     ${CMAKE_SOURCE_DIR})
    set_tests_properties(integration.ops_backup PROPERTIES LABELS "integration" TIMEOUT 90
                         SKIP_RETURN_CODE 77)
endif()

# Node checks: the expectation table (unit) and the whole path (loomd + two
# agents with cpu devices + loom-nodecheck over Gloo, loomctl node check).
if(TARGET loom_daemon)
    add_executable(test_nodecheck ${CMAKE_CURRENT_LIST_DIR}/unit/test_nodecheck.c)
    target_link_libraries(test_nodecheck PRIVATE loom_daemon)
    loom_warnings(test_nodecheck)
    add_test(NAME unit.nodecheck_expected COMMAND test_nodecheck)
    set_tests_properties(unit.nodecheck_expected PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)
endif()
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loomctl
   AND TARGET loom-nodecheck AND TARGET fake_worker)
    add_test(NAME integration.ops_nodecheck
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/ops_nodecheck.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.ops_nodecheck PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()

# Data staging: the cache (unit) and loom-stage in front of the real worker
# under a real agent, with the staging event in the job's history.
if(TARGET loom_agent_lib)
    add_executable(test_stage ${CMAKE_CURRENT_LIST_DIR}/unit/test_stage.c)
    target_link_libraries(test_stage PRIVATE loom_agent_lib PkgConfig::CRYPTO)
    loom_warnings(test_stage)
    add_test(NAME unit.stage COMMAND test_stage)
    set_tests_properties(unit.stage PROPERTIES LABELS "unit;sanitize" TIMEOUT 30)
endif()
if(Python3_FOUND AND TARGET loomd AND TARGET loom-agent AND TARGET loom-worker
   AND TARGET loom-stage)
    add_test(NAME integration.ops_staging
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/ops_staging.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.ops_staging PROPERTIES LABELS "integration" TIMEOUT 120
                         SKIP_RETURN_CODE 77)
endif()

# deploy/quickstart.sh with the built binaries and a tiny model (token files, stop, refusal to
# wipe a running cluster's directory) and loomctl's output against the cluster it keeps.
if(Python3_EXECUTABLE AND TARGET loomd AND TARGET loom-agent AND TARGET loom-worker
   AND TARGET loomctl AND TARGET loom-data)
    add_test(NAME integration.quickstart
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_quickstart.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.quickstart PROPERTIES LABELS integration TIMEOUT 120
                         SKIP_RETURN_CODE 77)
endif()

# Submit-time checks against what loomd sees (data files, meta.json vocabulary, tenant quota).
if(Python3_EXECUTABLE AND TARGET loomd)
    add_test(NAME integration.submit_checks
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/integration/test_submit_checks.py
                     ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(integration.submit_checks PROPERTIES LABELS "integration;sanitize"
                         TIMEOUT 60)
endif()
