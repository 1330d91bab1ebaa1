// Per-thread, per-device library handles (cuBLAS, cuDNN). Handles are never destroyed: a thread
// that ends returns its handles to a process-wide pool (destroying them at process exit can run
// after the driver is gone), and the next thread reuses them.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/device_runtime.h"
#include "core/env.h"

namespace mg::kernels::cuda {

// A library workspace size from the environment, given in MiB (a negative value counts as 0),
// or `default_mib` when the variable is unset. Callers read it once, into a static.
inline std::size_t env_workspace_bytes(const char* name, long default_mib) {
  const long mib = env::integer(name, default_mib);
  return static_cast<std::size_t>(mib < 0 ? 0 : mib) << 20;
}

// The state a thread keeps per device: its handle and the stream the handle is bound to.
template <class Handle>
struct HandleEntry {
  Handle handle = nullptr;
  void* bound_stream = nullptr;
  bool bound = false;
};

// The calling thread's entry for `device` (Entry derives from HandleEntry). A thread's first call
// for a device takes a pooled handle or makes one with create(&handle), then setup(handle);
// bind(entry, stream) runs whenever the device's current stream is not the one bound. The pool
// belongs to the instantiation: each library calls this from one place.
template <class Entry, class Create, class Setup, class Bind>
Entry& thread_handle(int device, Create create, Setup setup, Bind bind) {
  using Handle = decltype(Entry::handle);
  static auto* mu = new std::mutex();                            // never destroyed: threads end
  static auto* pool = new std::map<int, std::vector<Handle>>();  // after static destructors run
  struct Threads {
    std::map<int, Entry> by_device;
    ~Threads() {
      std::lock_guard<std::mutex> g(*mu);
      for (auto& [dev, e] : by_device)
        if (e.handle) (*pool)[dev].push_back(e.handle);
    }
  };
  thread_local Threads mine;
  Entry& e = mine.by_device[device];
  if (!e.handle) {
    {
      std::lock_guard<std::mutex> g(*mu);
      auto& v = (*pool)[device];
      if (!v.empty()) {
        e.handle = v.back();
        v.pop_back();
      }
    }
    if (!e.handle) create(&e.handle);
    setup(e.handle);
    e.bound = false;
  }
  void* stream = mg::cuda::Stream::current(device).handle();
  if (!e.bound || e.bound_stream != stream) {
    bind(e, stream);
    e.bound_stream = stream;
    e.bound = true;
  }
  return e;
}

}  // namespace mg::kernels::cuda
