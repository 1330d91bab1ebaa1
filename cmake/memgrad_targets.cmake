# mg_bazel_target(): one Bazel target (cmake/bazel_targets.cmake) as a CMake target, compiled
# with the flags Bazel gives it. A library becomes an OBJECT library mg.<package>.<name> (an
# INTERFACE one without sources); a test or binary an executable linking the objects of every
# library it depends on, directly or not, as Bazel links a binary statically
# (--dynamic_mode=off). mg_public_library() gathers libraries into the installed shared ones.

# Bazel's opt build (the C++ toolchain's flags plus .bazelrc's): the same flags here, for
# memgrad's own C++ files only (consumers keep theirs), in Release and where no build type is set
# (a project that embeds memgrad without one still gets an optimized engine).
set(MEMGRAD_CXX_FLAGS
  -U_FORTIFY_SOURCE -fstack-protector -Wall -Wunused-but-set-parameter -Wno-free-nonheap-object
  -fno-omit-frame-pointer -Wno-sign-compare)
set(MEMGRAD_CXX_RELEASE_FLAGS -g0 -O2 -D_FORTIFY_SOURCE=1 -DNDEBUG -ffunction-sections -fdata-sections)
# tools/cuda/cuda.bzl: nvcc -std=c++20 -Xcompiler -fPIC --expt-relaxed-constexpr, -O3 -DNDEBUG
# in opt (CMake's Release CUDA flags); the version define only keys Bazel's action cache.
set(MEMGRAD_CUDA_FLAGS --expt-relaxed-constexpr)
if(MEMGRAD_WITH_CUDA)
  list(APPEND MEMGRAD_CUDA_FLAGS -DBZL_NVCC_VERSION=${CMAKE_CUDA_COMPILER_VERSION})
endif()

function(mg_target_name out label)
  if(label MATCHES "^@([^/]+)//:(.+)$")
    set(${out} "mg_ext.${CMAKE_MATCH_1}.${CMAKE_MATCH_2}" PARENT_SCOPE)
  else()
    string(REGEX REPLACE "^//:?" "" name "${label}")
    string(REGEX REPLACE "[/:]" "." name "${name}")
    set(${out} "mg.${name}" PARENT_SCOPE)
  endif()
endfunction()

function(mg_compile_flags target)
  set_target_properties(${target} PROPERTIES
    CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
    CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
    POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${MEMGRAD_CXX_FLAGS}>"
    "$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<OR:$<CONFIG:Release>,$<STREQUAL:$<CONFIG>,>>>:${MEMGRAD_CXX_RELEASE_FLAGS}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:${MEMGRAD_CUDA_FLAGS}>"
    "$<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<STREQUAL:$<CONFIG>,>>:-O3;-DNDEBUG>")
endfunction()

