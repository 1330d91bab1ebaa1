// Autocast: the op policy (low precision for the matmul family, f32 for softmax / norms /
// losses / reductions / exp-log-pow, promotion for mixed dtypes), the weight-cast cache,
// nesting / disabling / thread locality, gradients in the forward's dtype, and the
// large-logit softmax case. CPU cases use bf16; CUDA cases (f16 and bf16) skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "autograd/autocast_policy.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "kernels/ops.h"

namespace mg {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!mg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// max |a - b| / max(1, max |b|), both read as f64 on the host.
double rel_err(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  EXPECT_EQ(va.size(), vb.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return diff / scale;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.to_vector<double>() == b.to_vector<double>();
}

Tensor leaf(const Shape& s, Device d, Generator& g, double scale = 1.0) {
  Tensor t = kernels::mul_scalar(randn(s, {DType::f32, d}, &g), scale);
  t.requires_grad_();
  return t;
}

// A linear's weight gradient under autocast is written in f32 by the weight-gradient GEMM (the
// cast's "to" node takes f32 as it is): bitwise kernels::linear_weight_grads(g, x_lp, f32), within
// f32 accumulation of the f64 product of the same lp operands, and not rounded to lp on the way
// (the cast back from lp made every element an lp value). On CUDA the bias gradient is the column
// reduction's f32 sum (bitwise the kernel's too); on the CPU it is a row sum in lp, widened, so only its dtype is
// checked there.
void check_f32_weight_grads(Device d, DType lp) {
  Generator g(21);
  const int64_t rows = 64;
  Tensor x = leaf({rows, 32}, d, g), w = leaf({24, 32}, d, g, 0.2), b = leaf({24}, d, g);
  Tensor c = randn({rows, 24}, {DType::f32, d}, &g).to(lp);  // sum(y * c): dL/dy is c exactly
  {
    Autocast ac(d.type, lp);
    sum(linear(x, w, b) * c).backward();
  }
  const Tensor xl = x.detach().to(lp);
  auto [rw, rb] = kernels::linear_weight_grads(c, xl, true, DType::f32);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  ASSERT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_TRUE(bitwise_equal(w.grad(), rw));
  if (d.is_cuda()) {
    EXPECT_TRUE(bitwise_equal(b.grad(), rb));
  }
  EXPECT_FALSE(bitwise_equal(w.grad(), w.grad().to(lp).to(DType::f32)));
  // f32 sums of `rows` products: at most about rows * 2^-24 of the largest magnitude off.
  Tensor ref = kernels::matmul(c.to(DType::f64).to(Device::cpu()).t(), xl.to(DType::f64).to(Device::cpu()));
  EXPECT_LT(rel_err(w.grad().to(Device::cpu()), ref), rows * std::ldexp(1.0, -24));
}

// Every op family's output dtype inside a region on `dev` with low-precision dtype `lp`.
void check_policy(Device dev, DType lp) {
  Generator g(1);
  Tensor x = leaf({4, 8}, dev, g), w = leaf({6, 8}, dev, g), b = leaf({6}, dev, g);
  Tensor img = leaf({2, 3, 6, 6}, dev, g), cw = leaf({4, 3, 3, 3}, dev, g);
  Tensor target = from_vector<int64_t>({0, 1, 2, 5}, {4}).to(dev);
  Autocast ac(dev.type, lp);
  // Low precision: matmul, bmm, linear, conv2d, attention.
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), lp);
  EXPECT_EQ(matmul(x, w.t()).dtype(), lp);
  EXPECT_EQ(bmm(x.unsqueeze(0), w.t().unsqueeze(0)).dtype(), lp);
  EXPECT_EQ(conv2d(img, cw).dtype(), lp);
  Tensor q = leaf({1, 2, 5, 8}, dev, g);
  EXPECT_EQ(scaled_dot_product_attention(q, q, q, true).dtype(), lp);
  // f32: softmax family, losses, reductions, exp/log/pow, norms.
  EXPECT_EQ(softmax(y, -1).dtype(), DType::f32);
  EXPECT_EQ(log_softmax(y, -1).dtype(), DType::f32);
  EXPECT_EQ(cross_entropy(y, target).dtype(), DType::f32);
  EXPECT_EQ(nll_loss(y, target).dtype(), DType::f32);
  EXPECT_EQ(mse_loss(y, y.detach()).dtype(), DType::f32);
  EXPECT_EQ(sum(y).dtype(), DType::f32);
  EXPECT_EQ(mean(y, {1}).dtype(), DType::f32);
  EXPECT_EQ(var(y, {1}).dtype(), DType::f32);
  EXPECT_EQ(exp(y).dtype(), DType::f32);
  EXPECT_EQ(log(abs(y) + 1.0).dtype(), DType::f32);
  EXPECT_EQ(pow(y, 2.0).dtype(), DType::f32);
  EXPECT_EQ(layer_norm(y, {6}).dtype(), DType::f32);
  // Ops outside both lists keep their input dtype; mixed inputs promote to the widest.
  EXPECT_EQ(relu(y).dtype(), lp);
  EXPECT_EQ(add(y, b).dtype(), DType::f32);
  EXPECT_EQ(cat({y, b.unsqueeze(0)}, 0).dtype(), DType::f32);
  // An explicit cast is never overridden, and f64 is left alone.
  EXPECT_EQ(y.to(DType::f32).dtype(), DType::f32);
  if (!dev.is_cuda()) {
    Tensor x64 = randn({3, 3}, {DType::f64, dev}, &g);
    EXPECT_EQ(matmul(x64, x64).dtype(), DType::f64);
  }
}

