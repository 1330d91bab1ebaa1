// cuBLAS access for the CUDA kernels: the calling thread's handle for a device, bound to
// that device's current stream with a workspace from memgrad's caching allocator.
#pragma once

#include <cublas_v2.h>

#include "core/error.h"

// Checks a cuBLAS call; a failure raises mg::CudaError naming the call and the status.
#define MG_CUBLAS_CHECK(call)                                                                                         \
  do {                                                                                                                \
    cublasStatus_t mg_st_ = (call);                                                                                   \
    if (mg_st_ != CUBLAS_STATUS_SUCCESS)                                                                              \
      MG_THROW(::mg::CudaError, #call, " failed: ", cublasGetStatusName(mg_st_), " (", cublasGetStatusString(mg_st_), \
               ") at ", __FILE__, ":", __LINE__);                                                                     \
  } while (0)

namespace mg::kernels::cuda {

// The handle of this thread for `device` (created on first use), with its stream set to
// mg::cuda::Stream::current(device) and a workspace for that stream. Call the device's
// DeviceGuard first. The workspace size is MG_CUBLAS_WORKSPACE_MB (default 32 MiB, what
// cuBLAS itself uses on Hopper); it is allocated once per (thread, device, stream).
cublasHandle_t cublas_handle(int device);

}  // namespace mg::kernels::cuda
