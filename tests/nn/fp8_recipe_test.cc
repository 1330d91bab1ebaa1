// The FP8 recipe (mg::Fp8Autocast, autograd/fp8_linear.h) on the CPU, whose FP8 GEMM is the
// reference (kernels/cpu/fp8.cc): a linear layer under it runs on the codes of its operands
// and only inside an f16/bf16 autocast region; its output and gradients stay within the error
// the formats' rounding allows against f64; a small GPT trains under it as under bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include "autograd/autocast_policy.h"
#include "autograd/fp8_linear.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/recompute.h"
#include "autograd/residual.h"
#include "autograd/transformer_functions.h"
#include "core/autocast.h"
#include "core/device_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/fp8_math.h"
#include "nn/linear.h"
#include "nn/models/gpt.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "serialize/serialize.h"
#include "serialize/training_checkpoint.h"
#include "tests/error_of.h"

namespace mg {
namespace {

using autograd::Fp8HistoryState;
using kernels::Fp8Format;

Tensor bf16_values(const Tensor& t) { return raw::to_dtype(raw::to_dtype(t, DType::bf16), DType::f32); }

TEST(Fp8Recipe, LinearRunsOnTheCodesInsideTheRecipeOnly) {
  Generator g(1);
  nn::Linear lin(64, 48, true, {}, &g);
  const Tensor x = randn({2, 16, 64}, {}, &g);
  const Tensor plain = lin(x);
  {
    Fp8Autocast fp8(true, 0);  // no autocast region: the recipe does not apply
    EXPECT_EQ(lin(x).to_vector<float>(), plain.to_vector<float>());
  }
  Tensor bf16_out, fp8_out;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    bf16_out = lin(x);
    {
      Fp8Autocast by_default;  // 64 and 48 features, under the default's 1280: bf16
      EXPECT_EQ(raw::to_dtype(lin(x), DType::f32).to_vector<float>(),
                raw::to_dtype(bf16_out, DType::f32).to_vector<float>());
    }
    Fp8Autocast fp8(true, 0);
    fp8_out = lin(x);
    EXPECT_EQ(fp8_out.dtype(), DType::bf16);
  }
  // The same GEMM by hand: x cast to bf16 (autocast), then to e4m3 codes; the f32 weight cast to
  // e4m3 codes itself (the recipe makes no bf16 copy of it: fp8_keeps_f32_weight).
  const Tensor x2 = raw::reshape(raw::to_dtype(x, DType::bf16), {32, 64});
  const Tensor want = kernels::fp8_gemm(kernels::fp8_cast(x2, Fp8Format::E4M3, true, false),
                                        kernels::fp8_cast(lin.weight, Fp8Format::E4M3, true, false),
                                        raw::to_dtype(lin.bias, DType::bf16), DType::bf16);
  EXPECT_EQ(raw::to_dtype(fp8_out, DType::f32).to_vector<float>(),
            raw::to_dtype(raw::reshape(want, {2, 16, 48}), DType::f32).to_vector<float>());
  EXPECT_NE(raw::to_dtype(fp8_out, DType::f32).to_vector<float>(),
            raw::to_dtype(bf16_out, DType::f32).to_vector<float>());
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast narrow(true, 64);  // 64 in, 48 out: narrower than 64, so bf16
    EXPECT_EQ(raw::to_dtype(lin(x), DType::f32).to_vector<float>(),
              raw::to_dtype(bf16_out, DType::f32).to_vector<float>());
    Fp8Autocast wide(true, 48);  // both at least 48: FP8
    EXPECT_EQ(raw::to_dtype(lin(x), DType::f32).to_vector<float>(),
              raw::to_dtype(fp8_out, DType::f32).to_vector<float>());
  }
  EXPECT_THROW(Fp8Autocast(true, -1), ValueError);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0);
    Fp8Autocast off(false);  // nested off: the region's bf16 again
    EXPECT_EQ(raw::to_dtype(lin(x), DType::f32).to_vector<float>(),
              raw::to_dtype(bf16_out, DType::f32).to_vector<float>());
  }
}

