// GradScaler dynamics (growth after the interval, backoff and skip on inf/NaN, no skipped
// clean steps, idempotent unscale_), f16 gradient underflow without scaling, state_dict;
// the fused unscale kernel on mixed dtypes and layouts; stochastic-rounding bf16 updates
// (unbiased, CPU == CUDA bits) and pure-bf16 training that converges where
// round-to-nearest stalls. CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "kernels/amp.h"
#include "kernels/ops.h"
#include "optim/bf16_update.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!mg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor param(const Shape& s, Generator& g, Device d = Device::cpu()) {
  Tensor t = randn(s, {DType::f32, d}, &g);
  t.requires_grad_();
  return t;
}

// Sets p.grad to `value` * scale everywhere (what backward of a scaled loss would leave).
void set_grad(const Tensor& p, double value) { p.set_grad(full(p.sizes(), value, {p.dtype(), p.device()})); }

TEST(GradScaler, DefaultsMatchPyTorch) {
  GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
}

TEST(GradScaler, GrowsAfterTheIntervalAndNeverSkipsCleanSteps) {
  Generator g(1);
  Tensor p = param({4}, g);
  SGD opt({p}, SGDOptions{.lr = 0.1});
  GradScaler s({.init_scale = 8.0, .growth_interval = 3});
  for (int step = 1; step <= 7; ++step) {
    Tensor before = p.detach().clone();
    set_grad(p, 0.5 * s.get_scale());
    EXPECT_TRUE(s.step(opt));
    // The optimizer saw the unscaled gradient 0.5.
    EXPECT_NEAR((before - p.detach()).to_vector<double>()[0], 0.05, 1e-6);
    s.update();
    const double expect = step < 3 ? 8.0 : step < 6 ? 16.0 : 32.0;
    EXPECT_EQ(s.get_scale(), expect) << "after step " << step;
    EXPECT_EQ(s.growth_tracker(), step % 3);
  }
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(GradScaler, BacksOffAndSkipsOnInfAndNaN) {
  Generator g(2);
  Tensor p = param({5}, g), q = param({3}, g);
  SGD opt({p, q}, SGDOptions{.lr = 0.1});
  GradScaler s({.init_scale = 1024.0, .growth_interval = 2});
  set_grad(p, 1.0);
  set_grad(q, 1.0);
  ASSERT_TRUE(s.step(opt));
  s.update();
  EXPECT_EQ(s.growth_tracker(), 1);
  for (double bad : {kInf, -kInf, std::nan("")}) {
    Tensor p0 = p.detach().clone(), q0 = q.detach().clone();
    const double scale0 = s.get_scale();
    set_grad(p, 1.0);
    Tensor gq = from_vector<float>({1.0f, static_cast<float>(bad), 1.0f}, {3});
    q.set_grad(gq);
    EXPECT_FALSE(s.step(opt)) << bad;
    EXPECT_EQ(p.detach().to_vector<double>(), p0.to_vector<double>()) << "a skipped step must not touch parameters";
    EXPECT_EQ(q.detach().to_vector<double>(), q0.to_vector<double>());
    s.update();
    EXPECT_EQ(s.get_scale(), scale0 * 0.5);
    EXPECT_EQ(s.growth_tracker(), 0);
  }
  EXPECT_EQ(s.skipped_steps(), 3);
}

TEST(GradScaler, UnscaleIsIdempotentSoClippingCanRunBetween) {
  Generator g(3);
  Tensor p = param({4}, g);
  SGD opt({p}, SGDOptions{.lr = 1.0});
  GradScaler s({.init_scale = 256.0});
  set_grad(p, 3.0 * 256.0);
  s.unscale_(opt);
  EXPECT_EQ(p.grad().to_vector<double>()[0], 3.0);
  s.unscale_(opt);  // no second division
  EXPECT_EQ(p.grad().to_vector<double>()[0], 3.0);
  {  // "clip" to 1
    NoGradGuard ng;
    kernels::fill_(p.grad(), 1.0);
  }
  Tensor before = p.detach().clone();
  EXPECT_TRUE(s.step(opt));
  EXPECT_NEAR((before - p.detach()).to_vector<double>()[0], 1.0, 1e-6);
  EXPECT_THROW(s.step(opt), ValueError);  // twice before update()
  s.update();
  EXPECT_THROW(s.update(), ValueError);  // nothing recorded since
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Generator g(4);
  Tensor p = param({2}, g);
  SGD opt({p}, SGDOptions{.lr = 1.0});
  GradScaler s({.enabled = false});
  Tensor loss = sum(p);
  EXPECT_TRUE(s.scale(loss).is_same(loss));
  set_grad(p, 2.0);
  Tensor before = p.detach().clone();
  EXPECT_TRUE(s.step(opt));
  s.update();
  EXPECT_NEAR((before - p.detach()).to_vector<double>()[0], 2.0, 1e-6);
  EXPECT_EQ(s.get_scale(), 1.0);
}

TEST(GradScaler, BadOptionsAreValueErrors) {
  EXPECT_THROW(GradScaler({.init_scale = 0.0}), ValueError);
  EXPECT_THROW(GradScaler({.growth_factor = 1.0}), ValueError);
  EXPECT_THROW(GradScaler({.backoff_factor = 1.5}), ValueError);
  EXPECT_THROW(GradScaler({.growth_interval = 0}), ValueError);
}

TEST(GradScaler, StateDictRoundTrip) {
  Generator g(5);
  Tensor p = param({2}, g);
  SGD opt({p}, SGDOptions{.lr = 0.1});
  GradScaler a({.init_scale = 128.0, .growth_interval = 5});
  for (int i = 0; i < 3; ++i) {
    set_grad(p, 1.0);
    a.step(opt);
    a.update();
  }
  StateDict sd = a.state_dict();
  EXPECT_EQ(sd.meta["scale"].get<double>(), 128.0);
  EXPECT_EQ(sd.meta["_growth_tracker"].get<int64_t>(), 3);
  GradScaler b;
  b.load_state_dict(sd);
  EXPECT_EQ(b.get_scale(), 128.0);
  EXPECT_EQ(b.growth_tracker(), 3);
  EXPECT_EQ(b.options().growth_interval, 5);
  StateDict bad = sd;
  bad.meta["scale"] = -1.0;
  EXPECT_THROW(b.load_state_dict(bad), ValueError);
  bad = sd;
  bad.meta.erase("_growth_tracker");
  EXPECT_THROW(b.load_state_dict(bad), ValueError);
  EXPECT_EQ(b.get_scale(), 128.0);  // a failed load changes nothing
}

// Gradients of ~1e-9 are below f16's smallest subnormal (6e-8): computed in f16 they flush
// to zero; with the loss scaled by 2^16 they survive and unscale to the right f32 values.
TEST(GradScaler, SmallF16GradientsUnderflowWithoutScalingAndSurviveWithIt) {
  Generator g(6);
  Tensor w = param({8, 4}, g);
  Tensor x = rand({16, 8}, {DType::f32}, &g);
  auto loss_of = [&] {  // the f16 computation autocast would run on a GPU, on a tiny loss
    Tensor y = matmul(x.to(DType::f16), w.to(DType::f16));
    return mul(mean(y.to(DType::f32)), 1e-6);
  };
  SGD opt({w}, SGDOptions{.lr = 0.1});
  loss_of().backward();
  Tensor unscaled_grad = w.grad().clone();
  EXPECT_EQ(kernels::max_all(kernels::unary(kernels::Unary::Abs, unscaled_grad)).item(), 0.0)
      << "expected the f16 gradient to underflow";
  w.set_grad(Tensor());
  GradScaler s;
  s.scale(loss_of()).backward();
  s.unscale_(opt);
  // Reference: d (1e-6 mean(x @ w)) / dw = 1e-6 * column sums of x / (16 * 4), in f64.
  Tensor ref = kernels::mul_scalar(kernels::sum(x.to(DType::f64), {0}, true), 1e-6 / 64.0);
  auto got = w.grad().to_vector<double>();
  auto r = ref.to_vector<double>();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_GT(got[i * 4 + j], 0.0);
      EXPECT_NEAR(got[i * 4 + j], r[i], 4e-3 * r[i]) << i << "," << j;
    }
  EXPECT_TRUE(s.step(opt));
  s.update();
}

