// Fused multi-tensor optimizer kernels on CUDA against the CPU path and the per-parameter
// CUDA path, the multi-tensor norm/clip on CUDA, and state on the device (skips without a GPU).
#include <gtest/gtest.h>

#include <cmath>

#include "core/device_runtime.h"
#include "core/random.h"
#include "kernels/optim.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!mg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// More tensors than one launch takes (32), one spanning more chunks than one launch has
// blocks (320 x 65536 elements), odd sizes and an empty tensor.
std::vector<Shape> shapes() {
  std::vector<Shape> s = {{21 * 1000 * 1000 + 17}, {0}, {1}, {65536}, {65537}, {3, 300, 300}};
  for (int i = 0; i < 45; ++i) s.push_back({i * 97 + 5});
  return s;
}

std::vector<Tensor> params_on(const std::vector<Tensor>& init, Device d) {
  std::vector<Tensor> out;
  for (auto& t : init) out.push_back(nn::parameter(t.to(d).clone()));
  return out;
}

void expect_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol, const char* what) {
  for (size_t i = 0; i < a.size(); ++i) {
    const auto va = a[i].to_vector<float>(), vb = b[i].to_vector<float>();
    ASSERT_EQ(va.size(), vb.size());
    // Two orderings of the same f32 arithmetic (fused kernel with FMA contraction vs the
    // per-op path, or vs the CPU) differ by a few ulps of the operands, not of the result:
    // an element that steps across zero has a tiny value but an ulp-sized error. So the
    // floor is relative to the tensor's scale (1% of its largest magnitude), not a constant.
    double scale = 0;
    for (float v : vb) scale = std::max(scale, std::fabs(double(v)));
    double worst = 0;
    for (size_t j = 0; j < va.size(); ++j)
      worst = std::max(worst, std::fabs(double(va[j]) - vb[j]) / (1e-2 * scale + std::fabs(double(vb[j]))));
    EXPECT_LE(worst, rtol) << what << ": tensor " << i << " (" << shape_str(a[i].sizes()) << ")";
  }
}

// Steps CPU and CUDA optimizers made by `make` with identical gradients.
template <class Make>
void compare_cpu_cuda(Make make, int steps, double rtol, const char* what) {
  manual_seed(7);
  std::vector<Tensor> init;
  for (auto& s : shapes()) init.push_back(randn(s));
  auto cpu = params_on(init, Device::cpu()), gpu = params_on(init, Device::cuda(0));
  auto oc = make(cpu), og = make(gpu);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      Tensor g = randn(cpu[i].sizes());
      cpu[i].set_grad(g);
      gpu[i].set_grad(g.to(Device::cuda(0)));
    }
    oc->step();
    og->step();
  }
  expect_close(gpu, cpu, rtol, what);
}

TEST(OptimCuda, AdamFusedMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  o.amsgrad = true;
  compare_cpu_cuda([&](std::vector<Tensor> p) { return std::make_unique<Adam>(p, o); }, 3, 1e-5, "Adam");
  AdamWOptions w;
  w.lr = 1e-2;
  compare_cpu_cuda([&](std::vector<Tensor> p) { return std::make_unique<AdamW>(p, w); }, 3, 1e-5, "AdamW");
}

// 8-bit AdamW on CUDA against the CPU loop: the same per-element rule and rounding, but the
// kernel contracts multiply-adds into FMAs (and the CPU takes sqrt in double), so a moment
// within an ulp of the midpoint between two codes can round to the neighbouring code on one
// side. The first step from zero state makes the moments from the gradient alone (m = (1-b1) g,
// v = (1-b2) g^2, no rounding difference): its codes and scales agree bitwise. After that, an
// element whose code flipped takes a next step that differs by at most about its own size (the
// flipped code moves its moment by at most one code gap, which is at most the moment itself
// in the sparsest decade): with lr 1e-2 and parameters of scale ~5 that is under 0.25 of
// expect_close's floor (1 % of the scale). Flips are rare: under 0.1 % of the codes, and of the
// parameters off by more than f32 noise.
// One step of both optimizers on the same random gradients (drawn on the CPU, copied to the GPU).
void step_both(const std::vector<Tensor>& cpu, const std::vector<Tensor>& gpu, Optimizer& oc, Optimizer& og) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    Tensor g = randn(cpu[i].sizes());
    cpu[i].set_grad(g);
    gpu[i].set_grad(g.to(Device::cuda(0)));
  }
  oc.step();
  og.step();
}

