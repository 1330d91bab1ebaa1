// Eager host overhead per op: what memgrad's engine costs around a kernel that does (almost)
// nothing. a + b on one-element tensors
//   - without grad (dispatch, output allocation, kernel launch),
//   - with grad (the same plus recording a tape node),
//   - forward + backward of a chain of adds (the tape's replay cost per op),
//   - the same two timed on the host clock only, up to the last enqueue (*Host: the host's own
//     cost, the sync that drains the queue left out),
//   - the adds captured in a CUDA graph and replayed (what is left without host work),
//   - the parts: an output tensor made and dropped, one enqueue into the stream (event record),
// on the CPU and, when there is a device, on CUDA (the kernel is queued asynchronously; a sync
// closes each timed batch, so a queue that fills up shows as time too). Reported as us per op
// (the "ns_per_op" counter); compare with bench/pytorch/op_overhead.py on the same machine.
//
//   bench_overhead [--benchmark_filter=...] [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <chrono>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/device_runtime.h"
#include "core/tensor.h"

namespace mg::bench {
namespace {

constexpr int kOpsPerIter = 100;  // ops between syncs: enough that one sync is noise

bool require_gpu(benchmark::State& state) {
  if (cuda::is_available()) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

// Argument 0: the CPU; 1: cuda:0 (skipped without one).
bool pick_device(benchmark::State& state, Device* dev) {
  *dev = state.range(0) == 0 ? Device::cpu() : Device::cuda(0);
  return dev->is_cpu() || require_gpu(state);
}

void sync(Device dev) {
  if (dev.is_cuda()) cuda::synchronize(dev.index);
}

// Time per op: the benchmark's time divided by the ops an iteration runs (items = ops).
void report(benchmark::State& state, Device dev) {
  state.SetLabel(dev.is_cuda() ? "cuda" : "cpu");
  state.SetItemsProcessed(state.iterations() * kOpsPerIter);
  state.counters["ns_per_op"] = benchmark::Counter(static_cast<double>(state.iterations()) * kOpsPerIter,
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// c = a + b, 100 times per iteration; with `grad`, a requires grad and each add records a tape
// node (discarded with its output).
void add_loop(benchmark::State& state, bool grad) {
  Device dev;
  if (!pick_device(state, &dev)) return;
  Tensor a = ones({1}, {DType::f32, dev, grad}), b = ones({1}, {DType::f32, dev});
  for (int i = 0; i < kOpsPerIter; ++i) benchmark::DoNotOptimize(add(a, b));  // warm caches
  sync(dev);
  for (auto _ : state) {
    for (int i = 0; i < kOpsPerIter; ++i) benchmark::DoNotOptimize(add(a, b));
    sync(dev);
  }
  report(state, dev);
}
void BM_AddNoGrad(benchmark::State& state) { add_loop(state, false); }
void BM_AddWithGrad(benchmark::State& state) { add_loop(state, true); }

// The host's own cost per op: the same 100 adds timed on the host clock up to the last enqueue,
// the sync that drains them left out (manual time). 100 launches stay far below the stream's
// queue depth, so the device never pushes back; what remains is dispatch, allocation, tape and
// the driver's launch call: the "host microseconds per op" that bound a launch-bound step.
void add_host_loop(benchmark::State& state, bool grad) {
  Device dev;
  if (!pick_device(state, &dev)) return;
  Tensor a = ones({1}, {DType::f32, dev, grad}), b = ones({1}, {DType::f32, dev});
  for (int i = 0; i < kOpsPerIter; ++i) benchmark::DoNotOptimize(add(a, b));
  sync(dev);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kOpsPerIter; ++i) benchmark::DoNotOptimize(add(a, b));
    const auto t1 = std::chrono::steady_clock::now();
    sync(dev);
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  report(state, dev);
}
void BM_AddNoGradHost(benchmark::State& state) { add_host_loop(state, false); }
void BM_AddWithGradHost(benchmark::State& state) { add_host_loop(state, true); }

// x = x + b 100 times, then backward through the chain: forward recording plus the engine's
// walk and one gradient kernel per node, per op.
void BM_AddChainBackward(benchmark::State& state) {
  Device dev;
  if (!pick_device(state, &dev)) return;
  Tensor a = ones({1}, {DType::f32, dev, true}), b = ones({1}, {DType::f32, dev});
  auto run = [&] {
    Tensor x = a;
    for (int i = 0; i < kOpsPerIter; ++i) x = add(x, b);
    x.backward();
    a.set_grad(Tensor());
  };
  run();
  sync(dev);
  for (auto _ : state) {
    run();
    sync(dev);
  }
  report(state, dev);
}

// The parts of an eager op, to see where its time goes: an output tensor made and dropped
// (TensorImpl, caching allocator, category stats), and one enqueue into the stream (an event
// record: the driver's floor for anything queued, a kernel launch included).
void BM_EmptyTensor(benchmark::State& state) {
  Device dev;
  if (!pick_device(state, &dev)) return;
  for (auto _ : state)
    for (int i = 0; i < kOpsPerIter; ++i) benchmark::DoNotOptimize(empty({1}, {DType::f32, dev}));
  report(state, dev);
}

// One kernel through core's raw path (raw::fill_ of a one-element tensor with 1: a device guard,
// the stream lookup, cudaLaunchKernel, the launch check), host clock up to the last enqueue: the
// floor under every eager op's launch, without dispatch, allocation or tape.
void BM_RawFillHost(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const Device dev = Device::cuda(0);
  Tensor t = empty({1}, {DType::f32, dev});
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kOpsPerIter; ++i) raw::fill_(t, 1.0);
    const auto t1 = std::chrono::steady_clock::now();
    sync(dev);
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  report(state, dev);
}

void BM_EventRecord(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const Device dev = Device::cuda(0);
  const cuda::Stream stream = cuda::Stream::current(0);
  cuda::Event ev;
  for (auto _ : state) {
    for (int i = 0; i < kOpsPerIter; ++i) ev.record(stream);
    sync(dev);
  }
  report(state, dev);
}

// The same 100 adds (no grad) captured once into a CUDA graph and replayed: what remains per op
// when the host work is gone (CUDA only).
void BM_AddCaptured(benchmark::State& state) {
  if (!require_gpu(state)) return;
  const Device dev = Device::cuda(0);
  Tensor a = ones({1}, {DType::f32, dev}), b = ones({1}, {DType::f32, dev});
  cuda::Graph graph;
  {
    cuda::Stream side = cuda::Stream::create();
    cuda::StreamGuard on(side);
    graph.capture_begin();
    Tensor x = a;
    for (int i = 0; i < kOpsPerIter; ++i) x = add(x, b);
    graph.capture_end();
  }
  graph.replay();
  sync(dev);
  for (auto _ : state) {
    graph.replay();
    sync(dev);
  }
  report(state, dev);
}

BENCHMARK(BM_AddNoGrad)->Arg(0)->Arg(1)->ArgName("cuda")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddWithGrad)->Arg(0)->Arg(1)->ArgName("cuda")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddNoGradHost)->Arg(0)->Arg(1)->ArgName("cuda")->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddWithGradHost)->Arg(0)->Arg(1)->ArgName("cuda")->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddChainBackward)->Arg(0)->Arg(1)->ArgName("cuda")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddCaptured)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EmptyTensor)->Arg(0)->Arg(1)->ArgName("cuda")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EventRecord)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RawFillHost)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace mg::bench

BENCHMARK_MAIN();
