// Google Benchmark's manual time from CUDA events, for the kernel benches that report device
// time rather than host time (BENCHMARK(...)->UseManualTime()).
#pragma once

#include <benchmark/benchmark.h>

#include "core/device_runtime.h"

namespace mg::bench {

// False (and the benchmark marked skipped) when there is no CUDA device.
inline bool require_gpu(benchmark::State& state) {
  if (cuda::is_available()) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

// Calls `step` `warmup` times, then once per benchmark iteration between CUDA events on device
// 0's current stream, each iteration's manual time being its event time. Returns the mean ms.
template <class F>
double event_time_ms(benchmark::State& state, int warmup, F&& step) {
  cuda::Event start(true), stop(true);
  cuda::Stream s = cuda::Stream::current(0);
  for (int i = 0; i < warmup; ++i) step();
  double total = 0;
  int iters = 0;
  for (auto _ : state) {
    start.record(s);
    step();
    stop.record(s);
    stop.synchronize();
    const float ms = start.elapsed_ms(stop);
    total += ms;
    ++iters;
    state.SetIterationTime(ms / 1e3);
  }
  return iters > 0 ? total / iters : 0.0;
}

}  // namespace mg::bench