TEST(Autocast, PolicyPerOpCpuBf16) { check_policy(Device::cpu(), DType::bf16); }

TEST(Autocast, OutsideARegionNothingIsCast) {
  Generator g(2);
  Tensor x = leaf({4, 8}, Device::cpu(), g), w = leaf({6, 8}, Device::cpu(), g);
  EXPECT_EQ(linear(x, w).dtype(), DType::f32);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    EXPECT_EQ(linear(x, w).dtype(), DType::bf16);
    // CUDA autocast is a separate switch: enabling CPU leaves it off.
    EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
  }
  EXPECT_EQ(linear(x, w).dtype(), DType::f32);
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CPU));
}

TEST(Autocast, NestedAndDisabledRegions) {
  Generator g(3);
  Tensor x = leaf({4, 8}, Device::cpu(), g), w = leaf({6, 8}, Device::cpu(), g);
  Autocast outer(DeviceType::CPU, DType::bf16);
  {
    Autocast off(DeviceType::CPU, DType::bf16, /*enabled=*/false);
    EXPECT_EQ(linear(x, w).dtype(), DType::f32);
    {
      Autocast inner(DeviceType::CPU, DType::bf16);
      EXPECT_EQ(linear(x, w).dtype(), DType::bf16);
    }
    EXPECT_EQ(linear(x, w).dtype(), DType::f32);
  }
  EXPECT_EQ(linear(x, w).dtype(), DType::bf16);
  EXPECT_EQ(autocast_state().nesting, 1);
}

TEST(Autocast, StateIsThreadLocal) {
  Autocast ac(DeviceType::CPU, DType::bf16);
  bool other_enabled = true;
  std::thread t([&] { other_enabled = is_autocast_enabled(DeviceType::CPU); });
  t.join();
  EXPECT_TRUE(is_autocast_enabled(DeviceType::CPU));
  EXPECT_FALSE(other_enabled);
}

TEST(Autocast, UnsupportedDtypeIsAValueError) {
  EXPECT_THROW({ Autocast a(DeviceType::CPU, DType::f16); }, ValueError);
  EXPECT_THROW({ Autocast a(DeviceType::CUDA, DType::f32); }, ValueError);
  try {
    Autocast a(DeviceType::CUDA, DType::f64);
    ADD_FAILURE() << "no error for f64";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
  }
  // A failed guard leaves the state untouched.
  EXPECT_FALSE(is_autocast_enabled(DeviceType::CUDA));
}

