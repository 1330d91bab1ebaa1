# What memgrad builds against, found on the system (Debian 12's packages from tools/setup.sh; the
# CUDA toolkit where one is installed). Each Bazel repository a target names (@eigen,
# @local_cuda//:cublas, ...) becomes an interface target mg_ext.<repository>.<name> here, the way
# memgrad_deps.bzl and third_party/*.BUILD expose them to Bazel. A target whose dependency is not
# defined (a CUDA library in a CPU build) is left out, as Bazel leaves out incompatible targets.

find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)

# third_party/eigen.BUILD: the define reaches every target that depends on Eigen.
add_library(mg_ext.eigen.eigen INTERFACE)
target_link_libraries(mg_ext.eigen.eigen INTERFACE Eigen3::Eigen)
target_compile_definitions(mg_ext.eigen.eigen INTERFACE EIGEN_MPL2_ONLY)

add_library(mg_ext.nlohmann_json.json INTERFACE)
target_link_libraries(mg_ext.nlohmann_json.json INTERFACE nlohmann_json::nlohmann_json)

add_library(mg_ext.system_zlib.zlib INTERFACE)
target_link_libraries(mg_ext.system_zlib.zlib INTERFACE ZLIB::ZLIB)

if(MEMGRAD_BUILD_TESTS)
  find_package(GTest REQUIRED)
  add_library(mg_ext.system_gtest.gtest INTERFACE)
  target_link_libraries(mg_ext.system_gtest.gtest INTERFACE GTest::gtest Threads::Threads)
  add_library(mg_ext.system_gtest.gtest_main INTERFACE)
  target_link_libraries(mg_ext.system_gtest.gtest_main INTERFACE GTest::gtest_main mg_ext.system_gtest.gtest)
endif()

# ---- CUDA: nvcc through CMake's CUDA language, the libraries through FindCUDAToolkit, cuDNN and
# NCCL (not part of the toolkit's CMake support) with find_path / find_library beside it.
set(MEMGRAD_WITH_CUDA OFF)
if(NOT MEMGRAD_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MEMGRAD_CUDA is '${MEMGRAD_CUDA}': use AUTO, ON or OFF")
endif()
if(NOT MEMGRAD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  set(_mg_cuda_missing "")
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # sm_90 SASS + compute_90 PTX, tools/cuda/cuda.bzl's default
    endif()
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      # CMake before 3.26 knows no C++20 flag for nvcc (which has taken -std=c++20 since CUDA 12).
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit)
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cublasLt OR NOT TARGET CUDA::cupti)
      list(APPEND _mg_cuda_missing "the CUDA toolkit's libraries (cudart, cuBLAS, cuBLASLt, CUPTI)")
    endif()
    find_path(MEMGRAD_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_PATH
      PATH_SUFFIXES include)
    find_library(MEMGRAD_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_PATH
      PATH_SUFFIXES lib64 lib)
    find_path(MEMGRAD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
      PATH_SUFFIXES include)
    find_library(MEMGRAD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
      PATH_SUFFIXES lib64 lib)
    foreach(_mg_dep CUDNN_INCLUDE_DIR CUDNN_LIBRARY NCCL_INCLUDE_DIR NCCL_LIBRARY)
      if(NOT MEMGRAD_${_mg_dep})
        list(APPEND _mg_cuda_missing "MEMGRAD_${_mg_dep}")
      endif()
    endforeach()
  else()
    set(_mg_cuda_missing "nvcc (set CMAKE_CUDA_COMPILER or put it on PATH)")
  endif()
  if(_mg_cuda_missing STREQUAL "")
    set(MEMGRAD_WITH_CUDA ON)
  elseif(MEMGRAD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MEMGRAD_CUDA=ON, but not found: ${_mg_cuda_missing}")
  else()
    message(STATUS "memgrad: building the CPU backend only (not found: ${_mg_cuda_missing})")
  endif()
endif()

if(MEMGRAD_WITH_CUDA)
  # Bazel links the static CUDA runtime explicitly (@local_cuda//:cudart_static); CMake adds none.
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)
  add_library(mg_ext.local_cuda.cuda_headers INTERFACE)
  target_include_directories(mg_ext.local_cuda.cuda_headers SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  add_library(mg_ext.local_cuda.cudart_static INTERFACE)
  target_link_libraries(mg_ext.local_cuda.cudart_static INTERFACE CUDA::cudart_static)
  add_library(mg_ext.local_cuda.cupti INTERFACE)
  target_link_libraries(mg_ext.local_cuda.cupti INTERFACE CUDA::cupti)
  add_library(mg_ext.local_cuda.cublas INTERFACE)
  target_link_libraries(mg_ext.local_cuda.cublas INTERFACE CUDA::cublas)
  add_library(mg_ext.local_cuda.cublasLt INTERFACE)
  target_link_libraries(mg_ext.local_cuda.cublasLt INTERFACE CUDA::cublasLt)
  add_library(mg_ext.local_cuda.cudnn INTERFACE)
  target_include_directories(mg_ext.local_cuda.cudnn SYSTEM INTERFACE ${MEMGRAD_CUDNN_INCLUDE_DIR})
  target_link_libraries(mg_ext.local_cuda.cudnn INTERFACE ${MEMGRAD_CUDNN_LIBRARY})
  add_library(mg_ext.local_cuda.nccl INTERFACE)
  target_include_directories(mg_ext.local_cuda.nccl SYSTEM INTERFACE ${MEMGRAD_NCCL_INCLUDE_DIR})
  target_link_libraries(mg_ext.local_cuda.nccl INTERFACE ${MEMGRAD_NCCL_LIBRARY})
endif()
