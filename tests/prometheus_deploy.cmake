# The Grafana dashboards and Prometheus rules of deploy/ checked against a real Prometheus
# (issue 14 item 4): Debian's prometheus scraping this build's prismd, two prism-agents and two
# trainers (examples/train_demo.py, torch and gloo), every panel, variable and rule expression run
# through its HTTP API. The trainers load libprism through the Python binding, hence
# PRISM_AGENT_TEST_ENV (agent.cmake). Half a minute to minutes of wall time with torch, so only in
# the plain build, like test_agents. PRISM_DEPLOY_DIR=DIR in the environment checks DIR's
# grafana/*.json and prometheus/*.yml instead of the source tree's deploy/.
if(PRISM_PYTHON_TESTS AND NOT PRISM_SANITIZE AND NOT PRISM_TSAN)
  add_test(NAME test_prometheus_deploy
    COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_prometheus_deploy.py)
  set_tests_properties(test_prometheus_deploy PROPERTIES ENVIRONMENT "${PRISM_AGENT_TEST_ENV}" TIMEOUT 1200
    REQUIRED_FILES "$<TARGET_FILE:prism>;$<TARGET_FILE:prism-agent>;$<TARGET_FILE:prismd>")
endif()