TEST(Autocast, WeightCastIsCachedForTheRegion) {
  Generator g(4);
  Tensor x = leaf({4, 8}, Device::cpu(), g), w = leaf({6, 8}, Device::cpu(), g);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Tensor c1 = autocast::lower(w), c2 = autocast::lower(w);
    EXPECT_TRUE(c1.is_same(c2));
    EXPECT_EQ(autocast::cache_size(), 1u);
    // Activations (non-leaves) are not cached.
    Tensor h = relu(x * 2.0);
    EXPECT_FALSE(autocast::lower(h).is_same(autocast::lower(h)));
    EXPECT_EQ(autocast::cache_size(), 1u);
    // A weight changed in place gets a fresh cast.
    {
      NoGradGuard ng;
      kernels::axpby_(w, 1.0, w, 1.0);
      w.bump_version();
    }
    Tensor c3 = autocast::lower(w);
    EXPECT_FALSE(c3.is_same(c1));
    EXPECT_EQ(c3.to_vector<double>(), w.to(DType::bf16).to_vector<double>());
  }
  EXPECT_EQ(autocast::cache_size(), 0u);
  // A checkpoint replay enters the forward's state with set_autocast_state and restores the
  // caller's: the casts it made must not outlive it.
  const AutocastState outside = autocast_state();
  AutocastState replay = outside;
  replay.cpu_enabled = true;
  replay.nesting = 1;
  set_autocast_state(replay);
  autocast::lower(w);
  EXPECT_EQ(autocast::cache_size(), 1u);
  set_autocast_state(outside);
  EXPECT_EQ(autocast::cache_size(), 0u);
}

// A new region casts the weights the previous one cast in one multi-tensor launch, at its first
// cast: both are cached before their ops run, equal bitwise to their own casts, with the edge a
// fresh cast gets (the gradients are bitwise the first region's); a weight changed between
// regions is cast from its new value. The input is data (no grad): never cached, never batched.
TEST(Autocast, NextRegionCastsThePreviousRegionsWeightsAtOnce) {
  Generator g(7);
  Tensor x = randn({4, 8}, {DType::f32}, &g);
  Tensor w1 = leaf({6, 8}, Device::cpu(), g), w2 = leaf({3, 6}, Device::cpu(), g);
  auto step = [&] {
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Autocast ac(DeviceType::CPU, DType::bf16);
    sum(linear(linear(x, w1), w2)).backward();
    return std::vector<Tensor>{w1.grad(), w2.grad()};
  };
  const std::vector<Tensor> first = step();
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Tensor c2 = autocast::lower(w2);
    EXPECT_EQ(autocast::cache_size(), 2u);  // w1 came along
    EXPECT_TRUE(bitwise_equal(c2, w2.to(DType::bf16)));
    EXPECT_TRUE(autograd::grad_fn(c2) != nullptr);
  }
  const std::vector<Tensor> second = step();
  EXPECT_TRUE(bitwise_equal(second[0], first[0]));
  EXPECT_TRUE(bitwise_equal(second[1], first[1]));
  {
    NoGradGuard ng;
    add_(w1, 0.5);
  }
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    autocast::lower(w2);  // the region's first cast: w1 is cast along with it, after the change
    EXPECT_TRUE(bitwise_equal(autocast::lower(w1), w1.to(DType::bf16)));
  }
  // Only weights a region used are cast ahead in the next: a region that casts w2 alone leaves
  // w1 out of the one after it.
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    autocast::lower(w2);
    EXPECT_EQ(autocast::cache_size(), 2u);  // the previous region used both
  }
  Autocast ac(DeviceType::CPU, DType::bf16);
  autocast::lower(w2);
  EXPECT_EQ(autocast::cache_size(), 1u);
}

