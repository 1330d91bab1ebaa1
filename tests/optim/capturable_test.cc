// Capturable optimizers, GradScaler and clipping (what a captured CUDA-graph step runs): the
// device-state paths give bitwise the results of the host paths, skip on the device when a
// gradient overflowed, pick up scheduler lrs, save and resume, and refuse what they cannot do.
// These run on the CPU backend (the same semantics as the CUDA kernels); tests/nn/cuda_graph_test
// replays them inside real graphs on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/functions.h"
#include "core/random.h"
#include "kernels/amp.h"
#include "kernels/optim.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Tensor> params(uint64_t seed) {
  Generator g(seed);
  std::vector<Tensor> ps;
  for (Shape s : {Shape{7, 5}, Shape{5}, Shape{3, 2, 4}}) {
    Tensor t = randn(s, {DType::f32}, &g);
    t.requires_grad_();
    ps.push_back(t);
  }
  return ps;
}

// Step k's gradients, the same for both runs; `poison` puts an inf in the first one.
void set_grads(const std::vector<Tensor>& ps, int k, double scale = 1.0, bool poison = false) {
  Generator g(100 + k);
  for (const Tensor& p : ps) p.set_grad(randn(p.sizes(), {DType::f32}, &g) * scale);
  if (poison) ps[0].grad().view({-1}).narrow(0, 3, 1).fill_(kInf);
}

void expect_bitwise_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].detach().to_vector<float>(), b[i].detach().to_vector<float>()) << "parameter " << i;
}

TEST(Capturable, SGDMatchesTheHostPathUnderAScheduler) {
  auto host = params(1), dev = params(1);
  SGD h(host, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  SGD d(dev, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .capturable = true});
  StepLR sh(h, 2, 0.5), sd(d, 2, 0.5);
  for (int k = 0; k < 7; ++k) {
    set_grads(host, k);
    set_grads(dev, k);
    h.step();
    d.step();
    sh.step();
    sd.step();  // writes the new lr into the optimizer's device copy
  }
  expect_bitwise_equal(host, dev);
}

TEST(Capturable, AdamAndAdamWMatchTheHostPath) {
  for (bool decoupled : {false, true}) {
    auto host = params(2), dev = params(2);
    AdamOptions o{.lr = 3e-3, .weight_decay = 0.01, .amsgrad = true};
    AdamOptions oc = o;
    oc.capturable = true;
    std::unique_ptr<Adam> h, d;
    if (decoupled) {
      AdamWOptions wo, woc;
      static_cast<AdamOptions&>(wo) = o;
      static_cast<AdamOptions&>(woc) = oc;
      h = std::make_unique<AdamW>(host, wo);
      d = std::make_unique<AdamW>(dev, woc);
    } else {
      h = std::make_unique<Adam>(host, o);
      d = std::make_unique<Adam>(dev, oc);
    }
    CosineAnnealingLR sh(*h, 6), sd(*d, 6);
    for (int k = 0; k < 6; ++k) {
      set_grads(host, k);
      set_grads(dev, k);
      h->step();
      d->step();
      sh.step();
      sd.step();
    }
    expect_bitwise_equal(host, dev);
    // The device step counts are what state_dict saves.
    EXPECT_EQ(d->state_dict().meta["state"]["0"]["step"], 6) << "decoupled " << decoupled;
    EXPECT_EQ(d->state(dev[0])->step_value(), 6);
  }
}

// A hand-set lr between replays reaches the device after sync_device_lr (eager steps sync it
// themselves).
TEST(Capturable, HandSetLrIsWrittenToTheDevice) {
  auto host = params(3), dev = params(3);
  SGD h(host, {.lr = 0.1});
  SGD d(dev, {.lr = 0.1, .capturable = true});
  for (int k = 0; k < 3; ++k) {
    set_grads(host, k);
    set_grads(dev, k);
    if (k == 1) {
      h.param_groups()[0].set_lr(0.02);
      d.param_groups()[0].set_lr(0.02);
      d.sync_device_lr();
    }
    h.step();
    d.step();
  }
  expect_bitwise_equal(host, dev);
}

TEST(Capturable, StepUnlessSkipsEverythingOnOverflow) {
  auto ps = params(4);
  Adam opt(ps, {.lr = 1e-2, .capturable = true});
  set_grads(ps, 0);
  opt.step();
  std::vector<std::vector<float>> before;
  for (auto& p : ps) before.push_back(p.detach().to_vector<float>());
  const auto m_before = opt.state(ps[0])->buffers.at("exp_avg").to_vector<float>();
  set_grads(ps, 1);
  opt.step_unless(full({1}, 1.0, {DType::f32}));
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i].detach().to_vector<float>(), before[i]) << i;
  EXPECT_EQ(opt.state(ps[0])->buffers.at("exp_avg").to_vector<float>(), m_before);
  EXPECT_EQ(opt.state(ps[0])->step_value(), 1);  // the skipped step did not count
  opt.step_unless(zeros({1}, {DType::f32}));
  EXPECT_NE(ps[0].detach().to_vector<float>(), before[0]);
  EXPECT_EQ(opt.state(ps[0])->step_value(), 2);
}