// Fp8Autocast's accumulation for the gradients' GEMMs: promoted unless asked, restored when the
// guard closes, and the same results on the CPU (its reference GEMM accumulates in f32 either way).
TEST(Fp8Recipe, GradientAccumulationIsTheGuardsAndRestored) {
  EXPECT_FALSE(autocast_state().fp8_fast_grads);
  Generator g(4);
  nn::Linear lin(64, 48, true, {}, &g);
  const Tensor x = randn({2, 16, 64}, {}, &g);
  std::vector<std::vector<float>> grads;
  for (Fp8Accumulation acc : {Fp8Accumulation::Promoted, Fp8Accumulation::Fast}) {
    lin.zero_grad();
    {
      Autocast ac(DeviceType::CPU, DType::bf16);
      Fp8Autocast fp8(true, 0, Fp8Scaling::Current, acc);
      EXPECT_EQ(autocast_state().fp8_fast_grads, acc == Fp8Accumulation::Fast);
      {
        Fp8Autocast inner(true, 0);  // the default inside: promoted again
        EXPECT_FALSE(autocast_state().fp8_fast_grads);
      }
      EXPECT_EQ(autocast_state().fp8_fast_grads, acc == Fp8Accumulation::Fast);
      sum(lin(x).to(DType::f32)).backward();
    }
    EXPECT_FALSE(autocast_state().fp8_fast_grads);
    grads.push_back(lin.weight.grad().to_vector<float>());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// A branch of the residual stream leaves its bias to the stream's next norm, except under the
// recipe, whose GEMM adds it and whose gradient cast sums it: there the branch's output carries
// the bias and none is left pending. So for the MLP, whose two layers the recipe takes together.
TEST(Fp8Recipe, BranchesKeepTheirBiasInTheGemmUnderTheRecipe) {
  Generator g(3);
  nn::Linear lin(64, 48, true, {}, &g);
  nn::TransformerBlockOptions o;
  o.n_embd = 64, o.n_head = 4;
  nn::MLP mlp(o, {}, &g);
  const Tensor x = randn({2, 16, 64}, {}, &g);
  Autocast ac(DeviceType::CPU, DType::bf16);
  {
    const Branch b = lin.branch(x), m = mlp.branch(x);
    EXPECT_EQ(b.bias.impl(), lin.bias.impl());  // bf16: the stream adds the biases
    EXPECT_EQ(m.bias.impl(), mlp.c_proj->bias.impl());
  }
  Fp8Autocast fp8(true, 0);
  const Branch b = lin.branch(x), m = mlp.branch(x);
  EXPECT_FALSE(b.bias.defined());
  EXPECT_FALSE(m.bias.defined());
  EXPECT_EQ(raw::to_dtype(b.out, DType::f32).to_vector<float>(), raw::to_dtype(lin(x), DType::f32).to_vector<float>());
  EXPECT_EQ(raw::to_dtype(m.out, DType::f32).to_vector<float>(), raw::to_dtype(mlp(x), DType::f32).to_vector<float>());
  EXPECT_TRUE(fp8_takes_linear(x, lin.weight));
  EXPECT_TRUE(fp8_takes_gelu_mlp(x, mlp.c_fc->weight, mlp.c_proj->weight));
  EXPECT_FALSE(fp8_takes_gelu_mlp(x, mlp.c_fc->weight, mlp.c_fc->weight));  // 256 out into 64 in: no chain
  Fp8Autocast narrow(true, 1280);  // 64 features: bf16 again, and the stream adds the bias
  EXPECT_FALSE(fp8_takes_linear(x, lin.weight));
  EXPECT_EQ(lin.branch(x).bias.impl(), lin.bias.impl());
}

// One element's error after current scaling to `f`: half a step of its binade (2^-(M+1) of it)
// for a normal, else half the subnormal step; both in the tensor's units (amax maps to the
// format's largest finite value).
double quant_error(double v, double amax, const kernels::fp8_math::Format& f) {
  const double unit = amax / f.max_finite;  // the tensor's value of code value 1
  const double min_normal = std::ldexp(1.0, 1 - f.bias) * unit;
  return std::fabs(v) >= min_normal ? std::ldexp(std::fabs(v), -(f.mantissa_bits + 1))
                                    : std::ldexp(1.0, -f.bias - f.mantissa_bits) * unit;
}

// Bound on |sum a_k b_k - sum a'_k b'_k| for operands each within its quantization error, plus
// the f32 sum (K 2^-24 of sum |a b|) and the result's rounding to `out_ulp` of its magnitude.
struct Dot {
  double exact = 0, bound = 0;
};
Dot dot_bound(const std::vector<float>& a, int64_t ia, int64_t sa, double amax_a, const kernels::fp8_math::Format& fa,
              const std::vector<float>& b, int64_t ib, int64_t sb, double amax_b, const kernels::fp8_math::Format& fb,
              int64_t K, double out_rel) {
  Dot d;
  double mag = 0;
  for (int64_t k = 0; k < K; ++k) {
    const double x = a[ia + k * sa], y = b[ib + k * sb];
    const double ex = quant_error(x, amax_a, fa), ey = quant_error(y, amax_b, fb);
    d.exact += x * y;
    d.bound += ex * std::fabs(y) + std::fabs(x) * ey + ex * ey;
    mag += std::fabs(x * y);
  }
  d.bound += (K * 0x1p-24) * (mag + d.bound) + out_rel * (std::fabs(d.exact) + d.bound);
  return d;
}

double amax_of(const std::vector<float>& v) {
  double m = 0;
  for (float e : v) m = std::max(m, std::fabs(static_cast<double>(e)));
  return m;
}

// The recipe casts the f32 weights of the layers it takes to FP8 from f32: the region's cast cache
// holds the biases' bf16 casts only, for the linear and for the MLP, where a bf16 region without
// the recipe holds the weights' too, and so does the recipe for a layer it does not take; each
// weight's gradient comes in f32. Each case makes its own layers, which are gone before the next
// (a region casts ahead the weights the regions before it cast, while they live).
TEST(Fp8Recipe, TheRecipeKeepsNoBf16CopyOfTheWeightsItTakes) {
  const Tensor x = randn({32, 64});
  // The cache's size inside a region running a linear (64 -> 48) or the MLP (64 -> 48 -> 48).
  const auto cache_in_region = [&](bool mlp, bool fp8, int64_t min_features) {
    Generator g(8);
    const auto param = [&](Shape s) { return kernels::mul_scalar(randn(s, {}, &g), 0.1).requires_grad_(true); };
    const Tensor w = param({48, 64}), b = param({48}), w_proj = param({48, 48}), b_proj = param({48});
    size_t cached = 0;
    {
      Autocast ac(DeviceType::CPU, DType::bf16);
      Fp8Autocast recipe(fp8, min_features);
      const Tensor out = mlp ? gelu_mlp(x, w, b, w_proj, b_proj) : linear(x, w, b);
      cached = autocast::cache_size();
      sum(out.to(DType::f32)).backward();
    }
    for (const Tensor& t : mlp ? std::vector<Tensor>{w, w_proj} : std::vector<Tensor>{w}) {
      EXPECT_EQ(t.grad().dtype(), DType::f32);
      EXPECT_GT(sum(abs(t.grad())).item<float>(), 0.0f);
    }
    return cached;
  };
  EXPECT_EQ(cache_in_region(false, true, 0), 1u);     // the bias's cast
  EXPECT_EQ(cache_in_region(true, true, 0), 2u);      // the two biases'
  EXPECT_EQ(cache_in_region(false, true, 1280), 2u);  // not taken: the weight's and the bias's
  EXPECT_EQ(cache_in_region(false, false, 0), 2u);
  EXPECT_EQ(cache_in_region(true, false, 0), 4u);
}

TEST(Fp8Recipe, LinearOutputAndGradientsAreWithinTheFormatsRounding) {
  const int64_t M = 32, K = 64, N = 48;
  Generator g(2);
  nn::Linear lin(K, N, true, {}, &g);
  const Tensor x = randn({M, K}, {}, &g).requires_grad_(true);
  const Tensor r = randn({M, N}, {}, &g);
  Tensor out;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0);
    out = lin(x);
    sum(out.to(DType::f32) * r).backward();
  }
  // What the recipe's GEMMs saw: autocast's bf16 values of x, w and the gradient r.
  const std::vector<float> xv = bf16_values(x).to_vector<float>(), wv = bf16_values(lin.weight).to_vector<float>();
  const std::vector<float> gv = bf16_values(r).to_vector<float>(), bv = bf16_values(lin.bias).to_vector<float>();
  const std::vector<float> ov = raw::to_dtype(out, DType::f32).to_vector<float>();
  const std::vector<float> gx = x.grad().to_vector<float>(), gw = lin.weight.grad().to_vector<float>();
  const std::vector<float> gb = lin.bias.grad().to_vector<float>();
  const auto& e4 = kernels::fp8_math::kE4M3;
  const auto& e5 = kernels::fp8_math::kE5M2;
  const double ax = amax_of(xv), aw = amax_of(wv), ag = amax_of(gv);
  const double bf16_rel = 0x1p-8;  // bf16's rounding of a result: half its 2^-7 step
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {  // out = x w^T + b, in bf16
      const Dot d = dot_bound(xv, i * K, 1, ax, e4, wv, j * K, 1, aw, e4, K, bf16_rel);
      const double want = d.exact + bv[j];
      ASSERT_NEAR(ov[i * N + j], want, d.bound + bf16_rel * std::fabs(bv[j])) << "out " << i << ", " << j;
      worst = std::max(worst, std::fabs(ov[i * N + j] - want) / d.bound);
    }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {  // gx = g w (e5m2 x e4m3), in bf16 (x's autocast cast)
      const Dot d = dot_bound(gv, i * N, 1, ag, e5, wv, k, K, aw, e4, N, bf16_rel);
      ASSERT_NEAR(gx[i * K + k], d.exact, d.bound) << "gx " << i << ", " << k;
      worst = std::max(worst, std::fabs(gx[i * K + k] - d.exact) / d.bound);
    }
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) {  // gw = g^T x, in f32 (the weight is an f32 leaf)
      const Dot d = dot_bound(gv, j, N, ag, e5, xv, k, K, ax, e4, M, 0x1p-24);
      ASSERT_NEAR(gw[j * K + k], d.exact, d.bound) << "gw " << j << ", " << k;
      worst = std::max(worst, std::fabs(gw[j * K + k] - d.exact) / d.bound);
    }
  for (int64_t j = 0; j < N; ++j) {  // gb = the column sum of g in bf16: M additions, one rounding each
    double s = 0, mag = 0;
    for (int64_t i = 0; i < M; ++i) s += gv[i * N + j], mag += std::fabs(gv[i * N + j]);
    ASSERT_NEAR(gb[j], s, (M * 0x1p-24 + bf16_rel) * mag) << "gb " << j;
  }
  std::printf("largest error as a fraction of its bound: %.3f\n", worst);
}

