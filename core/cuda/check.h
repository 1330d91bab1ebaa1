// Checking every CUDA runtime / driver / cuBLAS / cuDNN call: a failure raises
// mg::CudaError naming the call, the error string, and the file and line.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define MG_CUDA_CHECK(call)                                                                                       \
  do {                                                                                                            \
    cudaError_t mg_err_ = (call);                                                                                 \
    if (mg_err_ != cudaSuccess) {                                                                                 \
      (void)cudaGetLastError();                                                                                   \
      MG_THROW(::mg::CudaError, #call, " failed: ", cudaGetErrorName(mg_err_), " (", cudaGetErrorString(mg_err_), \
               ") at ", __FILE__, ":", __LINE__);                                                                 \
    }                                                                                                             \
  } while (0)

// After a kernel launch: catches bad launch configurations at the call site.
#define MG_CUDA_CHECK_LAUNCH(name) MG_CUDA_CHECK_LAUNCH_IMPL(name, __FILE__, __LINE__)
#define MG_CUDA_CHECK_LAUNCH_IMPL(name, file, line)                                                     \
  do {                                                                                                  \
    cudaError_t mg_err_ = cudaGetLastError();                                                           \
    if (mg_err_ != cudaSuccess)                                                                         \
      MG_THROW(::mg::CudaError, "kernel launch '", name, "' failed: ", cudaGetErrorName(mg_err_), " (", \
               cudaGetErrorString(mg_err_), ") at ", file, ":", line);                                  \
  } while (0)