// cache_enabled == false: each use of a weight casts it anew and nothing is cached (nor cast
// ahead of the next region), a nested guard keeps the outermost
// one's choice, and the forward and the gradients are bitwise the cached region's (the same casts, the same GEMMs).
TEST(Autocast, WithoutTheCacheEachUseCastsAndGradientsAreTheSame) {
  Generator g(9);
  Tensor x = randn({4, 8}, {DType::f32}, &g);
  Tensor w1 = leaf({6, 8}, Device::cpu(), g), w2 = leaf({3, 6}, Device::cpu(), g);
  auto step = [&](bool cache) {
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Autocast ac(DeviceType::CPU, DType::bf16, true, cache);
    Tensor y = linear(linear(x, w1), w2);
    EXPECT_EQ(autocast::cache_size(), cache ? 2u : 0u);
    sum(y).backward();
    return std::vector<Tensor>{y.detach(), w1.grad(), w2.grad()};
  };
  const std::vector<Tensor> cached = step(true);
  const std::vector<Tensor> uncached = step(false);
  ASSERT_EQ(cached.size(), uncached.size());
  for (size_t i = 0; i < cached.size(); ++i) EXPECT_TRUE(bitwise_equal(uncached[i], cached[i])) << i;
  EXPECT_EQ(uncached[1].dtype(), DType::f32);
  {
    Autocast ac(DeviceType::CPU, DType::bf16, true, false);
    Tensor c1 = autocast::lower(w1), c2 = autocast::lower(w1);
    EXPECT_FALSE(c1.is_same(c2));
    EXPECT_TRUE(bitwise_equal(c1, w1.to(DType::bf16)));
    {
      Autocast inner(DeviceType::CPU, DType::bf16);  // cache_enabled's default: the outer region's choice holds
      EXPECT_FALSE(autocast_state().cache_weight_casts);
      autocast::lower(w2);
    }
    EXPECT_EQ(autocast::cache_size(), 0u);
    // The cached step's weights are no longer cast ahead of the next region (nor written for it
    // by an optimizer's update).
    EXPECT_TRUE(autocast::weights_cast_next_region().empty());
  }
  EXPECT_TRUE(autocast_state().cache_weight_casts);
}

// The gradient through an autocast matmul is exactly the gradient of the explicitly cast
// computation: backward ran in bf16, and the f32 weight received it as f32.
TEST(Autocast, BackwardRunsInTheForwardDtype) {
  Generator g(5);
  Tensor x = leaf({5, 8}, Device::cpu(), g), w = leaf({3, 8}, Device::cpu(), g);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Tensor y = linear(x, w);
    EXPECT_EQ(y.dtype(), DType::bf16);
    sum(y * y).backward();
  }
  Tensor gx = x.grad(), gw = w.grad();
  ASSERT_TRUE(gx.defined() && gw.defined());
  EXPECT_EQ(gw.dtype(), DType::f32);
  x.set_grad(Tensor());
  w.set_grad(Tensor());
  Tensor y = linear(x.to(DType::bf16), w.to(DType::bf16));
  sum((y * y).to(DType::f32)).backward();
  EXPECT_TRUE(bitwise_equal(gx, x.grad()));
  EXPECT_TRUE(bitwise_equal(gw, w.grad()));
  // And it is close to the f32 gradient (bf16 has 8 bits of mantissa).
  x.set_grad(Tensor());
  w.set_grad(Tensor());
  Tensor y32 = linear(x, w);
  sum(y32 * y32).backward();
  EXPECT_LT(rel_err(gw, w.grad()), 3e-2);
}

TEST(Autocast, WeightGradientsComeInF32FromTheGemm) { check_f32_weight_grads(Device::cpu(), DType::bf16); }

// A weight cast used twice: one use hands its node an f32 gradient (a linear), the other an lp
// one (a matmul): the engine sums them in f32, and grad() asked for the cast itself returns the
// cast's own dtype.
TEST(Autocast, WiderAndNarrowerGradientsMeetAtTheCast) {
  Generator g(22);
  Tensor x = leaf({16, 8}, Device::cpu(), g), w = leaf({6, 8}, Device::cpu(), g);
  Tensor two_uses, wc;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    wc = autocast::cached_cast(w, DType::bf16);
    two_uses = sum(linear(x, w)) + sum(matmul(x, wc.t()));  // linear finds wc in the cache
  }
  Tensor gc = autograd::grad({two_uses}, {wc}, {}, /*retain_graph=*/true)[0];
  EXPECT_EQ(gc.dtype(), DType::bf16);
  two_uses.backward();
  const Tensor both = w.grad();
  ASSERT_EQ(both.dtype(), DType::f32);
  Tensor once;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    w.set_grad(Tensor());
    sum(linear(x, w)).backward();
    once = w.grad().clone();
  }
  // Both uses have the same gradient, the matmul's rounded to bf16 (8 bits): within 2^-8 of twice one.
  EXPECT_LT(rel_err(both, kernels::mul_scalar(once, 2.0)), std::ldexp(1.0, -8));
}