// Column sums of a [R, C] tensor's values in f32, row by row (the CPU backend's order).
std::vector<float> column_sums(const Tensor& t) {
  const int64_t R = t.size(0), C = t.size(1);
  const std::vector<float> v = raw::to_dtype(t, DType::f32).to_vector<float>();
  std::vector<float> s(C, 0.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) s[c] += v[r * C + c];
  return s;
}

// The MLP under the recipe: its bias gradients are the column sums its gradient casts take, of
// the output gradient (c_proj's) and of the gradient reaching the GELU's input (c_fc's), rebuilt
// here from the recipe's pieces (kernels/fp8.h). The CPU backend runs both, so the same values
// are added in the same order: the same bits.
TEST(Fp8Recipe, MlpBiasGradientsAreTheColumnSumsOfItsGradients) {
  const int64_t M = 32, K = 48, H = 64;
  Generator g(6);
  const Tensor x = randn({M, K}, {}, &g);
  const Tensor w_fc = kernels::mul_scalar(randn({H, K}, {}, &g), 0.2).requires_grad_(true);
  const Tensor b_fc = kernels::mul_scalar(randn({H}, {}, &g), 0.2).requires_grad_(true);
  const Tensor w_proj = kernels::mul_scalar(randn({K, H}, {}, &g), 0.2).requires_grad_(true);
  const Tensor b_proj = kernels::mul_scalar(randn({K}, {}, &g), 0.2).requires_grad_(true);
  const Tensor r = randn({M, K}, {}, &g);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0);
    sum(gelu_mlp(x, w_fc, b_fc, w_proj, b_proj).to(DType::f32) * r).backward();
  }
  const auto bf16 = [](const Tensor& t) { return raw::to_dtype(t, DType::bf16); };
  const Tensor gout = bf16(r);  // the gradient reaching the MLP's output: r rounded as out.to(f32)'s backward rounds it
  const kernels::Fp8Matrix xq = kernels::fp8_cast(bf16(x), Fp8Format::E4M3, true, false);
  const kernels::Fp8Matrix wfq = kernels::fp8_cast(w_fc, Fp8Format::E4M3, true, false);  // from f32
  const Tensor pre = kernels::fp8_gemm(xq, wfq, bf16(b_fc), DType::bf16);
  const kernels::Fp8Matrix gq = kernels::fp8_cast(gout, Fp8Format::E5M2, true, false);
  const kernels::Fp8Matrix wpq = kernels::fp8_cast(w_proj, Fp8Format::E4M3, false, true);
  const Tensor g_h = kernels::fp8_gemm(gq.codes, Fp8Format::E5M2, gq.scale_inv, wpq.codes_t, Fp8Format::E4M3,
                                       wpq.scale_inv, Tensor(), DType::bf16);
  const Tensor g_pre = kernels::binary(kernels::Binary::GeluTanhBackward, g_h, pre);
  EXPECT_EQ(b_proj.grad().to_vector<float>(), column_sums(gout));
  EXPECT_EQ(b_fc.grad().to_vector<float>(), column_sums(g_pre));
  EXPECT_EQ(b_fc.grad().dtype(), DType::f32);
}

// Delayed scaling's histories carry from step to step (one cast of the input, the weight and the
// output gradient a step), also through a checkpoint region (its forward casts with the histories
// and keeps the scales, its replay casts with those: one cast of each a step, as without the
// region); an evaluation under no_grad casts with current scaling and leaves them alone, also
// through a region (grad off: nothing replays).
TEST(Fp8Recipe, DelayedHistoriesCarryAcrossStepsAndCheckpointsNotEvals) {
  Generator g(5);
  nn::Linear lin(64, 48, true, {}, &g);
  const Tensor x = randn({32, 64}, {}, &g);
  for (int k = 0; k < 3; ++k) {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
    sum(lin(x).to(DType::f32)).backward();
  }
  const std::array<int64_t, 3> three{3, 3, 3}, four{4, 4, 4};
  EXPECT_EQ(autograd::fp8_history_casts(lin.weight), three);
  {
    NoGradGuard ng;
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
    lin(x);
    checkpoint([&](const Tensor& in) { return lin(in); }, x);
  }
  EXPECT_EQ(autograd::fp8_history_casts(lin.weight), three);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
    const Tensor xin = x.detach().requires_grad_(true);
    sum(checkpoint([&](const Tensor& in) { return lin(in); }, xin).to(DType::f32)).backward();
    EXPECT_TRUE(xin.grad().defined());
  }
  EXPECT_EQ(autograd::fp8_history_casts(lin.weight), four);
  EXPECT_EQ(autograd::fp8_history_casts(randn({4, 4})), (std::array<int64_t, 3>{0, 0, 0}));
}

