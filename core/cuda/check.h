// Checking every CUDA runtime / driver / cuBLAS / cuDNN call: a failure raises
// mg::CudaError naming the call, the error string, and the file and line.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace mg::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  MG_THROW(::mg::CudaError, call, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") at ", file, ":",
           line);
}

inline bool cuda_query_done(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (err != cudaSuccess) throw_cuda_error(err, call, file, line);
  return true;
}

}  // namespace mg::detail

#define MG_CUDA_CHECK(call)                                                                         \
  do {                                                                                              \
    cudaError_t mg_err_ = (call);                                                                   \
    if (mg_err_ != cudaSuccess) ::mg::detail::throw_cuda_error(mg_err_, #call, __FILE__, __LINE__); \
  } while (0)

// For cudaEventQuery / cudaStreamQuery: true once the work is done, false while it is still
// pending (the not-ready status is cleared from cudaGetLastError); other errors raise as above.
#define MG_CUDA_QUERY(call) ::mg::detail::cuda_query_done((call), #call, __FILE__, __LINE__)

// After a kernel launch: catches bad launch configurations at the call site.
#define MG_CUDA_CHECK_LAUNCH(name) MG_CUDA_CHECK_LAUNCH_IMPL(name, __FILE__, __LINE__)
#define MG_CUDA_CHECK_LAUNCH_IMPL(name, file, line)                                                     \
  do {                                                                                                  \
    cudaError_t mg_err_ = cudaGetLastError();                                                           \
    if (mg_err_ != cudaSuccess)                                                                         \
      MG_THROW(::mg::CudaError, "kernel launch '", name, "' failed: ", cudaGetErrorName(mg_err_), " (", \
               cudaGetErrorString(mg_err_), ") at ", file, ":", line);                                  \
  } while (0)