// Two micro-batches inside one region with backward between them (gradient accumulation):
// the cached weight cast whose node the first backward released is replaced, not reused.
TEST(Autocast, GradientAccumulationInsideOneRegion) {
  Generator g(6);
  Tensor x = leaf({4, 8}, Device::cpu(), g), w = leaf({3, 8}, Device::cpu(), g);
  Tensor once;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    sum(linear(x, w)).backward();
    once = w.grad().clone();
    sum(linear(x, w)).backward();
  }
  EXPECT_LT(rel_err(w.grad(), kernels::mul_scalar(once, 2.0)), 1e-6);
}

TEST(Autocast, BatchNormOnCpuRunsInF32WithF32Stats) {
  Generator g(7);
  Tensor x = leaf({4, 3, 5, 5}, Device::cpu(), g);
  Tensor rm = zeros({3}), rv = ones({3}), w = leaf({3}, Device::cpu(), g), b = leaf({3}, Device::cpu(), g);
  Autocast ac(DeviceType::CPU, DType::bf16);
  Tensor h = x.to(DType::bf16);
  Tensor y = batch_norm(h, rm, rv, w, b, true);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(rm.dtype(), DType::f32);
  Tensor expect_mean = kernels::mul_scalar(kernels::mean(h.to(DType::f32), {0, 2, 3}), 0.1);
  EXPECT_LT(rel_err(rm, expect_mean), 1e-5);
}

// The seeds' warning: logits far outside what exp() survives in half precision. Under
// autocast softmax / cross-entropy run in f32 on the low-precision logits, so they stay
// finite and match f32 on the same (rounded) logits.
void check_large_logits(Device dev, DType lp) {
  Generator g(8);
  Tensor x = leaf({6, 16}, dev, g), w = leaf({10, 16}, dev, g, 1000.0);  // logits ~ +-1e4
  Tensor target = from_vector<int64_t>({0, 3, 9, 1, 4, 7}, {6}).to(dev);
  Tensor logits, loss, probs;
  {
    Autocast ac(dev.type, lp);
    logits = linear(x, w);
    EXPECT_EQ(logits.dtype(), lp);
    probs = softmax(logits, -1);
    loss = cross_entropy(logits, target);
    loss.backward();
  }
  EXPECT_GT(kernels::max_all(kernels::unary(kernels::Unary::Abs, logits.to(DType::f32))).item(), 5000.0);
  EXPECT_FALSE(kernels::has_nonfinite(probs));
  EXPECT_FALSE(kernels::has_nonfinite(loss));
  EXPECT_FALSE(kernels::has_nonfinite(w.grad()));
  Tensor l32 = logits.detach().to(DType::f32);
  EXPECT_LT(rel_err(probs, softmax(l32, -1)), 1e-6);
  EXPECT_LT(rel_err(loss, cross_entropy(l32, target)), 1e-6);
}

TEST(Autocast, LargeLogitSoftmaxStaysFiniteCpuBf16) { check_large_logits(Device::cpu(), DType::bf16); }

// ---- CUDA ----

TEST(AutocastCuda, PolicyPerOpF16) {
  SKIP_WITHOUT_CUDA();
  check_policy(Device::cuda(0), DType::f16);
}

TEST(AutocastCuda, PolicyPerOpBf16) {
  SKIP_WITHOUT_CUDA();
  check_policy(Device::cuda(0), DType::bf16);
}

TEST(AutocastCuda, LargeLogitSoftmaxStaysFiniteF16) {
  SKIP_WITHOUT_CUDA();
  check_large_logits(Device::cuda(0), DType::f16);
}