// A block (a linear, then the MLP) run inside a checkpoint region gives, step after step, the
// same gradients bit for bit as the same block run plainly, under delayed scaling: the region's
// forward casts with the histories and keeps the scales, and its replay casts with those, so its
// codes are the forward's (a replay casting from the histories would take a scale that moved:
// the forward added its amax). Current scaling the same way (its replay skips the amax pass).
// The inputs grow and shrink from step to step so that the histories' scales change; the CPU's
// kernels add in a fixed order.
TEST(Fp8Recipe, CheckpointedBlockGradientsAreThePlainBlocksBitForBit) {
  const int64_t M = 32, K = 32, N = 48, H = 64;
  struct Block {
    Tensor w, b, w_fc, b_fc, w_proj, b_proj;
    std::vector<Tensor> params() const { return {w, b, w_fc, b_fc, w_proj, b_proj}; }
    Tensor operator()(const Tensor& in) const { return gelu_mlp(linear(in, w, b), w_fc, b_fc, w_proj, b_proj); }
  };
  const auto make = [&] {
    Generator g(12);
    const auto p = [&](Shape s) { return kernels::mul_scalar(randn(s, {}, &g), 0.2).requires_grad_(true); };
    return Block{p({N, K}), p({N}), p({H, N}), p({H}), p({N, H}), p({N})};
  };
  for (Fp8Scaling scaling : {Fp8Scaling::Delayed, Fp8Scaling::Current}) {
    const char* name = scaling == Fp8Scaling::Delayed ? "delayed" : "current";
    const Block plain = make(), ckpt = make();
    Generator data(13);
    for (int step = 0; step < 6; ++step) {
      const double factor[] = {1.0, 4.0, 0.5, 2.0, 0.25, 1.0};
      const Tensor x = kernels::mul_scalar(randn({M, K}, {}, &data), factor[step]);
      const Tensor r = randn({M, N}, {}, &data);
      const Tensor xp = x.detach().requires_grad_(true), xc = x.detach().requires_grad_(true);
      {
        Autocast ac(DeviceType::CPU, DType::bf16);
        Fp8Autocast fp8(true, 0, scaling);
        sum(plain(xp).to(DType::f32) * r).backward();
        sum(checkpoint([&](const Tensor& in) { return ckpt(in); }, xc).to(DType::f32) * r).backward();
      }
      const std::string what = std::string(name) + " step " + std::to_string(step);
      EXPECT_EQ(xp.grad().to_vector<float>(), xc.grad().to_vector<float>()) << what;
      const std::vector<Tensor> pp = plain.params(), pc = ckpt.params();
      for (size_t i = 0; i < pp.size(); ++i) {
        EXPECT_EQ(pp[i].grad().to_vector<float>(), pc[i].grad().to_vector<float>()) << what << " parameter " << i;
        for (Tensor p : {pp[i], pc[i]}) {  // an SGD step, so the weights' amaxes move too
          NoGradGuard ng;
          p.copy_(p.detach() - kernels::mul_scalar(p.grad(), 2e-4));
          p.grad().zero_();
        }
      }
    }
    if (scaling == Fp8Scaling::Delayed) {
      const std::array<int64_t, 3> six{6, 6, 6};
      EXPECT_EQ(autograd::fp8_history_casts(plain.w), six);
      EXPECT_EQ(autograd::fp8_history_casts(ckpt.w), six);
      EXPECT_EQ(autograd::fp8_history_casts(ckpt.w_proj), six);
    }
  }
}

// A region made with grad on inside another region's forward (the outer's input needs no
// gradient, so its forward records; the inner region takes the first layer's output): the
// outer's list keeps the inner casts too, so the outer replay, which makes the inner region
// again, finds them; the inner replay then casts with its own. The gradients are the plain
// layers' bit for bit, step after step, under delayed scaling.
TEST(Fp8Recipe, NestedCheckpointRegionsReplayWithTheirForwardsScales) {
  const auto make = [] {
    Generator g(31);
    return std::make_pair(std::make_shared<nn::Linear>(32, 48, true, TensorOptions{}, &g),
                          std::make_shared<nn::Linear>(48, 32, true, TensorOptions{}, &g));
  };
  const auto [a1, b1] = make();
  const auto [a2, b2] = make();
  Generator data(32);
  for (int step = 0; step < 4; ++step) {
    const Tensor x = kernels::mul_scalar(randn({16, 32}, {}, &data), 1.0 + step);
    const Tensor r = randn({16, 32}, {}, &data);
    {
      Autocast ac(DeviceType::CPU, DType::bf16);
      Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
      sum((*b1)((*a1)(x)).to(DType::f32) * r).backward();
      const Tensor out = checkpoint(
          [&](const Tensor& in) { return checkpoint([&](const Tensor& t) { return (*b2)(t); }, (*a2)(in)); }, x);
      sum(out.to(DType::f32) * r).backward();
    }
    const std::string what = "step " + std::to_string(step);
    const std::vector<Tensor> p1 = a1->parameters(), p2 = a2->parameters(), q1 = b1->parameters(),
                              q2 = b2->parameters();
    for (size_t i = 0; i < p1.size(); ++i) {
      EXPECT_EQ(p1[i].grad().to_vector<float>(), p2[i].grad().to_vector<float>()) << what << " first layer " << i;
      EXPECT_EQ(q1[i].grad().to_vector<float>(), q2[i].grad().to_vector<float>()) << what << " second layer " << i;
    }
    for (const auto& m : {a1, a2, b1, b2})
      for (Tensor p : m->parameters()) {
        NoGradGuard ng;
        p.copy_(p.detach() - kernels::mul_scalar(p.grad(), 1e-3));
        p.grad().zero_();
      }
  }
  EXPECT_EQ(autograd::fp8_history_casts(b2->weight), (std::array<int64_t, 3>{4, 4, 4}));
}

// A region whose replay makes more FP8 casts than its forward did is not a function of its
// inputs: the replay says so instead of casting with a scale that was never taken.
TEST(Fp8Recipe, ReplayWithOtherCastsThanTheForwardIsAnError) {
  Generator g(6);
  nn::Linear lin(32, 32, true, {}, &g);
  const Tensor xin = randn({16, 32}, {}, &g).requires_grad_(true);
  int calls = 0;
  Tensor out;
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
    CheckpointOptions opts;
    opts.name = "block";
    out = checkpoint(
        [&](const Tensor& in) {
          const Tensor y = lin(in);
          return ++calls == 1 ? y : lin(y);  // the replay makes two linears, the forward one
        },
        xin, opts);
  }
  const std::string m = mg::testing::error_of<AutogradError>([&] { sum(out.to(DType::f32)).backward(); });
  EXPECT_NE(m.find("block: the replay made FP8 cast 3 where the forward made 2"), std::string::npos) << m;
}