# mg_bazel_target(library|test|binary LABEL [ALWAYSLINK] [CUDA_ONLY] [TESTONLY] [CORE_ONLY] [GPU]
#                 [SIZE s] [[CUDA_|NOCUDA_]SRCS|HDRS|DEPS|COPTS|LINKOPTS ...])
# CORE_ONLY (a test without the device runtime) is already in its DEPS; ALWAYSLINK needs nothing
# here, as every object of a library is linked.
function(mg_bazel_target kind label)
  set(lists "")
  foreach(l SRCS HDRS DEPS COPTS LINKOPTS)
    list(APPEND lists ${l} CUDA_${l} NOCUDA_${l})
  endforeach()
  cmake_parse_arguments(PARSE_ARGV 2 A "ALWAYSLINK;CUDA_ONLY;TESTONLY;CORE_ONLY;GPU" "SIZE" "${lists}")
  if(A_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "mg_bazel_target(${label}): unknown arguments ${A_UNPARSED_ARGUMENTS}")
  endif()
  mg_target_name(name "${label}")
  set(why "")
  if(A_CUDA_ONLY AND NOT MEMGRAD_WITH_CUDA)
    set(why "CUDA only")
  endif()
  if(A_TESTONLY AND NOT MEMGRAD_BUILD_TESTS)
    set(why "test only")
  endif()
  if(kind STREQUAL "test" AND NOT MEMGRAD_BUILD_TESTS)
    set(why "a test")
  endif()
  if(kind STREQUAL "binary" AND NOT MEMGRAD_BUILD_EXAMPLES)
    set(why "a binary")
  endif()
  set(cond NOCUDA_)
  if(MEMGRAD_WITH_CUDA)
    set(cond CUDA_)
  endif()
  foreach(l SRCS HDRS DEPS COPTS LINKOPTS)
    list(APPEND A_${l} ${A_${cond}${l}})
  endforeach()
  set(deps "")
  foreach(d IN LISTS A_DEPS)
    mg_target_name(t "${d}")
    if(NOT TARGET ${t} AND why STREQUAL "")
      set(why "needs ${d}")
    endif()
    list(APPEND deps ${t})
  endforeach()
  if(NOT why STREQUAL "")
    set_property(GLOBAL APPEND PROPERTY MEMGRAD_LEFT_OUT "${label} (${why})")
    return()
  endif()

  set(files "")
  set(compiled "")
  foreach(f IN LISTS A_SRCS A_HDRS)
    list(APPEND files ${PROJECT_SOURCE_DIR}/${f})
    if(f MATCHES "\\.(cc|cu)$")
      list(APPEND compiled ${f})
    endif()
  endforeach()
  # Every library this one needs, itself first, each before what it depends on.
  set(closure "")
  foreach(t IN LISTS deps)
    get_target_property(c ${t} MEMGRAD_CLOSURE)
    if(c)
      list(APPEND closure ${c})
    endif()
  endforeach()

  if(kind STREQUAL "library")
    if(compiled)
      add_library(${name} OBJECT ${files})
      mg_compile_flags(${name})
      target_link_libraries(${name} PUBLIC memgrad_build_interface ${deps} ${A_LINKOPTS})
      target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${A_COPTS}>")
    else()
      add_library(${name} INTERFACE ${files})
      target_link_libraries(${name} INTERFACE memgrad_build_interface ${deps} ${A_LINKOPTS})
    endif()
    list(PREPEND closure ${name})
    list(REMOVE_DUPLICATES closure)
    set_target_properties(${name} PROPERTIES MEMGRAD_CLOSURE "${closure}" MEMGRAD_FILES "${files}"
      MEMGRAD_LABEL "${label}" MEMGRAD_TESTONLY "${A_TESTONLY}")
    set_property(GLOBAL APPEND PROPERTY MEMGRAD_LIBRARIES ${name})
    return()
  endif()

  # A test or binary: bin/<package>/<name> like bazel-bin, linking all its libraries' objects.
  list(REMOVE_DUPLICATES closure)
  string(REGEX MATCH "^//([^:]*):(.*)$" _ "${label}")
  set(package "${CMAKE_MATCH_1}")
  set(short "${CMAKE_MATCH_2}")
  add_executable(${name} ${files})
  mg_compile_flags(${name})
  target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${A_COPTS}>")
  target_link_libraries(${name} PRIVATE memgrad_build_interface ${closure} ${deps} ${A_LINKOPTS})
  # Linked by the C++ compiler, as Bazel does (no device code links across files).
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX
    OUTPUT_NAME ${short} RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin/${package})
  if(kind STREQUAL "test")
    # Bazel's test environment: a private TEST_TMPDIR, gtest XML where tools/count_tests.py reads
    # it (the bazel-testlogs layout), the source tree for tests that read files of it.
    set(logs ${PROJECT_BINARY_DIR}/testlogs/${package}/${short})
    file(MAKE_DIRECTORY ${logs}/tmp)
    add_test(NAME ${label} COMMAND ${name})
    set(timeout 60)
    if(A_SIZE STREQUAL "medium")
      set(timeout 300)
    elseif(A_SIZE STREQUAL "large")
      set(timeout 900)
    endif()
    set(labels ${A_SIZE})
    if(A_GPU)
      list(APPEND labels gpu)
    else()
      list(APPEND labels cpu)
    endif()
    set_tests_properties(${label} PROPERTIES
      LABELS "${labels}" TIMEOUT ${timeout}
      ENVIRONMENT "TEST_TMPDIR=${logs}/tmp;GTEST_OUTPUT=xml:${logs}/test.xml;MG_SOURCE_ROOT=${PROJECT_SOURCE_DIR}")
  endif()
