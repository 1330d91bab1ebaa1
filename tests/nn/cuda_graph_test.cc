// CUDA graphs on the device (skipped without one): a captured training step gives bitwise the
// parameters eager training gives, replays leak nothing, and what a graph cannot hold is a
// clear error. The pool logic itself is tested on FakeDevice (caching_allocator_pool_test).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "autograd/functions.h"
#include "core/captured_step.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "nn/nn.h"
#include "optim/sgd.h"

namespace mg {
namespace {

#define REQUIRE_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine"

const Device kGpu = Device::cuda(0);

std::shared_ptr<nn::Sequential> mlp() {
  manual_seed(7);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(32, 64, true, TensorOptions(DType::f32, kGpu)));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(64, 10, true, TensorOptions(DType::f32, kGpu)));
  return m;
}

struct Batch {
  Tensor x, y;
};

std::vector<Batch> batches(int n) {
  Generator gen(11);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    Tensor x = raw::to_device(randn({16, 32}, TensorOptions(DType::f32), &gen), kGpu);
    Tensor y = raw::to_device(raw::to_dtype(rand({16}, TensorOptions(DType::f32), &gen) * 9.99, DType::i64), kGpu);
    out.push_back({x, y});
  }
  return out;
}

void sgd_step(nn::Module& m, optim::SGD& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = cross_entropy(m.forward(x), y);
  loss.backward();
  opt.step();
}

// Bitwise equality of two models' parameters, after the device is done with both.
void expect_same_parameters(nn::Module& eager, nn::Module& graphed) {
  cuda::synchronize();
  auto pe = eager.parameters(), pg = graphed.parameters();
  ASSERT_EQ(pe.size(), pg.size());
  for (size_t i = 0; i < pe.size(); ++i)
    EXPECT_EQ(raw::to_device(pe[i], Device::cpu()).to_vector<float>(),
              raw::to_device(pg[i], Device::cpu()).to_vector<float>())
        << "parameter " << i;
}

// Eager and captured training see the same batches in the same order; the captured model's
// first 3 steps are CapturedStep's warm-up, the capture itself does not run, and every later
// batch is one replay. Same kernels, same launch shapes: the parameters must be equal bit for bit.
TEST(CudaGraph, CapturedTrainingMatchesEagerBitwise) {
  REQUIRE_GPU();
  const auto data = batches(10);
  auto eager = mlp();
  optim::SGD eager_opt(eager->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (const auto& b : data) sgd_step(*eager, eager_opt, b.x, b.y);

  auto graphed = mlp();
  optim::SGD graphed_opt(graphed->parameters(), {.lr = 0.05, .momentum = 0.9});
  Tensor sx = empty({16, 32}, {DType::f32, kGpu}), sy = empty({16}, {DType::i64, kGpu});
  size_t next = 0;
  // Warm-up reads the static inputs too: give each warm-up call its own batch.
  auto step = [&] {
    if (!cuda::is_capturing()) {
      raw::copy_(sx, data[next].x);
      raw::copy_(sy, data[next].y);
      ++next;
    }
    sgd_step(*graphed, graphed_opt, sx, sy);
  };
  CapturedStep captured(step, /*warmup=*/3);
  ASSERT_EQ(next, 3u);
  for (; next < data.size(); ++next) {
    raw::copy_(sx, data[next].x);
    raw::copy_(sy, data[next].y);
    captured.replay();
  }
  expect_same_parameters(*eager, *graphed);
}

// The last, smaller batch goes through a second graph that shares the first one's memory pool
// (graphs replayed one after another may): still bitwise equal to eager training.
TEST(CudaGraph, SmallerLastBatchThroughASecondGraphSharingThePool) {
  REQUIRE_GPU();
  const auto data = batches(4);
  Generator gen(5);
  const Batch last{raw::to_device(randn({8, 32}, TensorOptions(DType::f32), &gen), kGpu),
                   raw::to_device(raw::to_dtype(rand({8}, TensorOptions(DType::f32), &gen) * 9.99, DType::i64), kGpu)};
  auto eager = mlp();
  optim::SGD eager_opt(eager->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (const auto& b : data) sgd_step(*eager, eager_opt, b.x, b.y);
  sgd_step(*eager, eager_opt, last.x, last.y);

  auto graphed = mlp();
  optim::SGD opt(graphed->parameters(), {.lr = 0.05, .momentum = 0.9});
  Tensor sx = empty({16, 32}, {DType::f32, kGpu}), sy = empty({16}, {DType::i64, kGpu});
  Tensor lx = empty({8, 32}, {DType::f32, kGpu}), ly = empty({8}, {DType::i64, kGpu});
  raw::copy_(sx, data[0].x);
  raw::copy_(sy, data[0].y);
  CapturedStep full([&] { sgd_step(*graphed, opt, sx, sy); }, /*warmup=*/1);  // trains on batch 0
  for (size_t i = 1; i < data.size(); ++i) {
    raw::copy_(sx, data[i].x);
    raw::copy_(sy, data[i].y);
    full.replay();
  }
  CapturedStep tail([&] { sgd_step(*graphed, opt, lx, ly); }, /*warmup=*/0, &full);
  EXPECT_EQ(tail.graph().pool_id(), full.graph().pool_id());
  raw::copy_(lx, last.x);
  raw::copy_(ly, last.y);
  tail.replay();
  expect_same_parameters(*eager, *graphed);
}

// 1,000 replays allocate nothing: the graph's memory was fixed at capture.
TEST(CudaGraph, ThousandReplaysLeakNothing) {
  REQUIRE_GPU();
  auto m = mlp();
  optim::SGD opt(m->parameters(), {.lr = 0.01});
  const auto data = batches(1);
  Tensor sx = data[0].x, sy = data[0].y;
  CapturedStep captured([&] { sgd_step(*m, opt, sx, sy); }, 2);
  captured.replay();
  cuda::synchronize();
  const int64_t allocated = memory_allocated(kGpu), reserved = memory_reserved(kGpu);
  for (int i = 0; i < 1000; ++i) captured.replay();
  cuda::synchronize();
  EXPECT_EQ(memory_allocated(kGpu), allocated);
  EXPECT_EQ(memory_reserved(kGpu), reserved);
  EXPECT_EQ(memory_stats(kGpu).at("graph_pools"), 1);
  EXPECT_GT(memory_stats(kGpu).at("graph_pool_reserved_bytes"), 0);
}

TEST(CudaGraph, WhatAGraphCannotHoldIsAClearError) {
  REQUIRE_GPU();
  cuda::Graph g;
  // The legacy default stream cannot be captured.
  EXPECT_THROW(g.capture_begin(), ValueError);
  cuda::Stream side = cuda::Stream::create();
  Tensor x = ones({4}, {DType::f32, kGpu});
  {
    cuda::StreamGuard on(side);
    g.capture_begin();
    EXPECT_TRUE(cuda::is_capturing());
    EXPECT_THROW(sum(x).item(), DeviceError);  // a host read inside the capture
    EXPECT_THROW(g.capture_begin(), ValueError);
    g.capture_end();
  }
  EXPECT_TRUE(g.captured());
  EXPECT_FALSE(cuda::is_capturing());
  g.replay();
  g.reset();
  EXPECT_FALSE(g.captured());
  EXPECT_THROW(g.replay(), ValueError);
}

}  // namespace
}  // namespace mg
