// cuDNN access for the CUDA kernels: the calling thread's handle for a device, bound to the
// device's current stream, plus the settings the convolution's algorithm choice reads.
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

// Checks a cuDNN call; a failure raises mg::CudaError naming the call, the status and
// cuDNN's own last message (which usually says which parameter it disliked).
#define MG_CUDNN_CHECK(call)                                                               \
  do {                                                                                     \
    cudnnStatus_t mg_st_ = (call);                                                         \
    if (mg_st_ != CUDNN_STATUS_SUCCESS)                                                    \
      MG_THROW(::mg::CudaError, #call, " failed: ", cudnnGetErrorString(mg_st_), " (",     \
               ::mg::kernels::cuda::cudnn_last_error(), ") at ", __FILE__, ":", __LINE__); \
  } while (0)

namespace mg::kernels::cuda {

// The handle of this thread for `device` (created on first use), with its stream set to
// mg::cuda::Stream::current(device). Call the device's DeviceGuard first.
cudnnHandle_t cudnn_handle(int device);

// cuDNN's most recent error message for this thread ("" when it has none).
std::string cudnn_last_error();

// The cuDNN data type of a floating dtype (f64, f32, f16, bf16); DTypeError naming `op` otherwise.
cudnnDataType_t cudnn_data_type(DType t, const char* op);

// Like torch.backends.cudnn.benchmark: when on, the first convolution of each shape times
// every algorithm (cudnnFind*AlgorithmEx) and keeps the fastest; when off (the default),
// cuDNN's heuristics (cudnnGet*Algorithm_v7) rank them and the first that fits is used.
// The environment variable MG_CUDNN_BENCHMARK=1 turns it on at start-up.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

// The most workspace one convolution may take on `device`: MG_CUDNN_WORKSPACE_LIMIT_MB
// (default 1024 MiB), further bounded by what memgrad's caching allocator can hand out
// without growing past the device's free memory (its cached free bytes plus the driver's
// free bytes). Workspaces themselves always come from the caching allocator.
size_t cudnn_workspace_limit(int device);

}  // namespace mg::kernels::cuda