TEST(OptimCuda, AdamW8bitMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  AdamW8bitOptions o;
  o.lr = 1e-2;
  manual_seed(7);
  std::vector<Tensor> init;
  for (auto& s : shapes()) init.push_back(randn(s));
  auto cpu = params_on(init, Device::cpu()), gpu = params_on(init, Device::cuda(0));
  AdamW8bit oc(cpu, o), og(gpu, o);
  auto step = [&] { step_both(cpu, gpu, oc, og); };
  // Codes that differ between the two states, and how many were compared.
  auto code_diffs = [&](bool expect_equal) {
    int64_t total = 0, off = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      const ParamState* sc = oc.state(cpu[i]);
      if (!sc || !sc->buffers.count("exp_avg_absmax")) continue;
      for (const char* name : {"exp_avg", "exp_avg_sq"}) {
        const auto a = sc->buffers.at(name).to_vector<uint8_t>();
        const auto b = og.state(gpu[i])->buffers.at(name).to_vector<uint8_t>();
        for (size_t j = 0; j < a.size(); ++j) off += a[j] != b[j];
        total += static_cast<int64_t>(a.size());
      }
      if (expect_equal)
        for (const char* name : {"exp_avg_absmax", "exp_avg_sq_absmax"})
          EXPECT_EQ(sc->buffers.at(name).to_vector<float>(), og.state(gpu[i])->buffers.at(name).to_vector<float>())
              << name << " of tensor " << i;
    }
    return std::make_pair(off, total);
  };
  step();
  expect_close(gpu, cpu, 1e-5, "AdamW8bit, one step");
  const auto [off1, total1] = code_diffs(true);
  EXPECT_GT(total1, 0);
  EXPECT_EQ(off1, 0) << "codes after the first step";
  step();
  step();
  expect_close(gpu, cpu, 0.25, "AdamW8bit, three steps");
  const auto [off3, total3] = code_diffs(false);
  EXPECT_LT(off3, total3 / 1000 + 1) << off3 << " of " << total3 << " codes differ";
  int64_t loose = 0, n = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const auto a = cpu[i].to_vector<float>(), b = gpu[i].to_vector<float>();
    for (size_t j = 0; j < a.size(); ++j) loose += std::fabs(a[j] - b[j]) > 1e-5 * (1.0 + std::fabs(a[j]));
    n += static_cast<int64_t>(a.size());
  }
  EXPECT_LT(loose, n / 1000 + 1) << loose << " of " << n << " parameters differ beyond f32 noise";
}

// Parameters that start one float into a shared buffer (views at odd offsets): the 8-bit kernel's
// one-element-at-a-time path, taken where a chunk's lists are not 16-byte aligned, against the
// CPU after one step: the same codes and scales, the parameters within f32 noise.
TEST(OptimCuda, AdamW8bitOnMisalignedViewsMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  AdamW8bitOptions o;
  o.lr = 1e-2;
  manual_seed(11);
  const std::vector<int64_t> sizes = {4096 + 3, 3 * 2048 + 1, 70001};
  int64_t total = 1;
  for (int64_t n : sizes) total += n + 1;
  const Tensor init = randn({total});
  auto views_of = [&](const Tensor& flat) {
    std::vector<Tensor> ps;
    int64_t at = 1;
    for (int64_t n : sizes) {
      ps.push_back(nn::parameter(raw::slice(flat, 0, at, at + n, 1)));
      at += n + 1;
    }
    return ps;
  };
  const Tensor flat_c = init.clone(), flat_g = init.to(Device::cuda(0));
  auto cpu = views_of(flat_c), gpu = views_of(flat_g);
  ASSERT_NE(reinterpret_cast<uintptr_t>(gpu[0].raw_data()) % 16, 0u);
  AdamW8bit oc(cpu, o), og(gpu, o);
  step_both(cpu, gpu, oc, og);
  expect_close(gpu, cpu, 1e-5, "AdamW8bit on misaligned views, one step");
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(oc.state(cpu[i]) && oc.state(cpu[i])->buffers.count("exp_avg_absmax")) << i;
    for (const char* name : {"exp_avg", "exp_avg_sq"})
      EXPECT_EQ(oc.state(cpu[i])->buffers.at(name).to_vector<uint8_t>(),
                og.state(gpu[i])->buffers.at(name).to_vector<uint8_t>())
          << name << " of tensor " << i;
    for (const char* name : {"exp_avg_absmax", "exp_avg_sq_absmax"})
      EXPECT_EQ(oc.state(cpu[i])->buffers.at(name).to_vector<float>(),
                og.state(gpu[i])->buffers.at(name).to_vector<float>())
          << name << " of tensor " << i;
  }
}

