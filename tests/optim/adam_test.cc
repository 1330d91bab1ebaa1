// Adam/AdamW against a hand-written f64 reference of torch.optim's rule, fused vs
// per-parameter paths, lazy state, parameter groups, validation and state_dict round trips.
// First: optim_math's unqualified sqrt must find the C library's, as in kernels/cpu/optim.cc, not
// mg::sqrt(Tensor) that the headers below declare.
#include "kernels/optim_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/autocast_policy.h"
#include "autograd/functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "kernels/optim.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace mg::optim {
namespace {

struct Ref {  // one scalar parameter's reference state
  double p, m = 0, v = 0, vmax = 0;
  int t = 0;
};

// torch.optim.Adam / AdamW (foreach=False), written out in doubles.
void ref_step(Ref& r, double g, const AdamOptions& o, bool adamw) {
  ++r.t;
  if (o.maximize) g = -g;
  if (o.weight_decay != 0) {
    if (adamw)
      r.p *= 1 - o.lr * o.weight_decay;
    else
      g += o.weight_decay * r.p;
  }
  r.m = o.beta1 * r.m + (1 - o.beta1) * g;
  r.v = o.beta2 * r.v + (1 - o.beta2) * g * g;
  double v = r.v;
  if (o.amsgrad) {
    r.vmax = std::max(r.vmax, r.v);
    v = r.vmax;
  }
  const double bc1 = 1 - std::pow(o.beta1, r.t), bc2 = 1 - std::pow(o.beta2, r.t);
  r.p -= o.lr / bc1 * r.m / (std::sqrt(v) / std::sqrt(bc2) + o.eps);
}

AdamOptions opts(double lr, double wd, bool amsgrad, bool maximize, bool fused) {
  AdamOptions o;
  o.lr = lr;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = wd;
  o.amsgrad = amsgrad;
  o.maximize = maximize;
  o.fused = fused;
  return o;
}

std::unique_ptr<Optimizer> make_opt(const std::vector<Tensor>& ps, const AdamOptions& o, bool adamw) {
  if (!adamw) return std::make_unique<Adam>(ps, o);
  AdamWOptions w;
  static_cast<AdamOptions&>(w) = o;
  return std::make_unique<AdamW>(ps, w);
}

TEST(Adam, MatchesHandWrittenReference) {
  struct C {
    const char* name;
    AdamOptions o;
    bool adamw;
  };
  const std::vector<C> cases = {
      {"adam", opts(0.1, 0, false, false, true), false},
      {"adam_l2", opts(0.05, 0.1, false, false, true), false},
      {"adam_amsgrad", opts(0.1, 0, true, false, true), false},
      {"adam_maximize", opts(0.1, 0.01, false, true, true), false},
      {"adamw", opts(0.1, 0.1, false, false, true), true},
      {"adamw_amsgrad", opts(0.02, 0.5, true, false, true), true},
  };
  manual_seed(1);
  const int n = 7, steps = 6;
  Tensor grads = randn({steps, n}, {DType::f64});
  Tensor p0 = randn({n}, {DType::f64});
  const auto gv = grads.to_vector<double>(), pv = p0.to_vector<double>();
  for (const C& c : cases)
    for (bool fused : {true, false})
      for (DType dt : {DType::f64, DType::f32}) {
        SCOPED_TRACE(std::string(c.name) + (fused ? " fused " : " per-param ") + (dt == DType::f64 ? "f64" : "f32"));
        AdamOptions o = c.o;
        o.fused = fused;
        Tensor p = nn::parameter(p0.to(dt).clone());
        auto opt = make_opt({p}, o, c.adamw);
        std::vector<Ref> ref(n);
        for (int i = 0; i < n; ++i) ref[i].p = pv[i];
        for (int s = 0; s < steps; ++s) {
          p.set_grad(grads.select(0, s).contiguous().to(dt));
          const uint32_t ver = p.version();
          opt->step();
          EXPECT_NE(p.version(), ver);
          for (int i = 0; i < n; ++i) ref_step(ref[i], gv[s * n + i], o, c.adamw);
          const auto got = p.to_vector<double>();
          for (int i = 0; i < n; ++i)
            EXPECT_NEAR(got[i], ref[i].p, dt == DType::f64 ? 1e-12 : 2e-5 * (1 + std::fabs(ref[i].p)))
                << "step " << s + 1 << " element " << i;
        }
      }
}

// The CPU loop's vectorized path (no amsgrad, no maximize: kernels/cpu/optim.cc's adam_range, the
// AVX2 clone where the CPU has it) runs optim_math::adam_element's operations in the same order
// on every element: the result is the scalar rule's, bit for bit, over several threads' slices.
TEST(Adam, CpuLoopIsTheElementRuleBitwise) {
  manual_seed(5);
  for (bool adamw : {false, true}) {
    const AdamOptions o = opts(1e-2, 0.1, false, false, true);
    const Tensor init = randn({100003});
    Tensor p = nn::parameter(init.clone());
    auto opt = make_opt({p}, o, adamw);
    std::vector<float> rp = init.to_vector<float>(), rm(rp.size(), 0.f), rv(rp.size(), 0.f);
    const kernels::optim_math::AdamScalars<float> sc{
        float(o.lr), float(o.beta1), float(o.beta2), float(o.eps), float(o.weight_decay), adamw, false, false};
    for (int s = 1; s <= 3; ++s) {
      const Tensor g = randn({100003});
      p.set_grad(g);
      opt->step();
      double step_size = 0, bc2_sqrt = 0;
      kernels::optim_math::adam_bias_corrections(o.lr, o.beta1, o.beta2, double(s), &step_size, &bc2_sqrt);
      const auto gv = g.to_vector<float>();
      for (size_t j = 0; j < rp.size(); ++j)
        kernels::optim_math::adam_element<float>(rp[j], gv[j], rm[j], rv[j], nullptr, sc, float(step_size),
                                                 float(bc2_sqrt));
    }
    const auto got = p.to_vector<float>();
    for (size_t j = 0; j < rp.size(); ++j) ASSERT_EQ(got[j], rp[j]) << (adamw ? "AdamW" : "Adam") << " element " << j;
  }
}

// A host update (memory/host_params.h) steps an f32 parameter straight from the 16-bit gradient
// the device copied home and writes the parameter's 16-bit cast in the same pass. Widening a
// bf16/f16 value to f32 is exact, and the cast is round-to-nearest of the new f32 value, so both
// must equal, bit for bit, the gradient cast to f32 first and the result cast after.
TEST(Adam, SixteenBitGradientsAndCastTargetEqualTheF32PathBitwise) {
  manual_seed(6);
  for (DType gdt : {DType::bf16, DType::f16}) {
    for (bool amsgrad : {false, true}) {  // the vectorized loop and the per-element one
      const AdamOptions o = opts(1e-2, 0.1, amsgrad, false, true);
      const Tensor init = randn({70001});
      Tensor a = nn::parameter(init.clone()), b = nn::parameter(init.clone());
      auto oa = make_opt({a}, o, true), ob = make_opt({b}, o, true);
      Tensor cast = empty(init.sizes(), {gdt});
      static_cast<Adam&>(*oa).set_cast_target(a, cast);
      for (int s = 1; s <= 3; ++s) {
        const Tensor g = randn({70001}).to(gdt);
        const uint32_t v0 = cast.version();
        a.set_grad(g);
        b.set_grad(g.to(DType::f32));
        oa->step();
        ob->step();
        EXPECT_GT(cast.version(), v0) << "the step wrote the cast target";
        ASSERT_EQ(a.to_vector<float>(), b.to_vector<float>()) << gdt << " gradients, step " << s;
        ASSERT_EQ(cast.to(DType::f32).to_vector<float>(), b.to(gdt).to(DType::f32).to_vector<float>())
            << gdt << " cast, step " << s;
        EXPECT_EQ(oa->state(a)->buffers.at("exp_avg").to_vector<float>(),
                  ob->state(b)->buffers.at("exp_avg").to_vector<float>());
      }
    }
  }
  // The per-parameter path (not fused) widens a 16-bit gradient before its ops: the same bits as
  // the gradient given in f32.
  {
    AdamWOptions o;
    o.fused = false;
    const Tensor init = randn({333});
    Tensor a = nn::parameter(init.clone()), b = nn::parameter(init.clone());
    AdamW oa({a}, o), ob({b}, o);
    EXPECT_FALSE(oa.widens_16bit_grads());
    for (int s = 0; s < 3; ++s) {
      const Tensor g = randn({333}).to(DType::bf16);
      a.set_grad(g);
      b.set_grad(g.to(DType::f32));
      oa.step();
      ob.step();
    }
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  }
  // A cast target must match the parameter; an undefined one removes it.
  Tensor p = nn::parameter(randn({8}));
  AdamW opt({p});
  EXPECT_THROW(opt.set_cast_target(p, empty({9}, {DType::bf16})), ValueError);
  EXPECT_THROW(opt.set_cast_target(p, empty({8}, {DType::f32})), ValueError);
  Tensor c = empty({8}, {DType::bf16});
  opt.set_cast_target(p, c);
  opt.set_cast_target(p, Tensor());
  const uint32_t v0 = c.version();
  p.set_grad(randn({8}));
  opt.step();
  EXPECT_EQ(c.version(), v0);
}

// The CPU low-copy writer (an update's low copies, HostParams' casts) rounds as a cast does,
// bit for bit, NaN and infinities included; bad input names both tensors.
TEST(Adam, WriteLowCopyIsTheCastBitwise) {
  Tensor p = randn({70001});
  std::vector<float> v = p.to_vector<float>();
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = std::numeric_limits<float>::infinity();
  v[2] = -std::numeric_limits<float>::infinity();
  v[3] = 1.0f + 1.0f / 256.0f;  // a bf16 tie: rounds to even
  v[4] = 70000.0f;              // beyond f16's range: infinity
  p = from_vector(v, {70001});
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor low = empty({70001}, {dt});
    kernels::write_low_copy(p, low);
    Tensor want = empty({70001}, {dt});
    raw::copy_(want, p);
    const auto* a = static_cast<const uint16_t*>(low.raw_data());
    const auto* b = static_cast<const uint16_t*>(want.raw_data());
    for (int64_t j = 0; j < 70001; ++j) ASSERT_EQ(a[j], b[j]) << dt << " element " << j;
  }
  EXPECT_THROW(kernels::write_low_copy(p, empty({70000}, {DType::bf16})), ValueError);
  EXPECT_THROW(kernels::write_low_copy(p, empty({70001}, {DType::f32})), ValueError);
  EXPECT_THROW(kernels::write_low_copy(p.to(DType::f64), empty({70001}, {DType::bf16})), ValueError);
}

