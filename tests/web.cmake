# The dashboard's unit tests (web/test/*.test.ts): what is drawn, computed in plain functions
# (scales, colours, the hover lookup, telemetry series, URLs), compiled with esbuild and run by
# node --test. Only where web/CMakeLists.txt defined prism_web (Node.js and web/node_modules).
if(TARGET prism_web)
  add_test(NAME test_web_unit
    COMMAND ${PRISM_NODE} ${PROJECT_SOURCE_DIR}/web/test/run.mjs --out ${CMAKE_BINARY_DIR}/web/test)
  set_tests_properties(test_web_unit PROPERTIES TIMEOUT 120)
endif()
