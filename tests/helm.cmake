# The Helm chart helm/prism and the kustomize base deploy/k8s, checked without a cluster (issue
# 14 item 7): rendered by the test renderer tests/deploy/helm_render (Go's text/template with
# Sprig, built in GOPATH mode against Debian's golang-github-masterminds-sprig-dev and
# golang-gopkg-yaml.v3-dev), their objects checked with exact values and validated against the
# Kubernetes schemas (tests/deploy/validate_k8s.mjs, kubernetes-models from web/node_modules).
# scripts/install-deps.sh installs go, the Go packages and kubectl.
set(PRISM_GOPATH /usr/share/gocode CACHE PATH "GOPATH holding Sprig and yaml.v3 (Debian's golang-*-dev packages)")
find_program(PRISM_GO go)
find_program(PRISM_KUBECTL kubectl)
set(PRISM_HELM_RENDER ${CMAKE_BINARY_DIR}/tests/deploy/helm_render)

if(PRISM_GO AND EXISTS ${PRISM_GOPATH}/src/github.com/Masterminds/sprig AND EXISTS ${PRISM_GOPATH}/src/gopkg.in/yaml.v3)
  # The renderer's sources (its _test.go files are not part of the binary).
  file(GLOB prism_helm_render_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/deploy/helm_render/*.go)
  list(FILTER prism_helm_render_sources EXCLUDE REGEX "_test\\.go$")
  add_custom_command(
    OUTPUT ${PRISM_HELM_RENDER}
    COMMAND ${CMAKE_COMMAND} -E env GO111MODULE=off GOPATH=${PRISM_GOPATH} GOFLAGS=
      GOCACHE=${CMAKE_BINARY_DIR}/tests/deploy/gocache
      ${PRISM_GO} build -o ${PRISM_HELM_RENDER} ./tests/deploy/helm_render
    DEPENDS ${prism_helm_render_sources}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    COMMENT "go: building the Helm chart renderer tests/deploy/helm_render"
    VERBATIM)
  add_custom_target(prism_helm_render ALL DEPENDS ${PRISM_HELM_RENDER})
else()
  message(STATUS "prism: the Helm chart tests are not registered (no go, or no Sprig and yaml.v3 under "
    "${PRISM_GOPATH}: run scripts/install-deps.sh)")
  return()
endif()

# The renderer's own unit tests (values merge, --set, the schema subset, output order, toYaml).
add_test(NAME test_helm_render_unit
  COMMAND ${CMAKE_COMMAND} -E env GO111MODULE=off GOPATH=${PRISM_GOPATH} GOFLAGS=
    GOCACHE=${CMAKE_BINARY_DIR}/tests/deploy/gocache ${PRISM_GO} test ./tests/deploy/helm_render
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_helm_render_unit PROPERTIES TIMEOUT 300)

set(prism_helm_env
  "PRISM_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
  "PRISM_HELM_RENDER=${PRISM_HELM_RENDER}"
  "PRISM_PRISMD=$<TARGET_FILE:prismd>"
  "PRISM_AGENT=$<TARGET_FILE:prism-agent>")
set(prism_helm_test ${CMAKE_CURRENT_SOURCE_DIR}/deploy/test_helm_chart.py)

# Renders, exact facts, values refused, flags the binaries have.
foreach(case RenderDefault RenderFull PrismdDisabled ValuesRefused FlagsExist)
  string(REGEX REPLACE "([a-z])([A-Z])" "\\1_\\2" name "${case}")
  string(TOLOWER "test_helm_${name}" name)
  add_test(NAME ${name} COMMAND ${PRISM_PYTHON} ${prism_helm_test} ${case})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${prism_helm_env}"
    REQUIRED_FILES ${PRISM_HELM_RENDER} TIMEOUT 300)
endforeach()

# The chart's copies of deploy/'s dashboards and rules (helm/prism/files/) are current; skipped
# (77) while deploy/ has neither.
add_test(NAME test_helm_chart_files_synced COMMAND ${PROJECT_SOURCE_DIR}/scripts/sync-chart-files.sh --check)
set_tests_properties(test_helm_chart_files_synced PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)

# Schema validation needs node and web/node_modules' kubernetes-models; the kustomize base needs
# kubectl.
if(NOT PRISM_NODE OR NOT EXISTS ${PROJECT_SOURCE_DIR}/web/node_modules/kubernetes-models)
  message(STATUS "prism: test_helm_validate and test_kustomize_base are not registered (no node or no "
    "web/node_modules/kubernetes-models: run scripts/install-deps.sh)")
  return()
endif()
add_test(NAME test_helm_validate COMMAND ${PRISM_PYTHON} ${prism_helm_test} Validate)
set_tests_properties(test_helm_validate PROPERTIES
  ENVIRONMENT "${prism_helm_env};PRISM_NODE=${PRISM_NODE}" REQUIRED_FILES ${PRISM_HELM_RENDER} TIMEOUT 300)
if(PRISM_KUBECTL)
  add_test(NAME test_kustomize_base COMMAND ${PRISM_PYTHON} ${prism_helm_test} Kustomize)
  set_tests_properties(test_kustomize_base PROPERTIES
    ENVIRONMENT "${prism_helm_env};PRISM_NODE=${PRISM_NODE};PRISM_KUBECTL=${PRISM_KUBECTL}"
    REQUIRED_FILES ${PRISM_HELM_RENDER} TIMEOUT 300)
else()
  message(STATUS "prism: test_kustomize_base is not registered (no kubectl: run scripts/install-deps.sh)")
endif()
# A second kubectl, e.g. Debian 12's kubernetes-client 1.20 (kustomize v2.0.3) where kubectl is
# newer: -DPRISM_KUBECTL_COMPAT=/path/to/kubectl.
set(PRISM_KUBECTL_COMPAT "" CACHE FILEPATH "a second kubectl whose kustomize must also render deploy/k8s")
if(PRISM_KUBECTL_COMPAT)
  add_test(NAME test_kustomize_base_compat COMMAND ${PRISM_PYTHON} ${prism_helm_test} Kustomize)
  set_tests_properties(test_kustomize_base_compat PROPERTIES
    ENVIRONMENT "${prism_helm_env};PRISM_NODE=${PRISM_NODE};PRISM_KUBECTL=${PRISM_KUBECTL_COMPAT}"
    REQUIRED_FILES ${PRISM_HELM_RENDER} TIMEOUT 300)
endif()
