// Per-thread, per-device cuBLAS handles (kernels/cuda/thread_handles.h), each with a workspace
// per stream.
#include "kernels/cuda/cublas.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <utility>

#include "core/cuda/check.h"
#include "core/device_runtime.h"
#include "core/tensor.h"
#include "kernels/cuda/thread_handles.h"

namespace mg::kernels::cuda {
namespace {

size_t workspace_bytes() {
  static const size_t bytes = env_workspace_bytes("MG_CUBLAS_WORKSPACE_MB", 32);
  return bytes;
}

struct CublasEntry : HandleEntry<cublasHandle_t> {
  std::map<void*, Storage> workspaces;  // by stream
  ~CublasEntry() {
    // Workspaces stay alive with the process (their blocks may still be in use on the device):
    // release the references without freeing.
    for (auto& [s, st] : workspaces) new Storage(std::move(st));
  }
};

}  // namespace

namespace {
CublasEntry& cublas_entry(int device) {
  const auto create = [](cublasHandle_t* h) { MG_CUBLAS_CHECK(cublasCreate(h)); };
  const auto setup = [](cublasHandle_t h) {
    // f32 stays exact f32 (no TF32 unless asked for); pointer-mode host for alpha/beta.
    MG_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    MG_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  };
  const auto bind = [device](CublasEntry& e, void* stream) {
    MG_CUBLAS_CHECK(cublasSetStream(e.handle, static_cast<cudaStream_t>(stream)));
    if (workspace_bytes() == 0) return;
    auto it = e.workspaces.find(stream);
    if (it == e.workspaces.end()) {
      MemoryCategoryGuard cat(MemoryCategory::Other);  // not the activations of whoever called first
      it = e.workspaces.emplace(stream, make_storage(workspace_bytes(), Device::cuda(device))).first;
    }
    MG_CUBLAS_CHECK(cublasSetWorkspace(e.handle, it->second->data, it->second->nbytes));
  };
  return thread_handle<CublasEntry>(device, create, setup, bind);
}
}  // namespace

cublasHandle_t cublas_handle(int device) { return cublas_entry(device).handle; }

void* cublas_workspace(int device, size_t* bytes) {
  CublasEntry& e = cublas_entry(device);
  auto it = e.workspaces.find(e.bound_stream);
  *bytes = it == e.workspaces.end() ? 0 : it->second->nbytes;
  return it == e.workspaces.end() ? nullptr : it->second->data;
}

}  // namespace mg::kernels::cuda
