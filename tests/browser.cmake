# The dashboard in a real browser (issue 13 item 3): Debian's Chromium (/usr/bin/chromium, or
# $PRISM_CHROMIUM) driven by playwright-core from web/node_modules, against the real prismd of
# this build fed by real gRPC agents (tests/browser/feed.py). Only where the dashboard is built
# (target prism_web: Node.js and web/node_modules found) and without sanitizers (Chromium and
# Node are not instrumented, and a sanitizer build's prismd adds nothing the other builds do not test).
# Screenshots of every view: ${CMAKE_BINARY_DIR}/browser-screenshots/.
if(TARGET prism_web AND NOT PRISM_SANITIZE AND NOT PRISM_TSAN)
  find_program(PRISM_BROWSER_NODE NAMES node nodejs)
  add_test(NAME test_browser_dashboard
    COMMAND ${PRISM_BROWSER_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/browser/dashboard.test.mjs)
  set_tests_properties(test_browser_dashboard PROPERTIES
    ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 1800
    REQUIRED_FILES "$<TARGET_FILE:prismd>")
else()
  message(STATUS "prism: test_browser_dashboard is not registered (no dashboard build, or a sanitizer build)")
endif()
