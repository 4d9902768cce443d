# Issue 14 items 2 and 3: the Prometheus rules in deploy/prometheus/ and the Grafana dashboards
# in deploy/grafana/. Configuration, not code: these tests need no build target.
# - deploy_rules_check: `promtool check rules` on the rule file (syntax, PromQL, templates).
# - deploy_rules_test: `promtool test rules` on deploy/prometheus/tests/*.yml (every alert
#   firing and not firing, every recording rule's value).
# - deploy_dashboards_lint: tests/deploy/lint_dashboards.py on the three dashboards and the rule
#   file (schema, datasource variable, ids, gridPos, $__rate_interval, and every metric name
#   one that service/prismd/rest.c or agent/metrics.c exports, or a recording rule; every
#   expression parses).
# - deploy_dashboards_lint_selftest: the lint catches each of those mistakes.
# All four need promtool; the lint also parses every dashboard expression with it.
# promtool comes with Debian's prometheus package, python3-yaml with Debian's python3-yaml
# (scripts/install-deps.sh).
set(PRISM_DEPLOY_DIR ${CMAKE_SOURCE_DIR}/deploy)
file(GLOB PRISM_RULE_TESTS CONFIGURE_DEPENDS ${PRISM_DEPLOY_DIR}/prometheus/tests/*.yml)
file(GLOB PRISM_DASHBOARDS CONFIGURE_DEPENDS ${PRISM_DEPLOY_DIR}/grafana/*.json)
find_program(PRISM_PROMTOOL promtool)
if(PRISM_PROMTOOL)
  add_test(NAME deploy_rules_check
    COMMAND ${PRISM_PROMTOOL} check rules ${PRISM_DEPLOY_DIR}/prometheus/prism-rules.yml)
  add_test(NAME deploy_rules_test COMMAND ${PRISM_PROMTOOL} test rules ${PRISM_RULE_TESTS})
  set_tests_properties(deploy_rules_check deploy_rules_test PROPERTIES TIMEOUT 120)
  add_test(NAME deploy_dashboards_lint
    COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy/lint_dashboards.py --source-dir ${CMAKE_SOURCE_DIR}
            --promtool ${PRISM_PROMTOOL} --rules ${PRISM_DEPLOY_DIR}/prometheus/prism-rules.yml ${PRISM_DASHBOARDS})
  add_test(NAME deploy_dashboards_lint_selftest
    COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_lint_dashboards.py)
  set_tests_properties(deploy_dashboards_lint deploy_dashboards_lint_selftest PROPERTIES
    ENVIRONMENT "PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR};PRISM_PROMTOOL=${PRISM_PROMTOOL}" TIMEOUT 120)
else()
  message(STATUS "prism: the deploy_rules_* and deploy_dashboards_* tests are not registered (no promtool: "
                 "Debian's prometheus package, scripts/install-deps.sh)")
endif()