// Delayed scaling's histories saved in a training checkpoint file (Fp8HistoryState): a run
// stopped after three steps and resumed from the file into a fresh layer gives the next two
// steps' gradients bit for bit as the uninterrupted run; a resume that starts the histories again
// (its first cast with current scaling) does not.
TEST(Fp8Recipe, DelayedHistoriesResumeFromACheckpointFileBitForBit) {
  const std::string path = ::testing::TempDir() + "/fp8_histories.safetensors";
  Generator data(21);
  std::vector<Tensor> xs, rs;
  for (int step = 0; step < 5; ++step) {
    xs.push_back(kernels::mul_scalar(randn({32, 64}, {}, &data), 1.0 + 0.5 * step));
    rs.push_back(randn({32, 48}, {}, &data));
  }
  // One step: the layer's gradients, then an SGD update.
  const auto step = [&](nn::Linear& lin, int k) {
    {
      Autocast ac(DeviceType::CPU, DType::bf16);
      Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
      sum(lin(xs[k]).to(DType::f32) * rs[k]).backward();
    }
    std::vector<float> g = lin.weight.grad().to_vector<float>();
    for (Tensor p : lin.parameters()) {
      NoGradGuard ng;
      p.copy_(p.detach() - kernels::mul_scalar(p.grad(), 1e-3));
      p.grad().zero_();
    }
    return g;
  };
  Generator init(22);
  nn::Linear run(64, 48, true, {}, &init);
  for (int k = 0; k < 3; ++k) step(run, k);
  {
    Fp8HistoryState fp8(run.named_parameters());
    serialize::TrainingCheckpoint ckpt;
    ckpt.add("model", run).add("fp8", fp8);
    ckpt.save(path);
  }
  const std::vector<float> want3 = step(run, 3), want4 = step(run, 4);
  EXPECT_EQ(autograd::fp8_history_casts(run.weight), (std::array<int64_t, 3>{5, 5, 5}));
  for (bool with_histories : {true, false}) {
    Generator other(99);
    nn::Linear resumed(64, 48, true, {}, &other);
    if (with_histories) {
      Fp8HistoryState fp8(resumed.named_parameters());
      serialize::TrainingCheckpoint ckpt;
      ckpt.add("model", resumed).add("fp8", fp8);
      ckpt.load(path);
    } else {
      resumed.load_state_dict(serialize::load(path).sub("model"));
    }
    EXPECT_EQ(autograd::fp8_history_casts(resumed.weight),
              (with_histories ? std::array<int64_t, 3>{3, 3, 3} : std::array<int64_t, 3>{0, 0, 0}));
    const std::vector<float> got3 = step(resumed, 3), got4 = step(resumed, 4);
    if (with_histories) {
      EXPECT_EQ(got3, want3);
      EXPECT_EQ(got4, want4);
    } else {
      EXPECT_NE(got3, want3);  // the scale from the step's own amax, not the history's
    }
  }
}

// Fp8HistoryState's load checks every entry before it changes anything, naming the bad one.
TEST(Fp8Recipe, DelayedHistoriesBadStateIsAClearError) {
  Generator g(23);
  nn::Linear lin(32, 32, true, {}, &g);
  {
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast fp8(true, 0, Fp8Scaling::Delayed);
    sum(lin(randn({16, 32}, {}, &g)).to(DType::f32)).backward();
  }
  Fp8HistoryState state(lin.named_parameters());
  const StateDict good = state.state_dict();
  ASSERT_EQ(good.tensors.size(), 3u);
  ASSERT_TRUE(good.tensors.count("weight.x"));
  EXPECT_EQ(good.meta["weight"]["g"], 1);
  const auto message = [&](const std::function<void(StateDict&)>& edit) {
    StateDict sd = good;
    edit(sd);
    return mg::testing::error_of<ValueError>([&] { state.load_state_dict(sd); });
  };
  const auto has = [](const std::string& m, const char* want) {
    return m.find(want) != std::string::npos ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << m;
  };
  EXPECT_TRUE(has(message([](StateDict& sd) { sd.tensors["head.weight.x"] = sd.tensors["weight.x"]; }),
                  "\"head.weight.x\" names no weight given to this state"));
  EXPECT_TRUE(has(message([](StateDict& sd) { sd.tensors["weight.q"] = sd.tensors["weight.x"]; }),
                  "\"weight.q\" names no operand (x, w or g)"));
  EXPECT_TRUE(has(message([](StateDict& sd) { sd.tensors["weight.x"] = zeros({17}); }),
                  "\"weight.x\" must be f32 [18], got f32 [17]"));
  EXPECT_TRUE(has(message([](StateDict& sd) { sd.meta["weight"]["w"] = -2; }),
                  "\"weight.w\" has no positive cast count in meta[\"weight\"][\"w\"]"));
  EXPECT_TRUE(has(message([](StateDict& sd) { sd.meta["head.bias"] = nlohmann::json::object(); }),
                  "meta entry \"head.bias\" names no weight given to this state"));
  EXPECT_EQ(autograd::fp8_history_casts(lin.weight), (std::array<int64_t, 3>{1, 1, 1}));  // left as it was
  state.load_state_dict(StateDict{});  // nothing saved: the histories start again
  EXPECT_EQ(autograd::fp8_history_casts(lin.weight), (std::array<int64_t, 3>{0, 0, 0}));
}

// GPT-2's shape scaled down: every linear a multiple of 16 wide, 32 rows a batch of 2 x 16.
nn::GPTConfig small_gpt() {
  nn::GPTConfig cfg;
  cfg.vocab_size = 64;
  cfg.block_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  return cfg;
}

