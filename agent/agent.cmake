# prism-agent: the sidecar (agent.h). main.c options and start-up, socket.c the trainers' local
# socket, upstream.c the stream to prismd and the hint table, metrics.c /metrics.
add_executable(prism-agent main.c upstream.c socket.c metrics.c)
target_include_directories(prism-agent PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(prism-agent PRIVATE prism_daemon prism_hints prism_profile prism_proto PkgConfig::GRPC
  PkgConfig::MHD Threads::Threads)
target_compile_definitions(prism-agent PRIVATE PRISM_VERSION="${PROJECT_VERSION}")
