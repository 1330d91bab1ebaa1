// Activation offload on the device: gradients bitwise those of a run without offload (the
// copies only read), device memory given back once the copies to the host finish, every
// offloaded byte fetched back exactly once, in-place changes still caught, checkpoint regions
// and a GPT with offloaded blocks, and the pinned pool's reuse. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <optional>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/offload.h"
#include "autograd/recompute.h"
#include "core/allocator.h"
#include "core/cuda_memory.h"
#include "core/random.h"
#include "kernels/backend.h"
#include "nn/models/gpt.h"

namespace mg {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const Device kDev = Device::cuda(0);

Tensor param(const Shape& s, uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(s, {DType::f32}, &g).to(kDev);
  t.requires_grad_(true);
  return t;
}

// A chain of `n` layers tanh(x @ w^T): each saves its input (the previous tanh output) and
// its output, 4 MiB each at [1024, 1024] f32, one storage per layer.
struct Chain {
  std::vector<Tensor> ws;
  explicit Chain(int n) {
    for (int i = 0; i < n; ++i) ws.push_back(param({1024, 1024}, 100 + i));
  }
  Tensor operator()(Tensor x) const {
    for (const Tensor& w : ws) x = tanh(linear(x, w));
    return x;
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> g;
    for (const Tensor& w : ws) g.push_back(w.grad().to_vector<float>());
    return g;
  }
  void clear() const {
    for (Tensor w : ws) w.set_grad(Tensor());
  }
};

Tensor input() {
  Generator g(7);
  return randn({1024, 1024}, {DType::f32}, &g).to(kDev);
}

TEST(OffloadCuda, GradientsBitwiseAndEveryByteFetchedOnce) {
  SKIP_WITHOUT_CUDA();
  Chain net(6);
  const Tensor x = input();
  sum(net(x)).backward();
  const auto want = net.grads();
  net.clear();

  reset_offload_stats();
  Tensor loss;
  {
    OffloadScope offload;
    loss = sum(net(x));
  }
  cuda::synchronize();  // every copy to the host has finished: backward must fetch them all
  loss.backward();
  const OffloadStats s = offload_stats();
  // Six layers: the chain's input (4 MiB) and six tanh outputs, saved once each (linear saves
  // its input, tanh its output: the same storage, copied once); the weights stay.
  EXPECT_EQ(s.offloaded_bytes, 7 * (int64_t{4} << 20));
  EXPECT_EQ(s.fetched_bytes, s.offloaded_bytes);
  EXPECT_EQ(s.used_in_place, 0);
  EXPECT_EQ(s.device_bytes, 0);
  EXPECT_EQ(net.grads(), want);
}

TEST(OffloadCuda, BackwardRightAfterForwardIsBitwiseToo) {
  SKIP_WITHOUT_CUDA();
  // No synchronization: backward may find copies still in flight (used from the device) or
  // done (fetched); either way the gradient is the same.
  Chain net(4);
  const Tensor x = input();
  sum(net(x)).backward();
  const auto want = net.grads();
  for (int rep = 0; rep < 3; ++rep) {
    net.clear();
    Tensor loss;
    {
      OffloadScope offload(OffloadOptions{.prefetch_bytes = 0});
      loss = sum(net(x));
    }
    loss.backward();
    EXPECT_EQ(net.grads(), want) << "repetition " << rep;
  }
}

TEST(OffloadCuda, DeviceMemoryIsGivenBackWhenTheCopiesFinish) {
  SKIP_WITHOUT_CUDA();
  Chain net(8);
  const Tensor x = input();
  cuda::synchronize();
  const int64_t base = memory_allocated(kDev);
  Tensor kept_loss = sum(net(x));
  const int64_t plain = memory_allocated(kDev) - base;
  kept_loss = Tensor();
  net.clear();

  Tensor loss;
  {
    OffloadScope offload;
    loss = sum(net(x));
  }
  offload_wait();  // the copies out have finished and their device memory is back
  const int64_t offloaded = memory_allocated(kDev) - base;
  // The plain forward keeps nine 4 MiB activations (the input is the caller's); offloaded, only
  // the last output stays (the graph's own reference to it until sum's backward) plus the loss.
  EXPECT_GE(plain, 8 * (int64_t{4} << 20));
  EXPECT_LE(offloaded, plain - 7 * (int64_t{4} << 20)) << "plain " << plain << " offloaded " << offloaded;
  EXPECT_EQ(offload_stats().device_bytes, 0);
  loss.backward();
}

TEST(OffloadCuda, InPlaceChangeOfAnOffloadedTensorIsStillAnError) {
  SKIP_WITHOUT_CUDA();
  Tensor w = param({1024, 1024}, 1);
  Tensor h, loss;
  {
    OffloadScope offload;
    h = tanh(linear(input(), w));  // tanh saves h
    loss = sum(mul(h, h));
  }
  add_(h, 1.0);
  try {
    loss.backward();
    FAIL() << "expected mg::AutogradError";
  } catch (const AutogradError& e) {
    EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos) << e.what();
  }
}