// adam_multi_tensor_ takes 16-bit gradients for f32 parameters on the CPU only where they are
// f16/bf16 of the parameter's shape; anything else names the op and the list entry.
TEST(Adam, MultiTensorGradientDtypeChecks) {
  kernels::AdamTensors t;
  t.params = {randn({4})};
  t.exp_avg = {zeros({4})};
  t.exp_avg_sq = {zeros({4})};
  t.steps = {1};
  kernels::AdamHyper h;
  t.grads = {randn({4}).to(DType::f64)};
  EXPECT_THROW(kernels::adam_multi_tensor_(t, h), DTypeError);
  t.grads = {randn({5}).to(DType::bf16)};
  EXPECT_THROW(kernels::adam_multi_tensor_(t, h), ShapeError);
  t.grads = {randn({4}).to(DType::bf16)};
  EXPECT_NO_THROW(kernels::adam_multi_tensor_(t, h));
  t.params = {randn({4}).to(DType::f64)};
  t.exp_avg = {zeros({4}, {DType::f64})};
  t.exp_avg_sq = {zeros({4}, {DType::f64})};
  EXPECT_THROW(kernels::adam_multi_tensor_(t, h), DTypeError);  // f64 parameters take f64 gradients
}

TEST(Adam, FusedEqualsPerParameter) {
  // Several shapes, one non-contiguous parameter (it takes the per-parameter path even when
  // fused), a parameter without gradient on some steps (its own step count lags).
  manual_seed(2);
  for (DType dt : {DType::f64, DType::f32}) {
    for (bool adamw : {false, true}) {
      std::vector<Tensor> a, b;
      for (Shape s : std::vector<Shape>{{3, 5}, {17}, {1}, {4, 4, 3}, {70000}}) {
        Tensor init = randn(s, {dt});
        a.push_back(nn::parameter(init.clone()));
        b.push_back(nn::parameter(init.clone()));
      }
      Tensor base = randn({6, 4}, {dt});
      a.push_back(nn::parameter(base.clone().t()));  // non-contiguous leaf
      b.push_back(nn::parameter(base.clone().t()));
      auto oa = make_opt(a, opts(0.01, 0.05, true, false, true), adamw);
      auto ob = make_opt(b, opts(0.01, 0.05, true, false, false), adamw);
      for (int step = 0; step < 5; ++step) {
        for (size_t i = 0; i < a.size(); ++i) {
          if (i == 2 && step % 2 == 0) {
            a[i].set_grad(Tensor());
            b[i].set_grad(Tensor());
            continue;
          }
          Tensor g = randn(a[i].sizes(), {dt});
          a[i].set_grad(g);
          b[i].set_grad(g.clone());
        }
        oa->step();
        ob->step();
      }
      for (size_t i = 0; i < a.size(); ++i) {
        const auto va = a[i].to_vector<double>(), vb = b[i].to_vector<double>();
        for (size_t j = 0; j < va.size(); ++j)
          ASSERT_NEAR(va[j], vb[j], (dt == DType::f64 ? 1e-13 : 1e-6) * (1 + std::fabs(vb[j]))) << "param " << i;
      }
      EXPECT_EQ(oa->state(a[2])->step, 2);
    }
  }
}