// The small GPT (small_gpt()), 30 AdamW steps
// on one batch from the same initialization under bf16 autocast with and without the recipe.
// Not a rounding bound: the check is that FP8 trains as bf16 does (e4m3's 2^-4 relative step on
// every operand perturbs each step's update by a few percent); the device's 1,000-step run on
// the example's corpus is the quality measure (docs/mixed_precision.md).
TEST(Fp8Recipe, SmallGptTrainsAsUnderBf16) {
  const nn::GPTConfig cfg = small_gpt();
  Generator data(9);
  const Tensor idx = randint(0, cfg.vocab_size, {2, 16}, {DType::i64}, &data);
  const Tensor tgt = randint(0, cfg.vocab_size, {2, 16}, {DType::i64}, &data);
  auto train = [&](bool fp8, Fp8Scaling scaling) {
    Generator init(3);
    nn::GPT model(cfg, {}, &init);
    optim::AdamWOptions o;
    o.lr = 3e-3;
    optim::AdamW opt(model.parameters(), o);
    std::vector<double> losses;
    for (int step = 0; step < 30; ++step) {
      opt.zero_grad();
      Tensor loss;
      {
        Autocast ac(DeviceType::CPU, DType::bf16);
        Fp8Autocast f(fp8, 0, scaling);
        loss = model.forward_loss(idx, tgt);
      }
      loss.backward();
      for (const Tensor& p : model.parameters()) {
        EXPECT_TRUE(p.grad().defined());
        if (p.grad().defined()) {
          EXPECT_TRUE(std::isfinite(sum(p.grad() * p.grad()).item<float>()));
        }
      }
      opt.step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  const std::vector<double> b = train(false, Fp8Scaling::Current);
  for (Fp8Scaling scaling : {Fp8Scaling::Current, Fp8Scaling::Delayed}) {
    const std::vector<double> f = train(true, scaling);
    const char* name = scaling == Fp8Scaling::Current ? "current" : "delayed";
    std::printf("loss: bf16 %.4f -> %.4f, fp8 (%s scaling) %.4f -> %.4f\n", b.front(), b.back(), name, f.front(),
                f.back());
    EXPECT_NEAR(f.front(), b.front(), 0.02 * b.front()) << name;  // the first forward: the same model
    EXPECT_LT(f.back(), 0.5 * f.front()) << name;                 // it learns the batch
    EXPECT_NEAR(f.back(), b.back(), 0.15 * b.back() + 0.05) << name;
  }
}

// A checkpoint saved between an update that wrote the weights' casts and the forward that would
// take them: the run resumed from it (whose forward casts each weight itself) reaches the
// uninterrupted run's losses, bit for bit, also where a weight changed after the update (the
// uninterrupted forward clears the slot the update wrote and casts anew; the file holds that slot
// empty).
TEST(Fp8Recipe, ResumeBetweenAnUpdateAndItsWrittenCastsIsBitForBit) {
  const std::string path = ::testing::TempDir() + "/fp8_update_casts.safetensors";
  const nn::GPTConfig cfg = small_gpt();
  Generator data(9);
  const Tensor idx = randint(0, cfg.vocab_size, {2, 16}, {DType::i64}, &data);
  const Tensor tgt = randint(0, cfg.vocab_size, {2, 16}, {DType::i64}, &data);
  struct Trainer {
    nn::GPT model;
    optim::AdamW opt;
    Trainer(const nn::GPTConfig& c, Generator* g, optim::AdamWOptions o)
        : model(c, {}, g), opt(model.parameters(), o) {}
  };
  optim::AdamWOptions o;
  o.lr = 3e-3;
  const auto step = [&](Trainer& t) {
    t.opt.zero_grad();
    Tensor loss;
    {
      Autocast ac(DeviceType::CPU, DType::bf16);
      Fp8Autocast f(true, 0, Fp8Scaling::Delayed);
      loss = t.model.forward_loss(idx, tgt);
    }
    loss.backward();
    t.opt.step();
    return loss.item<float>();
  };
  // The weight changed after the save, in both runs: half its values (a smaller amax than the one
  // the update's cast wrote).
  const auto change = [](Trainer& t) {
    NoGradGuard ng;
    Tensor w = t.model.named_parameters().front().second;
    for (const auto& [name, p] : t.model.named_parameters())
      if (name.find("c_fc.weight") != std::string::npos) w = p;
    w.copy_(kernels::mul_scalar(w, 0.5));
  };
  const auto checkpoint = [](Trainer& t, Fp8HistoryState& fp8) {
    serialize::TrainingCheckpoint ckpt;
    ckpt.add("model", t.model).add("opt", t.opt).add("fp8", fp8);
    return ckpt;
  };
  Generator init(3);
  Trainer run(cfg, &init, o);
  for (int k = 0; k < 4; ++k) step(run);
  for (const auto& [name, p] : run.model.named_parameters())
    if (name.find(".h.") != std::string::npos && p.dim() == 2) EXPECT_TRUE(autograd::fp8_weight_cast_provided(p));
  Fp8HistoryState fp8(run.model.named_parameters());
  checkpoint(run, fp8).save(path);
  change(run);
  std::vector<float> want;
  for (int k = 0; k < 3; ++k) want.push_back(step(run));

  Generator other(4);
  Trainer resumed(cfg, &other, o);
  Fp8HistoryState fp8_resumed(resumed.model.named_parameters());
  checkpoint(resumed, fp8_resumed).load(path);
  change(resumed);
  std::vector<float> got;
  for (int k = 0; k < 3; ++k) got.push_back(step(resumed));
  EXPECT_EQ(got, want);
}

// A pending norm (mg::Normed) read twice: the first linear runs the norm in its node under the
// recipe, the second reads Normed::value(), the norm of the stream the first left (the add done):
// both outputs are the norm-then-linear ones, bit for bit, and so are the gradients of the stream,
// the branch and the norm's weight through the first (through both, the fused run sums two norm
// backwards where the other sums the linears' bf16 gradients first: equal up to that rounding). A linear of the wrong
// width is a ShapeError naming it, before anything runs; outside the recipe's delayed scaling the norm runs on its own.
TEST(Fp8Recipe, APendingNormReadTwiceGivesTheNormThenTheLinears) {
  Generator data(5);
  const Tensor base = randn({2, 16, 32}, {}, &data);
  const Tensor branch = raw::to_dtype(randn({2, 16, 32}, {}, &data), DType::bf16);
  struct Out {
    std::vector<float> ya, yb, gbase, gbranch, gw;
  };
  auto run = [&](bool fused) {  // new layers each run: their histories start again
    autograd::set_fp8_norm_casts(fused);
    Generator g(6);
    nn::LayerNorm ln(32);
    {
      NoGradGuard ng;
      ln.weight.copy_(kernels::add_scalar(kernels::mul_scalar(randn({32}, {}, &g), 0.1), 1.0));
    }
    nn::Linear a(32, 48, true, {}, &g), b(32, 16, true, {}, &g), wrong(16, 8, true, {}, &g);
    Out o;
    for (int step = 0; step < 3; ++step) {  // the first casts start the histories: then delayed
      const Tensor x = base.detach().requires_grad_(true), r = branch.detach().requires_grad_(true);
      ln.zero_grad();
      Tensor ya, yb;
      {
        Autocast ac(DeviceType::CPU, DType::bf16);
        Fp8Autocast f(true, 0, Fp8Scaling::Delayed);
        const Normed n = ln(Residual(x, Branch{r}));
        EXPECT_THROW(wrong(n), ShapeError);
        EXPECT_EQ(autograd::fp8_norm_applies(n, a.weight), fused);
        ya = a(n);
        EXPECT_FALSE(n.pending());
        yb = b(n);
      }
      sum(ya.to(DType::f32)).backward();  // through the first linear: one norm's backward either way
      o.ya = raw::to_dtype(ya, DType::f32).to_vector<float>();
      o.yb = raw::to_dtype(yb, DType::f32).to_vector<float>();
      o.gbase = x.grad().to_vector<float>();
      o.gbranch = raw::to_dtype(r.grad(), DType::f32).to_vector<float>();
      o.gw = ln.weight.grad().to_vector<float>();
    }
    autograd::set_fp8_norm_casts(true);
    return o;
  };
  const Out apart = run(false), fused = run(true);
  EXPECT_EQ(fused.ya, apart.ya);
  EXPECT_EQ(fused.yb, apart.yb);
  EXPECT_EQ(fused.gbase, apart.gbase);
  EXPECT_EQ(fused.gbranch, apart.gbranch);
  EXPECT_EQ(fused.gw, apart.gw);
  {  // current scaling: no fused node
    nn::LayerNorm ln(32);
    nn::Linear a(32, 48);
    Autocast ac(DeviceType::CPU, DType::bf16);
    Fp8Autocast f(true, 0);
    EXPECT_FALSE(autograd::fp8_norm_applies(ln(Residual(base)), a.weight));
  }
}

// A norm run in its linear's node whose linear output nothing uses, while the stream's sum is
// used: the linear's backward does not run (its weight gets no gradient and its output gradient's
// history no cast), and the stream, the branch and the norm's weight get the plain ops' gradients,
// bit for bit.
TEST(Fp8Recipe, AFusedNormWhoseLinearOutputIsUnusedLeavesTheLinearAlone) {
  Generator data(7);
  const Tensor base = randn({2, 16, 32}, {}, &data);
  const Tensor branch = raw::to_dtype(randn({2, 16, 32}, {}, &data), DType::bf16);
  struct Out {
    std::vector<float> gbase, gbranch, gw;
    bool linear_grad = true;
    int64_t g_casts = -1;
  };
  auto run = [&](bool fused) {
    autograd::set_fp8_norm_casts(fused);
    Generator g(8);
    nn::LayerNorm ln(32);
    nn::Linear a(32, 48, true, {}, &g);
    Out o;
    for (int step = 0; step < 2; ++step) {
      const Tensor x = base.detach().requires_grad_(true), r = branch.detach().requires_grad_(true);
      ln.zero_grad();
      Tensor h;
      {
        Autocast ac(DeviceType::CPU, DType::bf16);
        Fp8Autocast f(true, 0, Fp8Scaling::Delayed);
        const Residual stream(x, Branch{r});
        const Normed n = ln(stream);
        EXPECT_EQ(autograd::fp8_norm_applies(n, a.weight), fused);
        const Tensor unused = a(n);
        h = stream.value();
      }
      sum(h * h).backward();
      o.gbase = x.grad().to_vector<float>();
      o.gbranch = raw::to_dtype(r.grad(), DType::f32).to_vector<float>();
      o.gw = ln.weight.grad().defined() ? ln.weight.grad().to_vector<float>() : std::vector<float>{};
      o.linear_grad = a.weight.grad().defined() || a.bias.grad().defined();
      o.g_casts = autograd::fp8_history_casts(a.weight)[2];
    }
    autograd::set_fp8_norm_casts(true);
    return o;
  };
  const Out apart = run(false), fused = run(true);
  EXPECT_FALSE(apart.linear_grad);
  EXPECT_FALSE(fused.linear_grad);
  EXPECT_EQ(apart.g_casts, 0);
  EXPECT_EQ(fused.g_casts, 0);
  EXPECT_EQ(fused.gbase, apart.gbase);
  EXPECT_EQ(fused.gbranch, apart.gbranch);
  EXPECT_EQ(fused.gw, apart.gw);
  EXPECT_FALSE(apart.gbase.empty());
}

// The small GPT's batch of two sequences of 16 tokens on `dev` (inputs, targets).
std::pair<Tensor, Tensor> small_gpt_batch(const nn::GPTConfig& cfg, Device dev) {
  Generator data(9);
  const Tensor idx = randint(0, cfg.vocab_size, {2, 16}, {DType::i64}, &data).to(dev);
  const Tensor tgt = randint(0, cfg.vocab_size, {2, 16}, {DType::i64}, &data).to(dev);
  return {idx, tgt};
}

// The small GPT's loss on its batch under bf16 autocast and the recipe with delayed scaling,
// every linear in FP8, on the batch's device.
Tensor delayed_fp8_loss(nn::GPT& model, const Tensor& idx, const Tensor& tgt) {
  Autocast ac(idx.device().type, DType::bf16);
  Fp8Autocast f(true, 0, Fp8Scaling::Delayed);
  return model.forward_loss(idx, tgt);
}

// What two training runs compare bit for bit: the losses, and at the end every parameter and the
// delayed histories (Fp8HistoryState's tensors, in its order).
struct Run {
  std::vector<float> losses, weights, histories;
  size_t history_tensors = 0;
  void take_state(nn::GPT& model) {
    for (const Tensor& p : model.parameters()) {
      const std::vector<float> v = p.cpu().to_vector<float>();
      weights.insert(weights.end(), v.begin(), v.end());
    }
    const StateDict sd = Fp8HistoryState(model.named_parameters()).state_dict();
    history_tensors = sd.tensors.size();
    for (const auto& [key, t] : sd.tensors) {
      const std::vector<float> v = t.cpu().to_vector<float>();
      histories.insert(histories.end(), v.begin(), v.end());
    }
  }
};

// AdamW writing the recipe's weight casts in its update (AdamOptions::write_autocast_casts,
// autograd::fp8_next_weight_cast) against the forward casting the weights itself: the small GPT
// above trains to the same losses, weights and delayed histories, bit for bit. After each update
// every FP8 weight holds the cast the update wrote, and the next forward takes them all; a weight
// changed after the update (its version) is cast anew, its slot's amax cleared first. A weight
// its forward casts from a bf16 copy gets none.
void expect_update_casts_train_bit_for_bit(Device dev) {
  const nn::GPTConfig cfg = small_gpt();
  const auto [idx, tgt] = small_gpt_batch(cfg, dev);
  auto train = [&](bool write) {
    Generator init(3);
    nn::GPT model(cfg, {}, &init);
    model.to(dev);
    optim::AdamWOptions o;
    o.lr = 3e-3;
    o.write_autocast_casts = write;
    optim::AdamW opt(model.parameters(), o);
    // The weights the recipe takes (those with a weight history after the first forward): every
    // block's linears, and on the CPU the head's (the token embedding, tied to it; CUDA's fused
    // head and loss keeps bf16).
    std::vector<Tensor> fp8_weights;
    std::vector<bool> cast_by_update;
    Run r;
    for (int step = 0; step < 8; ++step) {
      opt.zero_grad();
      const Tensor loss = delayed_fp8_loss(model, idx, tgt);
      if (step == 0) {
        for (const auto& [name, p] : model.named_parameters()) {
          if (autograd::fp8_history_casts(p)[1] == 0) continue;
          fp8_weights.push_back(p);
          // The blocks' linears cast their f32 weights: the update writes those casts. The head
          // (on the CPU) casts the bf16 copy autocast makes of the token embedding it shares with
          // the embedding's lookup: not the update's cast of the f32 values, so none is written.
          cast_by_update.push_back(name.find(".h.") != std::string::npos);
        }
        EXPECT_EQ(fp8_weights.size(), dev.is_cuda() ? 8u : 9u);
      }
      for (const Tensor& w : fp8_weights) EXPECT_FALSE(autograd::fp8_weight_cast_provided(w)) << "step " << step;
      loss.backward();
      opt.step();
      for (size_t i = 0; i < fp8_weights.size(); ++i)
        EXPECT_EQ(autograd::fp8_weight_cast_provided(fp8_weights[i]), write && cast_by_update[i]) << "step " << step;
      if (step == 4) {  // a change after the update: the cast it wrote is not the weight's any more
        NoGradGuard ng;
        fp8_weights[1].copy_(kernels::mul_scalar(fp8_weights[1], 0.5));
      }
      r.losses.push_back(loss.item<float>());
    }
    // a last forward: it takes the casts the last update wrote (the other run casts them itself)
    r.losses.push_back(delayed_fp8_loss(model, idx, tgt).item<float>());
    for (const Tensor& w : fp8_weights) EXPECT_FALSE(autograd::fp8_weight_cast_provided(w));
    r.take_state(model);
    EXPECT_EQ(r.history_tensors, 3 * fp8_weights.size());  // x, w and g of each FP8 weight
    return r;
  };
  const Run own = train(false), written = train(true);
  EXPECT_EQ(written.losses, own.losses);
  EXPECT_EQ(written.weights, own.weights);
  EXPECT_EQ(written.histories, own.histories);
  EXPECT_LT(own.losses.back(), own.losses.front());
}

TEST(Fp8Recipe, UpdateWrittenWeightCastsTrainAsTheForwardsCastsBitForBit) {
  expect_update_casts_train_bit_for_bit(Device::cpu());
}

TEST(Fp8Recipe, UpdateWrittenWeightCastsTrainAsTheForwardsCastsBitForBitOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_update_casts_train_bit_for_bit(Device::cuda(0));
}

// The names of the nodes the backward of `t` runs through (a walk of the recorded graph).
std::vector<std::string> node_names(const Tensor& t) {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<autograd::Node>> todo{autograd::grad_fn(t)};
  std::set<const autograd::Node*> seen;
  while (!todo.empty()) {
    const std::shared_ptr<autograd::Node> n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n.get()).second) continue;
    names.push_back(n->name());
    for (const autograd::Edge& e : n->next_edges) todo.push_back(e.node);
  }
  return names;
}

