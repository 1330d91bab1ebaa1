// CUDA graphs on the device (skipped without one): a captured training step gives bitwise the
// parameters eager training gives, replays leak nothing, and what a graph cannot hold is a
// clear error. The pool logic itself is tested on FakeDevice (caching_allocator_pool_test).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "autograd/functions.h"
#include "core/captured_step.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "nn/nn.h"
#include "core/autocast.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
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

// Static inputs fed batch by batch: an eager call (warm-up) loads the next batch itself, the
// capture loads none, and every later batch is copied in before one replay.
struct StaticFeed {
  const std::vector<Batch>& data;
  Tensor x = empty({16, 32}, {DType::f32, kGpu}), y = empty({16}, {DType::i64, kGpu});
  size_t next = 0;
  bool load() {
    if (cuda::is_capturing()) return false;
    raw::copy_(x, data[next].x);
    raw::copy_(y, data[next].y);
    return true;
  }
  void replay_rest(CapturedStep& captured, const std::function<void()>& after = {}) {
    for (; next < data.size(); ++next) {
      load();
      captured.replay();
      if (after) after();
    }
  }
};

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
  StaticFeed feed{data};
  // Warm-up reads the static inputs too: give each warm-up call its own batch.
  auto step = [&] {
    if (feed.load()) ++feed.next;
    sgd_step(*graphed, graphed_opt, feed.x, feed.y);
  };
  CapturedStep captured(step, /*warmup=*/3);
  ASSERT_EQ(feed.next, 3u);
  feed.replay_rest(captured);
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

// The mixed-precision step a user would capture: dropout, f16 autocast, a capturable GradScaler
// and AdamW, device-side clipping and a per-step scheduler. Eager training with the same
// objects and the captured one see the same batches (one of them overflows f16, so its step is
// skipped on the device) and the same random offsets: bitwise the same parameters, scale and
// skip count.
struct AmpRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::GradScaler> scaler;
  std::unique_ptr<optim::StepLR> sched;
  AmpRun() {
    manual_seed(7);
    model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(32, 64, true, TensorOptions(DType::f32, kGpu)));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Dropout>(0.25));
    model->push_back(std::make_shared<nn::Linear>(64, 10, true, TensorOptions(DType::f32, kGpu)));
    optim::AdamWOptions o;
    o.lr = 3e-3;
    o.capturable = true;
    opt = std::make_unique<optim::AdamW>(model->parameters(), o);
    scaler = std::make_unique<optim::GradScaler>(
        optim::GradScalerOptions{.init_scale = 4096.0, .growth_interval = 3, .capturable = true});
    sched = std::make_unique<optim::StepLR>(*opt, 4, 0.5);
    manual_seed(99);  // the dropout masks' stream, the same for both runs
  }
  void step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    Tensor loss;
    {
      Autocast ac(DeviceType::CUDA, DType::f16);
      loss = cross_entropy(model->forward(x), y);
    }
    scaler->scale(loss).backward();
    scaler->unscale_(*opt);
    optim::clip_grad_norm_on_device_(model->parameters(), 1.0);
    scaler->step(*opt);
    scaler->update();
  }
};

std::vector<Batch> amp_batches(int n, int overflow_at) {
  auto data = batches(n);
  // 6e4 * 16-ish activations overflow f16 (max 65504): that step's gradients are inf/NaN.
  data[overflow_at].x = data[overflow_at].x * 6e4;
  return data;
}

TEST(CudaGraph, CapturedAmpStepWithDropoutMatchesEagerBitwise) {
  REQUIRE_GPU();
  const auto data = amp_batches(12, 6);
  AmpRun eager;
  for (const auto& b : data) {
    eager.step(b.x, b.y);
    eager.sched->step();
  }
  cuda::synchronize();
  const uint64_t eager_offset = default_generator().get_state().offset;
  AmpRun graphed;
  StaticFeed feed{data};
  auto step = [&] {
    const bool eager_call = feed.load();
    graphed.step(feed.x, feed.y);
    if (eager_call) {
      ++feed.next;
      graphed.sched->step();
    }
  };
  CapturedStep captured(step, /*warmup=*/2);
  ASSERT_EQ(feed.next, 2u);
  // The scheduler writes the next lr into device memory for the next replay.
  feed.replay_rest(captured, [&] { graphed.sched->step(); });
  expect_same_parameters(*eager.model, *graphed.model);
  EXPECT_EQ(graphed.scaler->skipped_steps(), 1);
  EXPECT_EQ(eager.scaler->skipped_steps(), 1);
  EXPECT_EQ(graphed.scaler->get_scale(), eager.scaler->get_scale());
  EXPECT_EQ(graphed.opt->state(graphed.model->parameters()[0])->step_value(), 11);  // 12 steps, one skipped
  EXPECT_EQ(default_generator().get_state().offset, eager_offset);  // each replay reserved its masks' numbers
}

// Each replay draws fresh random numbers: the ones eager draws would give at that point.
TEST(CudaGraph, RandomFillsDrawFreshNumbersEachReplay) {
  REQUIRE_GPU();
  Generator eager_gen(42), graph_gen(42);
  std::vector<std::vector<float>> eager;
  for (int i = 0; i < 4; ++i) {
    Tensor t = empty({1000}, {DType::f32, kGpu});
    normal_(t, 0.0, 1.0, &eager_gen);
    Tensor u = empty({333}, {DType::f32, kGpu});
    bernoulli_(u, 0.3, &eager_gen);
    std::vector<float> v = raw::to_device(t, Device::cpu()).to_vector<float>();
    auto w = raw::to_device(u, Device::cpu()).to_vector<float>();
    v.insert(v.end(), w.begin(), w.end());
    eager.push_back(v);
  }
  Tensor t = empty({1000}, {DType::f32, kGpu}), u = empty({333}, {DType::f32, kGpu});
  cuda::Graph g;
  cuda::Stream side = cuda::Stream::create();
  {
    cuda::StreamGuard on(side);
    g.capture_begin();
    normal_(t, 0.0, 1.0, &graph_gen);
    bernoulli_(u, 0.3, &graph_gen);
    g.capture_end();
  }
  EXPECT_EQ(graph_gen.get_state().offset, 0u);  // the capture itself draws nothing
  for (int i = 0; i < 4; ++i) {
    g.replay();
    std::vector<float> v = raw::to_device(t, Device::cpu()).to_vector<float>();
    auto w = raw::to_device(u, Device::cpu()).to_vector<float>();
    v.insert(v.end(), w.begin(), w.end());
    EXPECT_EQ(v, eager[i]) << "replay " << i;
  }
  EXPECT_EQ(graph_gen.get_state().offset, eager_gen.get_state().offset);
  graph_gen.manual_seed(1);
  EXPECT_THROW(g.replay(), ValueError);  // reseeded since the capture
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
    // Host-reading training calls name their capturable counterparts.
    Tensor w = ones({4}, {DType::f32, kGpu});
    w.requires_grad_();
    w.set_grad(ones({4}, {DType::f32, kGpu}));
    EXPECT_THROW(optim::clip_grad_norm_({w}, 1.0), ValueError);
    optim::SGD plain({w}, {.lr = 0.1});
    optim::GradScaler host_scaler;
    EXPECT_THROW(host_scaler.step(plain), ValueError);
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
