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

// Inside the calling thread's DeferredIndexChecks scope, outside a CUDA graph capture on
// `device`, and while one of the thread's pinned slots is free: queues on `st` a copy of `bytes`
// (at most kDeferredReadBytes) at `src` to a pinned slot, records an event behind it, and hands
// the scope a step for finish() that waits for the event, frees the slot and calls
// settle(the slot's bytes), which may throw. Returns true then. Otherwise queues nothing and
// returns false: the caller reads at once. `src` is read in stream order, so a buffer freed
// after the call (stream-ordered reuse) is read before anything reuses it.
bool defer_host_read(const void* src, size_t bytes, int device, cudaStream_t st,
                     std::function<void(const void* host)> settle);

}  // namespace mg::kernels::cuda