// The capturable scaler follows the host scaler's scale, growth and skips step for step, and
// the capturable optimizer it drives lands on the same parameters.
TEST(Capturable, GradScalerMatchesTheHostScaler) {
  auto host = params(5), dev = params(5);
  SGD h(host, {.lr = 0.05, .momentum = 0.9});
  SGD d(dev, {.lr = 0.05, .momentum = 0.9, .capturable = true});
  GradScaler hs({.init_scale = 1024.0, .growth_interval = 2});
  GradScaler ds({.init_scale = 1024.0, .growth_interval = 2, .capturable = true});
  const Tensor loss = full({}, 1.0, {DType::f32});
  EXPECT_EQ(ds.scale(loss).item(), 1024.0);  // makes the device state; the 0-d shape is kept
  EXPECT_EQ(ds.scale(loss).dim(), 0);
  for (int k = 0; k < 9; ++k) {
    const bool poison = k == 3 || k == 4;
    set_grads(host, k, hs.get_scale(), poison);
    set_grads(dev, k, ds.get_scale(), poison);
    hs.step(h);
    ds.step(d);
    hs.update();
    ds.update();
    EXPECT_EQ(ds.get_scale(), hs.get_scale()) << "step " << k;
    EXPECT_EQ(ds.growth_tracker(), hs.growth_tracker()) << "step " << k;
  }
  EXPECT_EQ(ds.skipped_steps(), 2);
  EXPECT_EQ(hs.skipped_steps(), 2);
  expect_bitwise_equal(host, dev);
  // state_dict reads the device values; loading writes them back.
  GradScaler fresh({.capturable = true});
  fresh.scale(loss);
  fresh.load_state_dict(ds.state_dict());
  EXPECT_EQ(fresh.get_scale(), ds.get_scale());
  EXPECT_EQ(fresh.growth_tracker(), ds.growth_tracker());
}

TEST(Capturable, DeviceClipMatchesTheHostClip) {
  for (double norm_type : {2.0, 1.0, 3.0, kInf}) {
    for (double max_norm : {0.5, 1e6}) {  // clipping, and a factor of 1
      auto a = params(6), b = params(6);
      set_grads(a, 0);
      set_grads(b, 0);
      const double total = clip_grad_norm_(a, max_norm, norm_type);
      const Tensor dev_total = clip_grad_norm_on_device_(b, max_norm, norm_type);
      EXPECT_EQ(dev_total.item(), static_cast<double>(static_cast<float>(total))) << norm_type;
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(a[i].grad().to_vector<float>(), b[i].grad().to_vector<float>())
            << "norm_type " << norm_type << " max_norm " << max_norm << " parameter " << i;
    }
  }
  auto c = params(7);
  EXPECT_FALSE(clip_grad_norm_on_device_(c, 1.0).defined());  // no gradients yet
}

TEST(Capturable, SavedStateResumesBitwise) {
  auto a = params(8), b = params(8);
  AdamWOptions o;
  o.lr = 1e-2;
  o.capturable = true;
  AdamW run(a, o);
  for (int k = 0; k < 3; ++k) {
    set_grads(a, k);
    run.step();
  }
  for (size_t i = 0; i < a.size(); ++i) b[i].detach().copy_(a[i].detach());
  AdamW resumed(b, o);
  resumed.load_state_dict(run.state_dict());
  for (int k = 3; k < 6; ++k) {
    set_grads(a, k);
    set_grads(b, k);
    run.step();
    resumed.step();
  }
  expect_bitwise_equal(a, b);
  EXPECT_EQ(resumed.state(b[1])->step_value(), 6);
}

TEST(Capturable, WhatCannotBeCapturedIsAClearError) {
  // A parameter the fused update does not take.
  Tensor h16 = zeros({4}, {DType::f16});
  h16.requires_grad_();
  h16.set_grad(ones({4}, {DType::f16}));
  SGD s16({h16}, {.lr = 0.1, .capturable = true});
  EXPECT_THROW(s16.step(), ValueError);
  // capturable needs the fused path.
  EXPECT_THROW(SGD(params(9), {.fused = false, .capturable = true}), ValueError);
  // A device skip needs a capturable optimizer, and the capturable scaler one too.
  auto ps = params(9);
  SGD plain(ps, {.lr = 0.1});
  EXPECT_THROW(plain.step_unless(zeros({1}, {DType::f32})), ValueError);
  GradScaler scaler({.capturable = true});
  scaler.scale(full({}, 1.0, {DType::f32}));
  set_grads(ps, 0);
  EXPECT_THROW(scaler.step(plain), ValueError);
  // The device clip takes f32 gradients on one device.
  Tensor d64 = zeros({3}, {DType::f64});
  d64.requires_grad_();
  d64.set_grad(ones({3}, {DType::f64}));
  EXPECT_THROW(clip_grad_norm_on_device_({d64}, 1.0), DTypeError);
  EXPECT_THROW(kernels::multi_tensor_clip_({}, 1.0, 2.0), ValueError);
  // The device scalars must be one-element tensors of the stated dtype.
  const Tensor f32_one = ones({1}, {DType::f32}), i64_one = zeros({1}, {DType::i64});
  EXPECT_THROW(kernels::amp_update_scale_(f32_one, f32_one, i64_one, f32_one, 2.0, 0.5, 10), ValueError);
  EXPECT_THROW(kernels::amp_update_scale_(f32_one, i64_one, i64_one, ones({2}, {DType::f32}), 2.0, 0.5, 10),
               ValueError);
  EXPECT_THROW(kernels::amp_update_scale_(f32_one, i64_one, i64_one, f32_one, 0.5, 0.5, 10), ValueError);
  kernels::SGDTensors l{{ps[0].detach()}, {ps[0].grad()}, {}, {}};
  EXPECT_THROW(kernels::sgd_multi_tensor_(l, {}, {.lr = f32_one}), ValueError);  // the device lr is f64
  EXPECT_THROW(kernels::sgd_multi_tensor_(l, {}, {.found_inf = i64_one}), ValueError);
}

}  // namespace
}  // namespace mg::optim