// ---- the fused kernel ----

TEST(AmpUnscale, MixedDtypesAndLayoutsOnTheCpu) {
  Generator g(7);
  std::vector<Tensor> grads = {randn({100}, {DType::f32}, &g), randn({7, 9}, {DType::f16}, &g),
                               randn({33}, {DType::bf16}, &g), randn({5, 6}, {DType::f64}, &g).t()};
  std::vector<std::vector<double>> before;
  for (auto& t : grads) before.push_back(t.to_vector<double>());
  Tensor flag = zeros({1});
  kernels::amp_unscale_(grads, flag, 0.25);
  EXPECT_EQ(flag.item(), 0.0);
  for (size_t i = 0; i < grads.size(); ++i) {
    auto after = grads[i].to_vector<double>();
    for (size_t k = 0; k < after.size(); ++k) EXPECT_NEAR(after[k], before[i][k] * 0.25, 1e-7) << i << ":" << k;
  }
  // One inf anywhere sets the flag; a later clean call leaves it set.
  raw::fill_(raw::select(grads[3], 0, 2), kInf);
  kernels::amp_unscale_(grads, flag, 1.0);
  EXPECT_EQ(flag.item(), 1.0);
  kernels::amp_unscale_({grads[0]}, flag, 1.0);
  EXPECT_EQ(flag.item(), 1.0);
}