TEST(Adam, LazyStateCountedAsOptimizerState) {
  Tensor a = nn::parameter(ones({1000})), b = nn::parameter(ones({10}));
  auto& stats = CategoryStats::get(Device::cpu());
  const int64_t before = stats.counter(MemoryCategory::OptimizerState).current;
  Adam opt({a, b}, opts(0.1, 0, true, false, true));
  EXPECT_EQ(opt.state_size(), 0u);
  EXPECT_EQ(opt.state_nbytes(), 0);
  a.set_grad(ones({1000}));
  opt.step();
  EXPECT_EQ(opt.state_size(), 1u);
  EXPECT_EQ(opt.state(b), nullptr);
  // exp_avg, exp_avg_sq, max_exp_avg_sq: three f32 copies of a.
  EXPECT_EQ(opt.state_nbytes(), 3 * 4000);
  EXPECT_EQ(stats.counter(MemoryCategory::OptimizerState).current - before, 3 * 4000);
}

TEST(Adam, ParamGroupsBackboneAndHead) {
  // The seeds' example: a pretrained backbone at 1e-5, a fresh head at 1e-3. Adam's first
  // step moves every weight by lr * g / (|g| + eps'), i.e. by almost exactly lr.
  auto backbone = std::make_shared<nn::Linear>(4, 4, true, TensorOptions(DType::f64));
  auto head = std::make_shared<nn::Linear>(4, 2, true, TensorOptions(DType::f64));
  AdamOptions d;
  d.lr = 1e-2;
  Adam opt({{backbone->parameters(), {{"lr", 1e-5}}}, {head->parameters(), {{"lr", 1e-3}, {"beta2", 0.99}}}}, d);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr(), 1e-5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].get("beta2"), 0.999);  // the default
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].get("beta2"), 0.99);
  const auto bw = backbone->weight.to_vector<double>(), hw = head->weight.to_vector<double>();
  for (auto& p : backbone->parameters()) p.set_grad(full_like(p, 0.5));
  for (auto& p : head->parameters()) p.set_grad(full_like(p, -2.0));
  opt.step();
  const auto bw1 = backbone->weight.to_vector<double>(), hw1 = head->weight.to_vector<double>();
  for (size_t i = 0; i < bw.size(); ++i) EXPECT_NEAR(bw[i] - bw1[i], 1e-5, 1e-11);
  for (size_t i = 0; i < hw.size(); ++i) EXPECT_NEAR(hw1[i] - hw[i], 1e-3, 1e-9);
}

