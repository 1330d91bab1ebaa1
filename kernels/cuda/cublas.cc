// Per-thread, per-device cuBLAS handles. Handles are never destroyed: a thread that ends
// returns its handles to a process-wide pool (cublasDestroy at process exit can run after
// the driver is gone), and the next thread reuses them.
#include "kernels/cuda/cublas.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/device_runtime.h"
#include "core/tensor.h"

namespace mg::kernels::cuda {
namespace {

std::mutex g_pool_mu;
std::map<int, std::vector<cublasHandle_t>>& pool() {
  static auto* p = new std::map<int, std::vector<cublasHandle_t>>();  // never destroyed
  return *p;
}

size_t workspace_bytes() {
  static const size_t bytes = [] {
    const char* e = std::getenv("MG_CUBLAS_WORKSPACE_MB");
    const long mb = e ? std::strtol(e, nullptr, 10) : 32;
    return static_cast<size_t>(mb < 0 ? 0 : mb) << 20;
  }();
  return bytes;
}

struct ThreadHandles {
  struct Entry {
    cublasHandle_t handle = nullptr;
    std::map<void*, Storage> workspaces;  // by stream
    void* bound_stream = nullptr;
    bool bound = false;
  };
  std::map<int, Entry> by_device;
  ~ThreadHandles() {
    std::lock_guard<std::mutex> g(g_pool_mu);
    for (auto& [dev, e] : by_device) {
      pool()[dev].push_back(e.handle);
      // Workspaces stay alive with the process (their blocks may still be in use on the
      // device): release the references without freeing.
      for (auto& [s, st] : e.workspaces) new Storage(std::move(st));
    }
  }
};

ThreadHandles& thread_handles() {
  thread_local ThreadHandles h;
  return h;
}

}  // namespace

cublasHandle_t cublas_handle(int device) {
  auto& e = thread_handles().by_device[device];
  if (!e.handle) {
    {
      std::lock_guard<std::mutex> g(g_pool_mu);
      auto& v = pool()[device];
      if (!v.empty()) {
        e.handle = v.back();
        v.pop_back();
      }
    }
    if (!e.handle) MG_CUBLAS_CHECK(cublasCreate(&e.handle));
    // f32 stays exact f32 (no TF32 unless asked for); pointer-mode host for alpha/beta.
    MG_CUBLAS_CHECK(cublasSetMathMode(e.handle, CUBLAS_DEFAULT_MATH));
    MG_CUBLAS_CHECK(cublasSetPointerMode(e.handle, CUBLAS_POINTER_MODE_HOST));
  }
  void* stream = mg::cuda::Stream::current(device).handle();
  if (!e.bound || e.bound_stream != stream) {
    MG_CUBLAS_CHECK(cublasSetStream(e.handle, static_cast<cudaStream_t>(stream)));
    if (workspace_bytes() > 0) {
      auto it = e.workspaces.find(stream);
      if (it == e.workspaces.end()) {
        MemoryCategoryGuard cat(MemoryCategory::Other);  // not the activations of whoever called first
        it = e.workspaces.emplace(stream, make_storage(workspace_bytes(), Device::cuda(device))).first;
      }
      MG_CUBLAS_CHECK(cublasSetWorkspace(e.handle, it->second->data, it->second->nbytes));
    }
    e.bound_stream = stream;
    e.bound = true;
  }
  return e.handle;
}

}  // namespace mg::kernels::cuda
