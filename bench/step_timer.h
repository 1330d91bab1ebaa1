// Times training steps on the device the way every model benchmark here does: warm-up steps,
// peak counters reset, then each step bracketed by CUDA events on the current stream.
#pragma once

#include <algorithm>
#include <vector>

#include "core/cuda_memory.h"
#include "core/device_runtime.h"

namespace mg::bench {

// Runs `warmup` steps, resets the device's peak memory counters, then times `steps` steps;
// returns each step's milliseconds, sorted (the median is v[v.size() / 2]).
template <class StepFn>
std::vector<double> time_steps(StepFn&& step, int warmup, int steps, Device dev) {
  for (int i = 0; i < warmup; ++i) step();
  cuda::synchronize();
  reset_peak_memory_stats(dev);
  std::vector<double> ms;
  cuda::Stream s = cuda::Stream::current(dev.index);
  for (int i = 0; i < steps; ++i) {
    cuda::Event a(true), b(true);
    a.record(s);
    step();
    b.record(s);
    b.synchronize();
    ms.push_back(a.elapsed_ms(b));
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

}  // namespace mg::bench