TEST(Adam, Bf16ParametersKeepF32StateAndRoundStochastically) {
  // 4096 weights at 1.0 and a constant gradient: each Adam step moves them by ~lr = 1e-4, far
  // below half of bf16's spacing at 1.0 (2^-8), so round-to-nearest would never move them;
  // with stochastic rounding their mean follows the f32 trajectory.
  manual_seed(6);
  for (bool adamw : {false, true}) {
    Tensor p = nn::parameter(ones({4096}, {DType::bf16}));
    auto opt = make_opt({p}, opts(1e-4, 0.0, false, false, true), adamw);
    for (int s = 0; s < 100; ++s) {
      p.set_grad(ones({4096}, {DType::bf16}));
      opt->step();
    }
    EXPECT_EQ(p.dtype(), DType::bf16);
    EXPECT_EQ(opt->state(p)->buffers.at("exp_avg").dtype(), DType::f32);
    EXPECT_EQ(opt->state(p)->buffers.at("exp_avg_sq").dtype(), DType::f32);
    double mean = 0;
    for (double v : p.to_vector<double>()) mean += v / 4096;
    EXPECT_NEAR(mean, 1.0 - 100 * 1e-4, 2e-4) << (adamw ? "AdamW" : "Adam");
  }
}

TEST(Adam, BadOptionsAreValueErrors) {
  Tensor p = nn::parameter(ones({2}));
  AdamOptions o;
  o.beta1 = 1.0;
  try {
    Adam bad({p}, o);
    FAIL() << "beta1 = 1 accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("beta parameter at index 0"), std::string::npos) << e.what();
  }
  o = AdamOptions();
  o.eps = -1;
  EXPECT_THROW(Adam({p}, o), ValueError);
  o = AdamOptions();
  o.lr = -1;
  EXPECT_THROW(Adam({p}, o), ValueError);
  EXPECT_THROW(Adam(std::vector<ParamGroup>{{{p}, {{"betas", 0.9}}}}, AdamOptions()), ValueError);
}