TEST(AmpUnscale, BadInputsNameTheProblem) {
  Tensor flag = zeros({1});
  EXPECT_THROW(kernels::amp_unscale_({arange(4)}, flag, 1.0), DTypeError);
  EXPECT_THROW(kernels::amp_unscale_({ones({2})}, zeros({1}, {DType::f16}), 1.0), DTypeError);
  EXPECT_THROW(kernels::amp_unscale_({ones({2})}, zeros({2}), 1.0), ShapeError);
  EXPECT_THROW(kernels::amp_unscale_({ones({2})}, flag, kInf), ValueError);
  EXPECT_THROW(kernels::add_stochastic_bf16_(ones({2}), ones({2}), 1.0, 1), DTypeError);
  EXPECT_THROW(kernels::add_stochastic_bf16_(ones({2}, {DType::bf16}), ones({3}), 1.0, 1), ShapeError);
}

TEST(AmpUnscaleCuda, MatchesTheCpuOverManyTensorsAndLaunches) {
  SKIP_WITHOUT_CUDA();
  Generator g(8);
  std::vector<Tensor> cpu, gpu;
  const DType dts[] = {DType::f32, DType::f16, DType::bf16};
  for (int i = 0; i < 150; ++i) {  // > 2 launches of 64 tensors; sizes across block edges
    const int64_t n = 1 + (i * 977) % 9000;
    Tensor t = randn({n}, {dts[i % 3]}, &g);
    cpu.push_back(t);
    gpu.push_back(t.to(Device::cuda(0)));
  }
  Tensor fc = zeros({1}), fg = zeros({1}, {DType::f32, Device::cuda(0)});
  kernels::amp_unscale_(cpu, fc, 1.0 / 1024);
  kernels::amp_unscale_(gpu, fg, 1.0 / 1024);
  EXPECT_EQ(fg.item(), 0.0);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_EQ(cpu[i].to_vector<double>(), gpu[i].to_vector<double>()) << i;
  // An overflow in the last tensor of the last launch is still seen.
  raw::fill_(raw::slice(gpu.back(), 0, 0, 1, 1), std::nan(""));
  kernels::amp_unscale_(gpu, fg, 1.0);
  EXPECT_EQ(fg.item(), 1.0);
}

// f16 autocast on the GPU end to end: the scaler's step on a linear model.
TEST(GradScalerCuda, F16AutocastStep) {
  SKIP_WITHOUT_CUDA();
  Generator g(9);
  const Device d = Device::cuda(0);
  Tensor w = param({16, 32}, g, d);
  Tensor x = randn({64, 32}, {DType::f32, d}, &g);
  SGD opt({w}, SGDOptions{.lr = 0.01});
  GradScaler s;
  Tensor before = w.detach().clone();
  {
    Autocast ac(DeviceType::CUDA, DType::f16);
    Tensor loss = mean(square(linear(x, w)));
    EXPECT_EQ(loss.dtype(), DType::f32);
    s.scale(loss).backward();
  }
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_TRUE(s.step(opt));
  s.update();
  EXPECT_GT(kernels::max_all(kernels::unary(kernels::Unary::Abs, before - w.detach())).item(), 0.0);
}

// ---- pure bf16 ----

TEST(Bf16Update, StochasticRoundingIsUnbiased) {
  // 1 + 1e-4 is 1.0 in bf16 under round-to-nearest (ulp 2^-7); 2000 such additions move
  // the parameter by 0.2 in expectation.
  Tensor p = ones({256}, {DType::bf16});
  Tensor nearest = ones({256}, {DType::bf16});
  Tensor delta = full({256}, 1e-4);
  Generator gen(10);
  for (int i = 0; i < 2000; ++i) {
    kernels::add_stochastic_bf16_(p, delta, 1.0, next_rounding_seed(&gen));
    kernels::axpby_(nearest, 1.0, delta, 1.0);
  }
  const double m = kernels::mean(p.to(DType::f64)).item();
  EXPECT_NEAR(m, 1.2, 0.01);
  EXPECT_EQ(kernels::mean(nearest.to(DType::f64)).item(), 1.0);
}