TEST(OffloadCuda, AStorageWrittenBetweenTwoSavesIsCopiedAgain) {
  SKIP_WITHOUT_CUDA();
  // linear saves t, t changes in place, linear saves it again: the second save must not reuse
  // the first copy. Only the second graph is backpropagated (the first would rightly refuse).
  Tensor w1 = param({1024, 1024}, 1), w2 = param({1024, 1024}, 2);
  auto run = [&](bool offload) {
    Tensor t = input();
    std::optional<OffloadScope> scope;
    if (offload) scope.emplace();
    Tensor y1 = linear(t, w1);
    add_(t, 1.0);
    Tensor y2 = linear(t, w2);
    scope.reset();
    cuda::synchronize();
    sum(y2).backward();
    std::vector<float> g = w2.grad().to_vector<float>();
    w2.set_grad(Tensor());
    return g;
  };
  const auto want = run(false);
  reset_offload_stats();
  EXPECT_EQ(run(true), want);
  EXPECT_EQ(offload_stats().offloaded_bytes, 2 * (int64_t{4} << 20));
}

TEST(OffloadCuda, CheckpointRegionsInsideAScope) {
  SKIP_WITHOUT_CUDA();
  Chain net(4);
  const Tensor x = input();
  auto run = [&] {
    Tensor h = checkpoint([&](const Tensor& in) { return tanh(linear(in, net.ws[0])); }, x);
    for (size_t i = 1; i < net.ws.size(); ++i) h = tanh(linear(h, net.ws[i]));
    return sum(h);
  };
  run().backward();
  const auto want = net.grads();
  net.clear();
  Tensor loss;
  {
    OffloadScope offload;
    loss = run();
  }
  cuda::synchronize();
  loss.backward();
  EXPECT_EQ(net.grads(), want);
}

TEST(OffloadCuda, GptWithOffloadedBlocksBitwise) {
  SKIP_WITHOUT_CUDA();
  nn::GPTConfig cfg{.vocab_size = 512, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};
  manual_seed(5);
  nn::GPT model(cfg, TensorOptions(DType::f32, kDev));
  // One sequence of distinct tokens: the embeddings' backward adds each row once, so a plain
  // run repeats itself bitwise (repeated tokens or batch rows would be summed by atomics, in
  // an order that changes from run to run). Checked below before comparing. The attention
  // backward's one pass sums dq by atomics too: deterministic kernels for this test.
  const bool det_was = kernels::deterministic();
  kernels::set_deterministic(true);
  struct Restore {
    bool was;
    ~Restore() { kernels::set_deterministic(was); }
  } restore{det_was};
  const Tensor idx = arange(0.0, 256.0, 1.0, TensorOptions(DType::i64, kDev)).reshape({1, 256});
  const Tensor tgt = arange(1.0, 257.0, 1.0, TensorOptions(DType::i64, kDev)).reshape({1, 256});
  auto grads = [&] {
    std::vector<std::vector<float>> out;
    for (const Tensor& p : model.parameters()) out.push_back(p.grad().to_vector<float>());
    return out;
  };
  model.zero_grad();
  model.forward_loss(idx, tgt).backward();
  const auto want = grads();
  model.zero_grad();
  model.forward_loss(idx, tgt).backward();
  ASSERT_EQ(grads(), want) << "two plain runs differ: the comparison below would mean nothing";
  for (int64_t blocks : {1, 4}) {
    model.zero_grad();
    model.recompute.offload_blocks = blocks;
    model.recompute.offload.min_bytes = 0;
    reset_offload_stats();
    model.forward_loss(idx, tgt).backward();
    EXPECT_GT(offload_stats().offloaded_bytes, 0) << blocks << " blocks";
    EXPECT_EQ(grads(), want) << blocks << " blocks offloaded";
  }
}

TEST(OffloadCuda, PinnedPoolReusesBlocksAfterTheirWork) {
  SKIP_WITHOUT_CUDA();
  cuda::synchronize();
  cuda::empty_pinned_cache();  // earlier tests left 4 MiB blocks: start from none cached
  const cuda::PinnedPoolStats before = cuda::pinned_pool_stats();
  EXPECT_EQ(before.cached_bytes, 0);
  void* first = nullptr;
  {
    cuda::PinnedBlock b = cuda::PinnedBlock::allocate(3 << 20);
    EXPECT_EQ(b.size(), size_t{4} << 20);  // rounded to 2 MiB
    first = b.data();
    b.record(cuda::Stream::current());
  }
  cuda::synchronize();
  cuda::PinnedBlock again = cuda::PinnedBlock::allocate((3 << 20) + 100);
  EXPECT_EQ(again.data(), first);
  const cuda::PinnedPoolStats after = cuda::pinned_pool_stats();
  EXPECT_EQ(after.reuses, before.reuses + 1);
  EXPECT_EQ(after.host_allocs, before.host_allocs + 1);
  EXPECT_GE(after.in_use_bytes, int64_t{4} << 20);
}

TEST(OffloadCuda, HostLinkIsMeasuredEachWay) {
  SKIP_WITHOUT_CUDA();
  const HostLink link = measure_host_link(kDev, int64_t{16} << 20, 3);
  // 1 GB/s (1e6 bytes per ms) is far below any x16 host link a CUDA device sits on (PCIe 1.0
  // carries 4 GB/s): a lower reading means the copies were not timed as copies.
  EXPECT_GT(link.to_host_bytes_per_ms, 1e6);
  EXPECT_GT(link.to_device_bytes_per_ms, 1e6);
  EXPECT_THROW(measure_host_link(kDev, 0), ValueError);
}

}  // namespace
}  // namespace mg