endfunction()

# What every memgrad target compiles with: the repository root on the include path, as Bazel's
# execroot is (#include "core/tensor.h").
add_library(memgrad_build_interface INTERFACE)
target_include_directories(memgrad_build_interface INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)

# mg_public_library(NAME EXPORT_NAME n ROOTS label... [LINK lib...]): a shared library of the
# objects of ROOTS and everything they depend on, less what the LINK libraries hold; installed
# and exported as memgrad::n with its headers.
function(mg_public_library lib)
  cmake_parse_arguments(PARSE_ARGV 1 A "" "EXPORT_NAME" "ROOTS;LINK")
  set(held "")
  foreach(l IN LISTS A_LINK)
    get_target_property(h ${l} MEMGRAD_HELD)
    list(APPEND held ${h})
  endforeach()
  set(objects "")
  foreach(r IN LISTS A_ROOTS)
    mg_target_name(t "${r}")
    if(NOT TARGET ${t})
      message(FATAL_ERROR "${lib}: ${r} is not built (${MEMGRAD_WITH_CUDA})")
    endif()
    get_target_property(c ${t} MEMGRAD_CLOSURE)
    list(APPEND objects ${c})
  endforeach()
  list(REMOVE_DUPLICATES objects)
  list(REMOVE_ITEM objects ${held})
  add_library(${lib} SHARED)
  set_target_properties(${lib} PROPERTIES LINKER_LANGUAGE CXX)
  add_library(memgrad::${A_EXPORT_NAME} ALIAS ${lib})
  target_link_libraries(${lib} PRIVATE ${objects})
  target_link_libraries(${lib} PUBLIC ${A_LINK} nlohmann_json::nlohmann_json)
  target_compile_features(${lib} PUBLIC cxx_std_20)
  target_include_directories(${lib} INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/memgrad>)
  if(MEMGRAD_WITH_CUDA)
    # Headers of the CUDA backend (core/cuda/, kernels/cuda/) include the toolkit's.
    target_link_libraries(${lib} PUBLIC CUDA::toolkit)
  endif()
  set_target_properties(${lib} PROPERTIES
    EXPORT_NAME ${A_EXPORT_NAME} MEMGRAD_HELD "${held};${objects}"
    # The installed library finds cuBLAS, cuDNN and NCCL where it was linked against them.
    INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS ${lib} EXPORT memgradTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  foreach(t IN LISTS objects)
    get_target_property(files ${t} MEMGRAD_FILES)
    foreach(f IN LISTS files)
      if(NOT f MATCHES "\\.(cc|cu)$")
        file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${f})
        get_filename_component(dir ${rel} DIRECTORY)
        install(FILES ${f} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/memgrad/${dir})
      endif()
    endforeach()
  endforeach()
endfunction()

# Every library of memgrad's packages is in an installed library (a Bazel library added to no
# mg_public_library() would otherwise be compiled and never shipped).
function(mg_check_libraries_complete)
  get_property(libs GLOBAL PROPERTY MEMGRAD_LIBRARIES)
  set(held "")
  foreach(l memgrad memgrad_models memgrad_distributed)
    get_target_property(h ${l} MEMGRAD_HELD)
    list(APPEND held ${h})
  endforeach()
  foreach(t IN LISTS libs)
    get_target_property(label ${t} MEMGRAD_LABEL)
    get_target_property(testonly ${t} MEMGRAD_TESTONLY)
    if(NOT testonly AND NOT label MATCHES "^//(tests|bench|examples)[/:]" AND NOT t IN_LIST held)
      message(FATAL_ERROR "${label} is in no installed library: add it to a mg_public_library() in CMakeLists.txt")
    endif()
  endforeach()
endfunction()