// A capturable 8-bit step (lr and step counts on the device) gives the eager step's result.
TEST(OptimCuda, AdamW8bitCapturableMatchesEager) {
  SKIP_WITHOUT_CUDA();
  manual_seed(9);
  std::vector<Tensor> init = {randn({5000}), randn({300, 70}), randn({17})};
  auto a = params_on(init, Device::cuda(0)), b = params_on(init, Device::cuda(0));
  AdamW8bitOptions eo, co;
  co.capturable = true;
  AdamW8bit ea(a, eo), cb(b, co);
  for (int s = 0; s < 4; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      Tensor g = randn(a[i].sizes(), {DType::f32, Device::cuda(0)});
      a[i].set_grad(g);
      b[i].set_grad(g.clone());
    }
    ea.step();
    cb.step();
  }
  // Bias corrections in double on the device vs on the host: the same expression, so at most
  // the last bit of the f32 step size differs.
  expect_close(b, a, 1e-6, "AdamW8bit capturable");
}

TEST(OptimCuda, SGDFusedMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 1e-3;
  compare_cpu_cuda([&](std::vector<Tensor> p) { return std::make_unique<SGD>(p, o); }, 3, 1e-5, "SGD nesterov");
  SGDOptions plain;
  plain.lr = 0.1;
  compare_cpu_cuda([&](std::vector<Tensor> p) { return std::make_unique<SGD>(p, plain); }, 2, 1e-6, "SGD plain");
}

TEST(OptimCuda, FusedMatchesPerParameterOnDevice) {
  SKIP_WITHOUT_CUDA();
  manual_seed(8);
  std::vector<Tensor> init;
  for (int i = 0; i < 40; ++i) init.push_back(randn({i * 1000 + 3}));
  auto a = params_on(init, Device::cuda(0)), b = params_on(init, Device::cuda(0));
  AdamOptions fo, po;
  fo.amsgrad = po.amsgrad = true;
  po.fused = false;
  Adam fa(a, fo), pb(b, po);
  for (int s = 0; s < 4; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      Tensor g = randn(a[i].sizes(), {DType::f32, Device::cuda(0)});
      a[i].set_grad(g);
      b[i].set_grad(g.clone());
    }
    fa.step();
    pb.step();
  }
  expect_close(a, b, 1e-5, "fused vs per-parameter");
}

