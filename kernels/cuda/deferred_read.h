// Small device values read on the host at a kernels::DeferredIndexChecks scope's finish()
// (kernels/deferred_checks.h): the index checks of kernels/cuda/index.cu and the label check of
// the cross-entropy in kernels/cuda/loss.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

namespace mg::kernels::cuda {

// The most bytes one deferred read copies (an index check's finding: flag and value).
constexpr size_t kDeferredReadBytes = 16;

// Calls settle(a host copy of the `bytes` at `src`, at most kDeferredReadBytes), which may
// throw, once `st` has written them. Inside the calling thread's DeferredIndexChecks scope, while
// one of the thread's pinned slots is free, the copy goes to that slot behind an event and settle
// runs at the scope's finish(); otherwise the host waits for `st` and settle runs here. `src` is
// read in stream order, so a buffer freed after the call (stream-ordered reuse) is read before
// anything reuses it. Not inside a CUDA graph capture on `device`: there is nothing to read
// until a replay, and the callers skip their checks then (docs/cuda_graphs.md).
void read_to_host(const void* src, size_t bytes, int device, cudaStream_t st,
                  std::function<void(const void* host)> settle);

}  // namespace mg::kernels::cuda
