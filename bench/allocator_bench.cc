// The caching allocator's cost and its memory efficiency:
//  - alloc+free pairs through the caching allocator vs raw cudaMalloc/cudaFree (H200);
//  - a replayed GPT-2 training-step trace and a growing-batch trace: peak reserved over
//    peak allocated, with and without expandable segments (real device and fake device).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>

#include "bench/training_trace.h"
#include "core/allocator/caching_allocator.h"
#include "core/cuda/cuda_device_memory.h"
#include "core/allocator/fake_device.h"
#include "core/device_runtime.h"

namespace mg::bench {
namespace {

bool have_gpu(benchmark::State& state) {
  if (cuda::is_available()) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

void BM_CudaMallocFree(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
    cudaFree(p);
  }
  state.SetLabel("raw cudaMalloc+cudaFree");
}

void BM_CachingAllocFree(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  cuda::CudaDeviceMemory mem(0);
  allocator::CachingAllocator a(mem, 0);
  a.free(a.allocate(bytes));  // warm: the segment is cached
  for (auto _ : state) {
    void* p = a.allocate(bytes);
    benchmark::DoNotOptimize(p);
    a.free(p);
  }
  a.empty_cache();
  state.SetLabel("memgrad caching allocator");
}

// The same pair on FakeDevice: the allocator's own CPU cost, measurable on a machine without a
// GPU (the device is only touched on the warm-up allocation). Arg 1 = expandable segments.
void BM_CachingAllocFreeFake(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  allocator::FakeDevice mem(size_t{140} << 30);
  allocator::CachingAllocator a(mem, 0);
  a.set_expandable_segments(state.range(1) != 0);
  a.free(a.allocate(bytes));
  for (auto _ : state) {
    void* p = a.allocate(bytes);
    benchmark::DoNotOptimize(p);
    a.free(p);
  }
  a.empty_cache();
  state.SetLabel(state.range(1) ? "fake device, expandable" : "fake device");
}

BENCHMARK(BM_CudaMallocFree)->Arg(4 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_CachingAllocFree)->Arg(4 << 10)->Arg(1 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_CachingAllocFreeFake)->ArgsProduct({{4 << 10, 1 << 20, 64 << 20}, {0, 1}});

// memgrad's fragmentation policies off: PyTorch's plain best fit, cache freed only on OOM.
constexpr const char* kPyTorchPolicies = "reserved_slack:-1,segment_reuse_ratio:0";

// Replays a trace; reports peak reserved / peak allocated (1.0 = no waste) and device calls.
void replay(benchmark::State& state, allocator::DeviceMemory& mem, const std::vector<TraceEvent>& trace,
            bool expandable, bool pytorch_policies) {
  double ratio = 0, peak_alloc = 0, peak_res = 0, calls = 0;
  for (auto _ : state) {
    allocator::CachingAllocator a(mem, 0);
    a.set_expandable_segments(expandable);
    if (pytorch_policies) a.configure(kPyTorchPolicies);
    std::map<int64_t, void*> live;
    for (const TraceEvent& e : trace) {
      if (e.alloc) {
        live[e.id] = a.allocate(e.bytes);
      } else {
        a.free(live[e.id]);
        live.erase(e.id);
      }
    }
    for (auto& kv : live) a.free(kv.second);
    peak_alloc = static_cast<double>(a.max_memory_allocated());
    peak_res = static_cast<double>(a.max_memory_reserved());
    ratio = peak_res / peak_alloc;
    const allocator::DeviceStats st = a.stats();
    calls = static_cast<double>(st.num_device_alloc + st.num_device_free);
    a.empty_cache();
  }
  state.counters["device_calls"] = calls;
  state.counters["peak_alloc_GiB"] = peak_alloc / (1 << 30);
  state.counters["peak_reserved_GiB"] = peak_res / (1 << 30);
  state.counters["reserved_over_alloc"] = ratio;
}

// Args: expandable, real device, mapping unit in MiB (expandable segments: what each physical
// allocation holds; CudaDeviceMemory's default is 16, the fake device's 2), PyTorch's policies.
void BM_TraceGpt2Step(benchmark::State& state) {
  const bool expandable = state.range(0) != 0;
  const bool real = state.range(1) != 0;
  const size_t unit = static_cast<size_t>(state.range(2)) << 20;
  const bool pytorch = state.range(3) != 0;
  GptShape shape;  // GPT-2 124M, B=8, T=1024, f32
  auto trace = gpt_training_step_trace(shape, 2);
  if (real) {
    if (!have_gpu(state)) return;
    cuda::CudaDeviceMemory mem(0, unit);
    replay(state, mem, trace, expandable, pytorch);
  } else {
    allocator::FakeDevice mem(size_t{140} << 30, true, unit);
    replay(state, mem, trace, expandable, pytorch);
  }
  state.SetLabel(std::string(real ? "H200" : "fake device") +
                 (expandable ? ", expandable segments, unit " + std::to_string(unit >> 20) + " MiB" : ", segments") +
                 (pytorch ? ", PyTorch policies" : ""));
}
BENCHMARK(BM_TraceGpt2Step)
    ->Args({0, 0, 2, 0})
    ->Args({1, 0, 2, 0})
    ->Args({0, 0, 2, 1})
    ->Args({1, 0, 2, 1})
    ->Args({0, 1, 8, 0})
    ->Args({1, 1, 2, 0})
    ->Args({1, 1, 8, 0})
    ->Args({1, 1, 16, 0})
    ->Args({1, 1, 32, 0})
    ->Args({1, 1, 64, 0})
    ->Args({1, 1, 2, 1})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Args: expandable, real device, PyTorch's policies.
void BM_TraceGrowingBatch(benchmark::State& state) {
  const bool expandable = state.range(0) != 0;
  const bool real = state.range(1) != 0;
  const bool pytorch = state.range(2) != 0;
  auto trace = growing_batch_trace(size_t{24} << 20, 12, 1.15);
  if (real) {
    if (!have_gpu(state)) return;
    cuda::CudaDeviceMemory mem(0);
    replay(state, mem, trace, expandable, pytorch);
  } else {
    allocator::FakeDevice mem(size_t{140} << 30);
    replay(state, mem, trace, expandable, pytorch);
  }
  state.SetLabel(std::string(real ? "H200" : "fake device") + (expandable ? ", expandable segments" : ", segments") +
                 (pytorch ? ", PyTorch policies" : ""));
}
BENCHMARK(BM_TraceGrowingBatch)->ArgsProduct({{0, 1}, {0, 1}, {0, 1}})->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mg::bench

BENCHMARK_MAIN();