// Runs `steps` updates with gradients drawn from `seed`.
void run_steps(Optimizer& opt, const std::vector<Tensor>& ps, int steps, uint64_t seed) {
  manual_seed(seed);
  for (int s = 0; s < steps; ++s) {
    for (auto& p : ps) p.set_grad(randn(p.sizes(), {p.dtype()}));
    opt.step();
  }
}

std::vector<Tensor> clone_params(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (auto& p : ps) out.push_back(nn::parameter(p.detach().clone()));
  return out;
}

// AdamW under autocast writes the next region's weight casts in its update and hands them to
// the cast cache: after each step the cache holds one cast per weight the model used (none
// without write_autocast_casts), and the next region's lookups return those very tensors, each
// bitwise the weight's own cast, so training is bitwise the same as without. A weight changed
// after the step gets a fresh cast. On the CPU (bf16), and on CUDA (bf16 and f16)
// when present.
TEST(AdamW, WritesTheNextAutocastRegionsCastsAndTrainsTheSame) {
  std::vector<std::pair<Device, DType>> cases = {{Device::cpu(), DType::bf16}};
  if (cuda::is_available()) cases.insert(cases.end(), {{Device::cuda(0), DType::bf16}, {Device::cuda(0), DType::f16}});
  for (auto [dev, low] : cases) {
    SCOPED_TRACE(dev.str() + " " + dtype_name(low));
    const DeviceType type = dev.is_cuda() ? DeviceType::CUDA : DeviceType::CPU;
    // Four steps of one model, alone on this thread (another model's region would clear the
    // cache in between); returns the losses and the final parameters.
    const auto train = [&](bool write) {
      Generator g(11), data(12);
      nn::Sequential m;
      m.push_back(std::make_shared<nn::Linear>(16, 32, true, TensorOptions{DType::f32, dev}, &g));
      m.push_back(std::make_shared<nn::GELU>());
      m.push_back(std::make_shared<nn::Linear>(32, 4, true, TensorOptions{DType::f32, dev}, &g));
      AdamWOptions o;
      o.lr = 1e-2;
      o.write_autocast_casts = write;
      AdamW opt(m.parameters(), o);
      std::vector<double> losses;
      std::vector<Tensor> provided;  // the update's casts, from the step before
      for (int step = 0; step < 4; ++step) {
        const Tensor x = randn({8, 16}, {DType::f32, dev}, &data);
        opt.zero_grad();
        {
          Autocast ac(type, low);
          for (size_t i = 0; i < provided.size(); ++i) {
            const Tensor p = m.parameters()[i], c = autocast::lower(p);
            EXPECT_TRUE(c.is_same(provided[i])) << "step " << step << ": parameter " << i << " was cast again";
            EXPECT_EQ(c.to(DType::f32).to_vector<float>(), p.detach().to(low).to(DType::f32).to_vector<float>());
          }
          Tensor loss = mean(square(m.forward(x)));
          loss.backward();
          losses.push_back(loss.item());
        }
        opt.step();
        EXPECT_EQ(autocast::cache_size(), write ? 4u : 0u) << "after step " << step;
        provided.clear();
        for (const Tensor& p : m.parameters()) {
          const Tensor c = autocast::provided_cast(p);
          EXPECT_EQ(c.defined(), write);
          if (write) provided.push_back(c);
        }
      }
      if (write) {  // a weight changed after its step: the next region casts the new value
        Tensor w = m.parameters()[0];
        {
          NoGradGuard ng;
          add_(w, 0.5);
        }
        EXPECT_FALSE(autocast::provided_cast(w).defined());
        Autocast ac(type, low);
        const Tensor c = autocast::lower(w);
        EXPECT_FALSE(c.is_same(provided[0]));
        EXPECT_EQ(c.to(DType::f32).to_vector<float>(), w.detach().to(low).to(DType::f32).to_vector<float>());
      }
      return losses;
    };
    EXPECT_EQ(train(true), train(false));
  }
}