// The multi-tensor cast (autocast's weight casts in one launch) equals raw::copy_'s cast bitwise,
// to bf16 and f16, over more tensors than one launch takes, odd sizes, an empty tensor and one
// spanning many chunks; bad lists are errors naming the pair.
TEST(OptimCuda, MultiTensorCastEqualsTheCast) {
  SKIP_WITHOUT_CUDA();
  manual_seed(9);
  std::vector<Tensor> src;
  for (const Shape& s : shapes()) src.push_back(randn(s, {DType::f32, Device::cuda(0)}));
  for (DType to : {DType::bf16, DType::f16}) {
    std::vector<Tensor> dst;
    for (const Tensor& t : src) dst.push_back(empty(t.sizes(), {to, t.device()}));
    kernels::multi_tensor_cast_(src, dst);
    for (size_t i = 0; i < src.size(); ++i) {
      const Tensor want = src[i].to(to);
      ASSERT_EQ(dst[i].sizes(), want.sizes());
      EXPECT_EQ(dst[i].to(DType::f32).to_vector<float>(), want.to(DType::f32).to_vector<float>())
          << to << " tensor " << i << " " << shape_str(src[i].sizes());
    }
  }
  std::vector<Tensor> one{src[3]}, wrong{empty({2}, {DType::bf16, Device::cuda(0)})};
  EXPECT_THROW(kernels::multi_tensor_cast_(one, wrong), ValueError);
  std::vector<Tensor> f64{empty(src[3].sizes(), {DType::f64, Device::cuda(0)})};
  EXPECT_THROW(kernels::multi_tensor_cast_(one, f64), DTypeError);
}

// The fused Adam update writing low-precision copies (the next autocast region's weight casts):
// each copy equals the updated parameter cast by raw::copy_ bitwise, to bf16 and f16, over the
// list shapes() gives (launches cut mid-tensor, odd tails, an empty tensor), with some
// parameters left without a copy; the parameters themselves are bitwise those of an update
// without copies. Under a skipped update (found_inf) the copies are the unchanged parameters.
// Bad lists are errors naming the entry.
TEST(OptimCuda, AdamWritesLowCopiesOfTheUpdatedParameters) {
  SKIP_WITHOUT_CUDA();
  manual_seed(10);
  const Device gpu = Device::cuda(0);
  std::vector<Tensor> init, grads;
  for (const Shape& s : shapes())
    init.push_back(randn(s, {DType::f32, gpu})), grads.push_back(randn(s, {DType::f32, gpu}));
  kernels::AdamHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.01;
  h.decoupled_weight_decay = true;
  const auto lists = [&](bool lows, DType to) {
    kernels::AdamTensors t;
    for (size_t i = 0; i < init.size(); ++i) {
      t.params.push_back(init[i].clone());
      t.grads.push_back(grads[i]);
      t.exp_avg.push_back(zeros(init[i].sizes(), {DType::f32, gpu}));
      t.exp_avg_sq.push_back(zeros(init[i].sizes(), {DType::f32, gpu}));
      t.steps.push_back(1);
      if (lows) t.low_copies.push_back(i % 3 == 1 ? Tensor() : empty(init[i].sizes(), {to, gpu}));
    }
    return t;
  };
  for (DType to : {DType::bf16, DType::f16}) {
    const kernels::AdamTensors plain = lists(false, to), with = lists(true, to);
    kernels::adam_multi_tensor_(plain, h);
    kernels::adam_multi_tensor_(with, h);
    for (size_t i = 0; i < init.size(); ++i) {
      EXPECT_EQ(with.params[i].to_vector<float>(), plain.params[i].to_vector<float>()) << "param " << i;
      if (with.low_copies[i].defined())
        EXPECT_EQ(with.low_copies[i].to(DType::f32).to_vector<float>(),
                  with.params[i].to(to).to(DType::f32).to_vector<float>())
            << to << " copy " << i << " " << shape_str(init[i].sizes());
    }
    // A skipped update (GradScaler found an inf): parameters unchanged, copies of them.
    const kernels::AdamTensors skipped = lists(true, to);
    kernels::DeviceScalars d;
    d.found_inf = full({1}, 1.0, {DType::f32, gpu});
    kernels::adam_multi_tensor_(skipped, h, d);
    for (size_t i = 0; i < init.size(); ++i) {
      EXPECT_EQ(skipped.params[i].to_vector<float>(), init[i].to_vector<float>()) << "skipped param " << i;
      if (skipped.low_copies[i].defined())
        EXPECT_EQ(skipped.low_copies[i].to(DType::f32).to_vector<float>(),
                  init[i].to(to).to(DType::f32).to_vector<float>())
            << "skipped copy " << i;
    }
  }
  kernels::AdamTensors bad = lists(true, DType::bf16);
  bad.low_copies[0] = empty(init[0].sizes(), {DType::f32, gpu});
  EXPECT_THROW(kernels::adam_multi_tensor_(bad, h), DTypeError);
  bad.low_copies[0] = empty(init[0].sizes(), {DType::f16, gpu});  // beside bf16 ones
  EXPECT_THROW(kernels::adam_multi_tensor_(bad, h), DTypeError);
  bad.low_copies[0] = empty({3}, {DType::bf16, gpu});
  EXPECT_THROW(kernels::adam_multi_tensor_(bad, h), ShapeError);
  bad.low_copies.pop_back();
  EXPECT_THROW(kernels::adam_multi_tensor_(bad, h), ValueError);
}

