# Where users see the numerics state of issue 17 (DESIGN 4.7): prismd's store keeps it, REST,
# /metrics, prismctl blocks and the dashboard show it.
#   test_store_numerics   W, holds, counters, candidates and saturation figures saved and restored
#                         exactly; a row written before issue 17 still loads; damaged blobs refused
prism_test(test_store_numerics SOURCES unit/test_store_numerics.c LIBS prism_store)
#   test_numerics_surfaces  a real prismd: REST, /metrics and prismctl blocks show formats, reasons,
#                           holds, figures and the spike counters; a spike after a restart rolls
#                           back with W from the store
add_test(NAME test_numerics_surfaces COMMAND ${PRISM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_numerics_surfaces.py)
set_tests_properties(test_numerics_surfaces PROPERTIES
  ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR};PRISM_SOURCE_DIR=${CMAKE_SOURCE_DIR}" TIMEOUT 300)
#   test_browser_numerics   the dashboard in Chromium (as tests/browser.cmake): the numerics table,
#                           the block view; screenshots in ${CMAKE_BINARY_DIR}/browser-screenshots/
if(TARGET prism_web AND NOT PRISM_SANITIZE AND NOT PRISM_TSAN)
  find_program(PRISM_NUMERICS_NODE NAMES node nodejs)
  add_test(NAME test_browser_numerics
    COMMAND ${PRISM_NUMERICS_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/browser/numerics.test.mjs)
  set_tests_properties(test_browser_numerics PROPERTIES
    ENVIRONMENT "PRISM_BUILD_DIR=${CMAKE_BINARY_DIR}" TIMEOUT 600 REQUIRED_FILES "$<TARGET_FILE:prismd>")
endif()
