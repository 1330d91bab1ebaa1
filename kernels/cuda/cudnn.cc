// Per-thread, per-device cuDNN handles (kernels/cuda/thread_handles.h), the benchmark switch,
// the workspace limit and the dtype mapping the cuDNN convolutions use.
#include "kernels/cuda/cudnn.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "core/cuda/check.h"
#include "core/enum_name.h"
#include "core/cuda_memory.h"
#include "core/device_runtime.h"
#include "core/env.h"
#include "kernels/cuda/thread_handles.h"

namespace mg::kernels::cuda {
namespace {

std::atomic<bool>& benchmark_flag() {
  static std::atomic<bool> flag{env::choice("MG_CUDNN_BENCHMARK", {"0", "1"}) == "1"};
  return flag;
}

size_t env_workspace_cap() {
  static const size_t bytes = env_workspace_bytes("MG_CUDNN_WORKSPACE_LIMIT_MB", 1024);
  return bytes;
}

}  // namespace

cudnnHandle_t cudnn_handle(int device) {
  const auto create = [](cudnnHandle_t* h) { MG_CUDNN_CHECK(cudnnCreate(h)); };
  const auto bind = [](HandleEntry<cudnnHandle_t>& e, void* stream) {
    MG_CUDNN_CHECK(cudnnSetStream(e.handle, static_cast<cudaStream_t>(stream)));
  };
  return thread_handle<HandleEntry<cudnnHandle_t>>(
             device, create, [](cudnnHandle_t) {}, bind)
      .handle;
}

std::string cudnn_last_error() {
  char buf[512] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf[0] ? std::string(buf) : std::string("no further detail");
}

cudnnDataType_t cudnn_data_type(DType t, const char* op) {
  // In DType's order: the floating types come first.
  static constexpr cudnnDataType_t kTypes[] = {CUDNN_DATA_DOUBLE, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF,
                                               CUDNN_DATA_BFLOAT16};
  const cudnnDataType_t* type = enum_lookup(t, kTypes);
  MG_CHECK(type, DTypeError, op, ": cuDNN needs f64, f32, f16 or bf16, got ", t);
  return *type;
}

void set_cudnn_benchmark(bool on) { benchmark_flag().store(on); }
bool cudnn_benchmark() { return benchmark_flag().load(); }

size_t cudnn_workspace_limit(int device) {
  // One workspace is one allocation: it comes either from the largest cached free block
  // or from a new segment, which the driver's free memory bounds.
  const mg::cuda::Fragmentation f = mg::cuda::fragmentation(device);
  int64_t free_b = 0, total_b = 0;
  mg::cuda::mem_get_info(device, &free_b, &total_b);
  const int64_t avail = std::max<int64_t>(f.largest_free_block, free_b);
  return std::min(env_workspace_cap(), static_cast<size_t>(std::max<int64_t>(avail, 0)));
}

}  // namespace mg::kernels::cuda