TEST(Bf16UpdateCuda, SameBitsAsTheCpu) {
  SKIP_WITHOUT_CUDA();
  Generator g(11);
  Tensor pc = randn({5000}, {DType::bf16}, &g), u = kernels::mul_scalar(randn({5000}, {DType::f32}, &g), 1e-3);
  Tensor pg = pc.to(Device::cuda(0));
  kernels::add_stochastic_bf16_(pc, u, -0.5, 1234);
  kernels::add_stochastic_bf16_(pg, u.to(Device::cuda(0)), -0.5, 1234);
  EXPECT_EQ(pc.to_vector<double>(), pg.to_vector<double>());
}

// Least squares with bf16 weights and f32 momentum: stochastic rounding converges close to
// the f32 run; round-to-nearest stalls once updates fall under half an ulp.
double train_bf16_regression(bool stochastic, Device d) {
  Generator g(12);
  const int64_t n = 256, k = 16;
  Tensor X = randn({n, k}, {DType::f32, d}, &g), w_true = randn({k, 1}, {DType::f32, d}, &g);
  Tensor y = matmul(X, w_true);
  Tensor w = zeros({k, 1}, {DType::bf16, d});
  w.requires_grad_();
  Tensor buf;
  SGDStep h{.lr = 2e-3, .momentum = 0.5};
  Generator seeds(13);
  double loss = 0;
  for (int it = 0; it < 3000; ++it) {
    w.set_grad(Tensor());
    Tensor l = mean(square(matmul(X, w.to(DType::f32)) - y));
    l.backward();
    loss = l.item();
    if (stochastic) {
      sgd_bf16_update_(w, w.grad(), &buf, h, next_rounding_seed(&seeds));
    } else {  // the same f32 update, rounded to nearest
      NoGradGuard ng;
      Tensor gr = w.grad().to(DType::f32);
      if (!buf.defined())
        buf = gr.clone();
      else
        kernels::axpby_(buf, h.momentum, gr, 1.0);
      Tensor w32 = kernels::axpby(w.detach().to(DType::f32), 1.0, buf, -h.lr);
      raw::copy_(w, w32);
    }
  }
  return loss;
}

TEST(Bf16Update, PureBf16TrainingConvergesWithStochasticRounding) {
  const double sr = train_bf16_regression(true, Device::cpu());
  const double rn = train_bf16_regression(false, Device::cpu());
  EXPECT_LT(sr, 2e-3) << "initial loss is ~16";
  EXPECT_GT(rn, 10 * sr) << "round-to-nearest was expected to stall (sr " << sr << ", nearest " << rn << ")";
}

// The same problem through optim::SGD: a bf16 parameter takes the stochastic-rounding path
// (f32 momentum buffer), an f32 copy of it trained alongside is the reference.
TEST(Bf16Update, SgdTrainsBf16ParametersWithF32State) {
  Generator g(14);
  Tensor X = randn({256, 16}, {DType::f32}, &g), w_true = randn({16, 1}, {DType::f32}, &g);
  Tensor y = matmul(X, w_true);
  Tensor w = zeros({16, 1}, {DType::bf16});
  w.requires_grad_();
  SGD opt({w}, SGDOptions{.lr = 2e-3, .momentum = 0.5});
  double first = 0, last = 0;
  for (int it = 0; it < 3000; ++it) {
    opt.zero_grad();
    Tensor l = mean(square(matmul(X, w.to(DType::f32)) - y));
    l.backward();
    opt.step();
    (it == 0 ? first : last) = l.item();
  }
  EXPECT_EQ(w.dtype(), DType::bf16);
  ASSERT_NE(opt.state(w), nullptr);
  EXPECT_EQ(opt.state(w)->buffers.at("momentum_buffer").dtype(), DType::f32);
  EXPECT_LT(last, 2e-3) << "started at " << first;
}

TEST(Bf16UpdateCuda, PureBf16TrainingConvergesOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  EXPECT_LT(train_bf16_regression(true, Device::cuda(0)), 2e-3);
}

}  // namespace
}  // namespace mg::optim