// The layer norm before a linear run inside the linear's node, its output cast to FP8 in its pass
// (autograd::fp8_norm_linear, on by default), against the norm then the linear
// (set_fp8_norm_casts(false)): the small GPT trains to the same losses, weights (the norms'
// included: their gradients come through the fused node's backward) and delayed histories, bit
// for bit. Each block's two norms run in their linears' nodes (at the first step, whose casts use
// current scaling, the node's kernels are the norm then the cast), never under no_grad.
void expect_norm_casts_train_bit_for_bit(Device dev) {
  const nn::GPTConfig cfg = small_gpt();
  const auto [idx, tgt] = small_gpt_batch(cfg, dev);
  auto train = [&](bool fused) {
    autograd::set_fp8_norm_casts(fused);
    Generator init(3);
    nn::GPT model(cfg, {}, &init);
    model.to(dev);
    optim::AdamWOptions o;
    o.lr = 3e-3;
    optim::AdamW opt(model.parameters(), o);
    Run r;
    for (int step = 0; step < 6; ++step) {
      opt.zero_grad();
      const Tensor loss = delayed_fp8_loss(model, idx, tgt);
      const std::vector<std::string> names = node_names(loss);
      const auto count = [&](const char* n) { return std::count(names.begin(), names.end(), n); };
      const int64_t expected = fused ? cfg.n_layer : 0;
      EXPECT_EQ(count("add_layer_norm_linear"), expected) << "step " << step;
      EXPECT_EQ(count("add_layer_norm_gelu_mlp"), expected) << "step " << step;
      loss.backward();
      opt.step();
      r.losses.push_back(loss.item<float>());
    }
    {  // an evaluation under no_grad runs the norm on its own
      NoGradGuard ng;
      r.losses.push_back(delayed_fp8_loss(model, idx, tgt).item<float>());
    }
    r.take_state(model);
    autograd::set_fp8_norm_casts(true);
    return r;
  };
  const Run apart = train(false), fused = train(true);
  EXPECT_EQ(fused.losses, apart.losses);
  EXPECT_EQ(fused.weights, apart.weights);
  EXPECT_EQ(fused.histories, apart.histories);
  EXPECT_FALSE(fused.histories.empty());
  EXPECT_LT(apart.losses[5], apart.losses.front());
}

TEST(Fp8Recipe, NormCastsTrainAsTheNormThenTheLinearBitForBit) { expect_norm_casts_train_bit_for_bit(Device::cpu()); }

TEST(Fp8Recipe, NormCastsTrainAsTheNormThenTheLinearBitForBitOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_norm_casts_train_bit_for_bit(Device::cuda(0));
}

}  // namespace
}  // namespace mg