TEST(OptimCuda, StateLivesOnTheDeviceAndResumes) {
  SKIP_WITHOUT_CUDA();
  manual_seed(9);
  std::vector<Tensor> init = {randn({1000}), randn({10, 10})};
  auto a = params_on(init, Device::cuda(0));
  auto& stats = CategoryStats::get(Device::cuda(0));
  const int64_t before = stats.counter(MemoryCategory::OptimizerState).current;
  AdamOptions o;
  Adam oa(a, o);
  auto grads = [&](std::vector<Tensor>& ps, uint64_t seed) {
    manual_seed(seed);
    for (auto& p : ps) p.set_grad(randn(p.sizes()).to(Device::cuda(0)));
  };
  grads(a, 1);
  oa.step();
  EXPECT_EQ(stats.counter(MemoryCategory::OptimizerState).current - before, 2 * 4 * 1100);
  StateDict sd = oa.state_dict();
  for (auto& [k, t] : sd.tensors) t = t.cpu();  // as a checkpoint file would hold it
  auto b = params_on({a[0].detach().cpu(), a[1].detach().cpu()}, Device::cuda(0));
  Adam ob(b, o);
  ob.load_state_dict(sd);
  EXPECT_TRUE(ob.state(b[0])->buffers.at("exp_avg").is_cuda());
  for (int s = 0; s < 3; ++s) {
    grads(a, 10 + s);
    grads(b, 10 + s);
    oa.step();
    ob.step();
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>());
}

TEST(OptimCuda, MultiTensorNormAndClip) {
  SKIP_WITHOUT_CUDA();
  manual_seed(10);
  std::vector<Tensor> cpu, gpu;
  for (auto& s : shapes()) {
    cpu.push_back(randn(s));
    gpu.push_back(cpu.back().to(Device::cuda(0)));
  }
  gpu.push_back(randn({5, 7}).t().to(Device::cuda(0)));  // strided
  cpu.push_back(gpu.back().cpu());
  gpu.push_back(randn({333}).to(DType::bf16).to(Device::cuda(0)));  // another dtype
  cpu.push_back(gpu.back().cpu());
  for (double p : {2.0, 1.0, 3.0, double(INFINITY)}) {
    const double c = kernels::multi_tensor_norm(cpu, p), g = kernels::multi_tensor_norm(gpu, p);
    EXPECT_NEAR(g, c, 1e-6 * c) << "norm_type " << p;
  }
  // clip_grad_norm_ on device parameters.
  std::vector<Tensor> ps;
  for (auto& t : gpu) {
    Tensor p = nn::parameter(zeros_like(t));
    p.set_grad(t.clone());
    ps.push_back(p);
  }
  const double total = clip_grad_norm_(ps, 1.0);
  EXPECT_NEAR(total, kernels::multi_tensor_norm(cpu, 2.0), 1e-6 * total);
  std::vector<Tensor> clipped;
  for (auto& p : ps) clipped.push_back(p.grad());
  EXPECT_NEAR(kernels::multi_tensor_norm(clipped, 2.0), 1.0, 1e-3);
  // A NaN anywhere is reported.
  gpu[3].fill_(NAN);
  EXPECT_TRUE(std::isnan(kernels::multi_tensor_norm(gpu, 2.0)));
  EXPECT_TRUE(std::isnan(kernels::multi_tensor_norm(gpu, INFINITY)));
}

}  // namespace
}  // namespace mg::optim