TEST(OptimizerStateDict, ResumeIsBitIdentical) {
  manual_seed(3);
  std::vector<Tensor> ps = {nn::parameter(randn({5, 3})), nn::parameter(randn({3})), nn::parameter(randn({2}))};
  auto check = [&](auto make) {
    std::vector<Tensor> a = clone_params(ps);
    auto oa = make(a);
    run_steps(*oa, a, 3, 10);
    // "Checkpoint": copies of the parameters and of the optimizer's state_dict.
    StateDict sd = oa->state_dict();
    for (auto& [k, t] : sd.tensors) t = t.clone();
    const nlohmann::json meta = nlohmann::json::parse(sd.meta.dump());  // through text, like a file
    sd.meta = meta;
    std::vector<Tensor> b = clone_params(a);
    run_steps(*oa, a, 4, 11);  // the uninterrupted run
    auto ob = make(b);
    ob->param_groups()[0].set_lr(123.0);  // overwritten by the load
    ob->load_state_dict(sd);
    EXPECT_EQ(ob->state_nbytes(), oa->state_nbytes());
    run_steps(*ob, b, 4, 11);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << "param " << i;
  };
  AdamOptions ao;
  ao.lr = 0.01;
  ao.amsgrad = true;
  check([&](std::vector<Tensor> p) { return std::make_unique<Adam>(p, ao); });
  check([&](std::vector<Tensor> p) { return std::make_unique<AdamW>(p, AdamWOptions()); });
  SGDOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  check([&](std::vector<Tensor> p) { return std::make_unique<SGD>(p, so); });
}

