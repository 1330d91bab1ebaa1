// The CPU backend: kernels/backend.h implemented with loops and Eigen, one file per op family;
// the declaration both backends share is kernels/backend_impl.h.
#pragma once

#include <functional>

#include "kernels/backend_impl.h"

namespace mg::kernels::cpu {

// Threads the CPU kernels use: $MG_NUM_THREADS if set, else the hardware's (cpu/parallel.cc).
int num_threads();
// Runs f(begin, end) over contiguous slices of [0, n) on up to num_threads() threads,
// giving each at least `grain` items (one slice on the calling thread when n < 2 * grain).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

}  // namespace mg::kernels::cpu

namespace mg::kernels {

using CpuBackend = BackendImpl<DeviceType::CPU>;

}  // namespace mg::kernels