// conv -> batch norm -> relu under f16: batch norm keeps the f16 activation, its affine
// parameters' gradients arrive as f32, and the f32 running statistics track the f32 model's.
TEST(AutocastCuda, BatchNormKeepsHalfActivationsAndF32Stats) {
  SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Generator g(9);
  Tensor x = leaf({8, 3, 10, 10}, d, g), cw = leaf({6, 3, 3, 3}, d, g, 0.3);
  Tensor w = leaf({6}, d, g), b = leaf({6}, d, g);
  Tensor rm = zeros({6}, {DType::f32, d}), rv = ones({6}, {DType::f32, d});
  Tensor rm32 = zeros({6}, {DType::f32, d}), rv32 = ones({6}, {DType::f32, d});
  for (DType lp : {DType::f16, DType::bf16}) {
    {
      Autocast ac(DeviceType::CUDA, lp);
      Tensor h = conv2d(x, cw, Tensor(), 1, 1);
      Tensor y = relu(batch_norm(h, rm, rv, w, b, true));
      EXPECT_EQ(h.dtype(), lp);
      EXPECT_EQ(y.dtype(), lp);
      sum(y).backward();
    }
    EXPECT_EQ(rm.dtype(), DType::f32);
    EXPECT_EQ(w.grad().dtype(), DType::f32);
    batch_norm(conv2d(x, cw, Tensor(), 1, 1), rm32, rv32, w, b, true);
    EXPECT_LT(rel_err(rm, rm32), 2e-2) << lp;
    EXPECT_LT(rel_err(rv, rv32), 2e-2) << lp;
    w.set_grad(Tensor());
  }
  // Eval mode reads the f32 statistics.
  Autocast ac(DeviceType::CUDA, DType::f16);
  Tensor h = conv2d(x, cw, Tensor(), 1, 1);
  EXPECT_EQ(batch_norm(h, rm, rv, w, b, false).dtype(), DType::f16);
}

TEST(AutocastCuda, WeightGradientsComeInF32FromTheGemm) {
  SKIP_WITHOUT_CUDA();
  for (DType lp : {DType::f16, DType::bf16}) check_f32_weight_grads(Device::cuda(0), lp);
}

TEST(AutocastCuda, LinearGradientsMatchF32) {
  SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  for (DType lp : {DType::f16, DType::bf16}) {
    Generator g(10);
    Tensor x = leaf({32, 64}, d, g), w = leaf({16, 64}, d, g, 0.2), b = leaf({16}, d, g);
    {
      Autocast ac(DeviceType::CUDA, lp);
      mean(square(linear(x, w, b))).backward();
    }
    Tensor gw = w.grad(), gb = b.grad();
    EXPECT_EQ(gw.dtype(), DType::f32);
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    mean(square(linear(x, w, b))).backward();
    EXPECT_LT(rel_err(gw, w.grad()), lp == DType::f16 ? 5e-3 : 3e-2) << lp;
    EXPECT_LT(rel_err(gb, b.grad()), lp == DType::f16 ? 5e-3 : 3e-2) << lp;
  }
}

// A cast handed over by provide_cast() (an optimizer's update wrote it) serves the next region,
// but not one captured into a CUDA graph: there the region casts anew, since the graph would
// otherwise read an eager tensor its replays never write. The stand-in here is deliberately
// not w's cast (zeros), so a capture that used it would show.
TEST(AutocastCuda, ProvidedCastServesTheNextRegionButNotACapture) {
  SKIP_WITHOUT_CUDA();
  const Device d = Device::cuda(0);
  Generator g(13);
  Tensor w = leaf({6, 8}, d, g);
  const Tensor stand_in = zeros({6, 8}, {DType::bf16, d});
  autocast::provide_cast(w, stand_in);
  EXPECT_TRUE(autocast::provided_cast(w).is_same(stand_in));
  Tensor captured;
  cuda::Graph graph;
  {
    const cuda::Stream side = cuda::Stream::create();
    cuda::StreamGuard guard(side);
    graph.capture_begin();
    {
      Autocast ac(DeviceType::CUDA, DType::bf16);
      captured = autocast::lower(w);
    }
    graph.capture_end();
    graph.replay();
    side.synchronize();
  }
  EXPECT_FALSE(captured.is_same(stand_in));
  EXPECT_TRUE(bitwise_equal(captured, w.detach().to(DType::bf16)));
  autocast::provide_cast(w, stand_in);
  {
    Autocast ac(DeviceType::CUDA, DType::bf16);
    EXPECT_TRUE(autocast::lower(w).is_same(stand_in));
  }
  EXPECT_EQ(autocast::cache_size(), 0u);  // the region's exit drops it, as its own casts
  // A cast of the wrong dtype, shape or device is a ValueError naming them.
  EXPECT_THROW(autocast::provide_cast(w, zeros({6, 8}, {DType::f32, d})), ValueError);
  EXPECT_THROW(autocast::provide_cast(w, zeros({8, 6}, {DType::bf16, d})), ValueError);
  EXPECT_THROW(autocast::provide_cast(w, zeros({6, 8}, {DType::bf16})), ValueError);
}

}  // namespace
}  // namespace mg