TEST(OptimizerStateDict, LayoutAndMismatches) {
  Tensor a = nn::parameter(ones({2, 2})), b = nn::parameter(ones({3}));
  Adam opt(std::vector<ParamGroup>{{{a}, {}}, {{b}, {{"lr", 0.5}}}}, AdamOptions());
  b.set_grad(ones({3}));
  opt.step();
  StateDict sd = opt.state_dict();
  EXPECT_EQ(sd.meta["type"], "Adam");
  EXPECT_EQ(sd.meta["param_groups"][1]["params"][0], 1);
  EXPECT_DOUBLE_EQ(sd.meta["param_groups"][1]["lr"].get<double>(), 0.5);
  EXPECT_EQ(sd.meta["state"]["1"]["step"], 1);
  EXPECT_FALSE(sd.meta["state"].contains("0"));  // lazy: a never had a gradient
  EXPECT_TRUE(sd.tensors.count("state.1.exp_avg"));
  EXPECT_TRUE(sd.tensors.count("state.1.exp_avg_sq"));

  // Wrong optimizer type, wrong group layout, wrong shapes: errors, and nothing changes.
  SGD sgd({ones({2, 2}).requires_grad_()}, SGDOptions());
  EXPECT_THROW(sgd.load_state_dict(sd), ValueError);
  Adam one_group({nn::parameter(ones({2, 2})), nn::parameter(ones({3}))}, AdamOptions());
  EXPECT_THROW(one_group.load_state_dict(sd), ValueError);
  Adam wrong_shape(std::vector<ParamGroup>{{{nn::parameter(ones({2, 2}))}, {}}, {{nn::parameter(ones({4}))}, {}}},
                   AdamOptions());
  EXPECT_THROW(wrong_shape.load_state_dict(sd), ShapeError);
  EXPECT_EQ(wrong_shape.state_size(), 0u);
  EXPECT_DOUBLE_EQ(wrong_shape.param_groups()[1].lr(), 1e-3);
  Adam same(std::vector<ParamGroup>{{{nn::parameter(ones({2, 2}))}, {}}, {{nn::parameter(ones({3}))}, {}}},
            AdamOptions());
  StateDict broken = sd;
  broken.meta["state"]["7"] = {{"step", 1}};  // no parameter 7
  EXPECT_THROW(same.load_state_dict(broken), ValueError);
  broken = sd;
  broken.meta.erase("param_groups");
  EXPECT_THROW(same.load_state_dict(broken), ValueError);
  broken = sd;
  broken.meta["param_groups"][0]["beta1"] = 1.5;  // fails validation
  EXPECT_THROW(same.load_state_dict(broken), ValueError);
  EXPECT_EQ(same.state_size(), 0u);
  same.load_state_dict(sd);
  EXPECT_EQ(same.state_size(), 1u);
  EXPECT_DOUBLE_EQ(same.param_groups()[1].lr(), 0.5);
}

}  // namespace
}  // namespace mg::optim
