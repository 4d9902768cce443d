# The sm_90 resources of every CUDA kernel of the build (resource_usage.py): the target
# cuda_resources compiles each .cu file of every target once more, as its target compiles it
# (flags from compile_commands.json) but for sm_90 alone, with ptxas -v, and prints one line per
# kernel; test_cuda_resources fails on any spill or a register count beyond a kernel's launch
# bounds. Included by the top-level CMakeLists.txt after every part is defined, in nvcc builds
# only, whatever CMAKE_CUDA_ARCHITECTURES holds.

# The targets defined in `dir` and its subdirectories.
function(prism_targets_below dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    prism_targets_below(${sub} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(prism_cuda_resource_usage)
  set(script ${PROJECT_SOURCE_DIR}/kernels/cuda/resource_usage.py)
  set(commands ${CMAKE_BINARY_DIR}/compile_commands.json)
  set(records)
  set(cuda_targets)
  prism_targets_below(${PROJECT_SOURCE_DIR} targets)
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY" OR type STREQUAL "UTILITY")
      continue()
    endif()
    get_target_property(sources ${target} SOURCES)
    get_target_property(source_dir ${target} SOURCE_DIR)
    foreach(src ${sources})
      if(NOT src MATCHES "\\.cu$" OR src MATCHES "^\\$<")
        continue()
      endif()
      get_filename_component(src ${src} ABSOLUTE BASE_DIR ${source_dir})
      file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
      set(json ${CMAKE_BINARY_DIR}/cuda_resources/${target}/${rel}.json)
      add_custom_command(OUTPUT ${json}
        COMMAND ${PRISM_PYTHON} ${script} compile --commands ${commands} --target ${target}
          --source ${src} --output ${json} --depfile ${json}.d --arch 90
          --root ${PROJECT_SOURCE_DIR}
        DEPENDS ${script} ${src} ${commands}
        DEPFILE ${json}.d
        COMMENT "ptxas -v for sm_90: ${rel} (${target})"
        VERBATIM)
      list(APPEND records ${json})
      list(APPEND cuda_targets ${target})
    endforeach()
  endforeach()
  # After the targets themselves, so that whatever they generate first (headers) is there.
  add_custom_target(cuda_resources ALL DEPENDS ${records})
  list(REMOVE_DUPLICATES cuda_targets)
  add_dependencies(cuda_resources ${cuda_targets})
  add_test(NAME test_cuda_resources COMMAND ${PRISM_PYTHON} ${script} check ${records})
  set_tests_properties(test_cuda_resources PROPERTIES TIMEOUT 60)
endfunction()
