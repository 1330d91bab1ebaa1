// AdamW8bit (8-bit blockwise-quantized moments) on the CPU: the codes, the update against a
// reference written out here (linear-scan rounding, block by block), which parameters keep f32
// state, training next to f32 AdamW, state_dict resume and what a bad load or option says.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "autograd/functions.h"
#include "core/random.h"
#include "kernels/optim.h"
#include "kernels/optim_math.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "tests/error_of.h"

namespace mg::optim {
namespace {

constexpr int kBlock = 2048;

TEST(AdamW8bit, CodesAreSortedAndSpanTheirRange) {
  for (bool is_signed : {true, false}) {
    const float* c = kernels::quant_code(is_signed);
    for (int i = 1; i < 256; ++i) ASSERT_LT(c[i - 1], c[i]) << "signed " << is_signed << " index " << i;
    EXPECT_EQ(c[is_signed ? 127 : 0], 0.0f);
    EXPECT_GT(c[255], 0.99f);
    EXPECT_LE(c[255], 1.0f);
    // The smallest nonzero magnitude: 7 (m) or 8 (v) decades below 1.
    const float smallest = is_signed ? c[128] : c[1];
    EXPECT_LT(smallest, is_signed ? 1e-6f : 1e-7f);
    EXPECT_GT(smallest, is_signed ? 1e-7f : 1e-8f);
  }
  EXPECT_GT(kernels::quant_code(true)[0], -1.0f);
}

// The last index whose code value is <= x, 0 when none is (quantize_nearest's search), by a scan.
int last_at_or_below(const float* code, float x) {
  int pos = 0;
  for (int i = 0; i < 256; ++i)
    if (code[i] <= x) pos = i;
  return pos;
}

// The lookup table's promise, bucket by bucket: `lo` is the last index at or below the bucket's
// smallest value, and no index past lo + 1 is at or below its largest, so lo or lo + 1 is the
// search's position for every value in it.
TEST(AdamW8bit, EveryLookupBucketHoldsAtMostOneCodeValuePastItsLo) {
  namespace om = kernels::optim_math;
  for (bool is_signed : {true, false}) {
    const float* code = kernels::quant_code(is_signed);
    const unsigned char* lut = is_signed ? om::kLutSigned.lo : om::kLutUnsigned.lo;
    const int32_t* lut32 = is_signed ? om::kLut32Signed.lo : om::kLut32Unsigned.lo;  // the CPU loop's
    for (int k = 0; k < om::kQuantLutSize; ++k) {
      float lo = 0, hi = 0;
      om::quant_lut_bounds(k, &lo, &hi);
      ASSERT_LE(lo, hi) << k;
      ASSERT_EQ(om::quant_lut_bucket(om::float_bits(lo)), k) << k;
      ASSERT_EQ(om::quant_lut_bucket(om::float_bits(hi)), k) << k;
      ASSERT_EQ(lut[k], last_at_or_below(code, lo)) << "signed " << is_signed << " bucket " << k;
      ASSERT_EQ(lut32[k], lut[k]) << "signed " << is_signed << " bucket " << k;
      ASSERT_LE(last_at_or_below(code, hi), lut[k] + 1)
          << "signed " << is_signed << " bucket " << k << " [" << lo << ", " << hi << "]";
    }
  }
}

// quantize_nearest_lut and the CPU's quantize_nearest_lut32 give quantize_nearest's index: at
// every code value, every midpoint between neighbours and the floats beside both, every bucket's
// ends and the floats beside them, the specials (NaN of either sign too), and a million values
// spread over [-1, 1] evenly and by magnitude.
TEST(AdamW8bit, LookupGivesTheSearchsIndex) {
  namespace om = kernels::optim_math;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> even(-1.0f, 1.0f), expo(-30.0f, 0.0f);
  for (bool is_signed : {true, false}) {
    const float* code = kernels::quant_code(is_signed);
    const unsigned char* lut = is_signed ? om::kLutSigned.lo : om::kLutUnsigned.lo;
    const int32_t* lut32 = is_signed ? om::kLut32Signed.lo : om::kLut32Unsigned.lo;  // the CPU loop's
    std::vector<float> xs = {0.0f,     -0.0f,    1.0f,      -1.0f,  1.5f,    -1.5f, 3.0e38f,
                             -3.0e38f, INFINITY, -INFINITY, 1e-45f, -1e-45f, NAN,   -NAN};
    auto around = [&](float x) {
      xs.push_back(x);
      xs.push_back(std::nextafter(x, INFINITY));
      xs.push_back(std::nextafter(x, -INFINITY));
    };
    for (int i = 0; i < 256; ++i) {
      around(code[i]);
      if (i < 255) around(0.5f * (code[i] + code[i + 1]));
    }
    for (int k = 0; k < om::kQuantLutSize; ++k) {
      float lo = 0, hi = 0;
      om::quant_lut_bounds(k, &lo, &hi);
      around(lo);
      around(hi);
    }
    for (int i = 0; i < 500000; ++i) {
      xs.push_back(even(rng));
      const float mag = std::pow(10.0f, expo(rng) / 4.0f);
      xs.push_back(i % 2 ? mag : -mag);
    }
    int64_t differ = 0;
    for (float x : xs) {
      const int a = om::quantize_nearest(code, x), b = om::quantize_nearest_lut(code, lut, x),
                c = om::quantize_nearest_lut32(code, lut32, x);
      if ((a != b || a != c) && ++differ <= 5)
        ADD_FAILURE() << "signed " << is_signed << " x " << x << ": search " << a << ", lookup " << b
                      << ", the CPU's lookup " << c;
    }
    EXPECT_EQ(differ, 0) << "of " << xs.size();
  }
}

// The code index nearest x, by a linear scan (the kernels use a binary search); ties to the
// smaller index, as they do.
int nearest(const float* code, float x) {
  int best = 0;
  for (int i = 1; i < 256; ++i)
    if (std::fabs(code[i] - x) < std::fabs(code[best] - x)) best = i;
  return best;
}

// One 8-bit AdamW step, written out: dequantize, torch's AdamW rule in f32 (the order of
// kernels/optim_math.h's adam_element), new absmax per block, requantize to the nearest code.
struct Ref8 {
  std::vector<float> p;
  std::vector<uint8_t> mq, vq;
  std::vector<float> am, av;
  int t = 0;
};
void ref8_step(Ref8& r, const std::vector<float>& g, const AdamW8bitOptions& o) {
  ++r.t;
  const float* cm = kernels::quant_code(true);
  const float* cv = kernels::quant_code(false);
  const double bc1 = 1 - std::pow(o.beta1, r.t), bc2 = 1 - std::pow(o.beta2, r.t);
  const float step_size = static_cast<float>(o.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float lr = float(o.lr), b1 = float(o.beta1), b2 = float(o.beta2), eps = float(o.eps),
              wd = float(o.weight_decay);
  const size_t n = r.p.size();
  for (size_t b0 = 0; b0 < n; b0 += kBlock) {
    const size_t b = b0 / kBlock, e = std::min(n, b0 + kBlock);
    std::vector<float> m(e - b0), v(e - b0);
    float am = 0, av = 0;
    for (size_t i = b0; i < e; ++i) {
      float mi = cm[r.mq[i]] * r.am[b], vi = cv[r.vq[i]] * r.av[b];
      r.p[i] = r.p[i] * (1.0f - lr * wd);
      mi = b1 * mi + (1.0f - b1) * g[i];
      vi = b2 * vi + (1.0f - b2) * (g[i] * g[i]);
      // adam_element's sqrt(v) / bc2_sqrt + eps on the host: C's double sqrt, so that line runs in
      // double and rounds to f32 once.
      const float denom = static_cast<float>(std::sqrt(static_cast<double>(vi)) / bc2_sqrt + eps);
      r.p[i] = r.p[i] - step_size * (mi / denom);
      m[i - b0] = mi, v[i - b0] = vi;
      am = std::max(am, std::fabs(mi)), av = std::max(av, vi);
    }
    // Each moment times the block's 1 / absmax, rounded once; 0 in an all-zero block. (A block
    // whose reciprocal is not a normal float divides instead: none here, checked.)
    EXPECT_TRUE(am == 0 || (am >= 0x1p-126f && am <= 0x1p126f)) << am;
    EXPECT_TRUE(av == 0 || (av >= 0x1p-126f && av <= 0x1p126f)) << av;
    const float inv_m = am > 0 ? 1.0f / am : 0.0f, inv_v = av > 0 ? 1.0f / av : 0.0f;
    for (size_t i = b0; i < e; ++i) {
      r.mq[i] = static_cast<uint8_t>(nearest(cm, m[i - b0] * inv_m));
      r.vq[i] = static_cast<uint8_t>(nearest(cv, v[i - b0] * inv_v));
    }
    r.am[b] = am, r.av[b] = av;
  }
}

TEST(AdamW8bit, MatchesTheWrittenOutRule) {
  manual_seed(11);
  const int64_t n = 2 * kBlock + 904;  // two whole blocks and a partial one
  Tensor p = nn::parameter(randn({n}));
  AdamW8bitOptions o;
  o.lr = 1e-2;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  AdamW8bit opt({p}, o);
  Ref8 r{p.to_vector<float>(), std::vector<uint8_t>(n, 0), std::vector<uint8_t>(n, 0), std::vector<float>(3, 0.0f),
         std::vector<float>(3, 0.0f)};
  for (int s = 0; s < 6; ++s) {
    Tensor g = mul(randn({n}), s % 2 ? 1e-3 : 1.0);  // moments of two scales in one history
    p.set_grad(g);
    opt.step();
    ref8_step(r, g.to_vector<float>(), o);
  }
  // The same f32 operations in the same order (the CPU build contracts none into FMAs), and a
  // rounding that picks the nearest code either way: bitwise.
  const std::vector<float> got = p.to_vector<float>();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], r.p[i]) << "element " << i;
  const ParamState* st = opt.state(p);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->buffers.at("exp_avg").to_vector<uint8_t>(), r.mq);
  EXPECT_EQ(st->buffers.at("exp_avg_sq").to_vector<uint8_t>(), r.vq);
  EXPECT_EQ(st->buffers.at("exp_avg_absmax").to_vector<float>(), r.am);
  EXPECT_EQ(st->buffers.at("exp_avg_sq_absmax").to_vector<float>(), r.av);
}

TEST(AdamW8bit, SmallParametersKeepF32MomentsAndStateIsTwoBytesAParameter) {
  Tensor w = nn::parameter(randn({64, 96})), bias = nn::parameter(randn({96}));
  AdamW8bit opt({w, bias});
  w.set_grad(ones_like(w));
  bias.set_grad(ones_like(bias));
  opt.step();
  EXPECT_EQ(opt.state(w)->buffers.at("exp_avg").dtype(), DType::u8);
  EXPECT_EQ(opt.state(w)->buffers.at("exp_avg_absmax").numel(), 3);  // 6144 elements, blocks of 2048
  EXPECT_EQ(opt.state(bias)->buffers.at("exp_avg").dtype(), DType::f32);
  EXPECT_EQ(opt.state_nbytes(), (2 * 6144 + 2 * 3 * 4) + 2 * 96 * 4);
}

// Least squares y = x A on a 64 x 96 weight: 8-bit and f32 AdamW from one seed and one data
// stream stay together. The moments' rounding is below 1 % of a block's largest value for the
// larger values (the top decade's 64 or 128 codes), so the steps differ by a few percent at
// most; the bound asks the trajectories to differ by under 5 % of the distance they travel.
TEST(AdamW8bit, TrainsBesideF32AdamW) {
  manual_seed(5);
  const Tensor target = randn({64, 96}), w0 = randn({64, 96});
  auto train = [&](bool eight_bit) {
    manual_seed(6);
    Tensor w = nn::parameter(w0.clone());
    AdamW8bitOptions o;
    o.lr = 2e-2;
    o.state_bits = eight_bit ? 8 : 32;
    AdamW8bit opt({w}, o);
    double loss = 0, first = 0;
    for (int s = 0; s < 300; ++s) {
      const Tensor x = randn({32, 64});
      Tensor l = mean(square(sub(matmul(x, w), matmul(x, target))));
      w.set_grad(Tensor());
      l.backward();
      opt.step();
      loss = l.item<double>();
      if (s == 0) first = loss;
    }
    EXPECT_LT(loss, 0.05 * first) << "it trained";
    return std::make_pair(w.detach(), loss);
  };
  const auto [w32, loss32] = train(false);
  const auto [w8, loss8] = train(true);
  auto l2 = [](const Tensor& t) { return std::sqrt(sum(square(t)).item<double>()); };
  const double moved = l2(sub(w32, w0)), apart = l2(sub(w8, w32));
  EXPECT_LT(apart, 0.05 * moved) << "f32 moved " << moved << ", 8-bit ended " << apart << " from it";
  EXPECT_LT(loss8, 1.05 * loss32 + 1e-3) << "losses " << loss8 << " vs " << loss32;
}

TEST(AdamW8bit, ResumeIsBitIdentical) {
  manual_seed(3);
  const std::vector<Tensor> init = {randn({40, 120}), randn({7})};
  auto fresh = [&] {
    std::vector<Tensor> ps;
    for (const Tensor& t : init) ps.push_back(nn::parameter(t.clone()));
    return ps;
  };
  auto steps = [](Optimizer& opt, std::vector<Tensor>& ps, int n, uint64_t seed) {
    manual_seed(seed);
    for (int s = 0; s < n; ++s) {
      for (Tensor& p : ps) p.set_grad(randn(p.sizes()));
      opt.step();
    }
  };
  std::vector<Tensor> a = fresh();
  AdamW8bit oa(a);
  steps(oa, a, 3, 10);
  StateDict sd = oa.state_dict();
  for (auto& [k, t] : sd.tensors) t = t.clone();
  sd.meta = nlohmann::json::parse(sd.meta.dump());
  std::vector<Tensor> b;
  for (const Tensor& t : a) b.push_back(nn::parameter(t.detach().clone()));
  steps(oa, a, 4, 11);
  AdamW8bit ob(b);
  ob.load_state_dict(sd);
  EXPECT_EQ(ob.state_nbytes(), oa.state_nbytes());
  steps(ob, b, 4, 11);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<float>(), b[i].to_vector<float>()) << "param " << i;
}

TEST(AdamW8bit, BadLoadsAndOptionsSaySo) {
  Tensor w = nn::parameter(randn({40, 120}));
  w.set_grad(ones_like(w));
  AdamW f32({w});
  f32.step();
  AdamW8bit q({w});
  auto message = [](const auto& f) { return testing::error_of(f); };
  // Another optimizer's state is refused, naming both.
  AdamOptions plain;
  Adam adam({w}, plain);
  adam.step();
  EXPECT_NE(message([&] { q.load_state_dict(adam.state_dict()); }).find("saved by a Adam optimizer"),
            std::string::npos);
  q.step();
  StateDict sd = q.state_dict();
  for (auto& [k, t] : sd.tensors) t = t.clone();
  StateDict neg = sd;
  neg.tensors["state.0.exp_avg_sq_absmax"] = mul(neg.tensors["state.0.exp_avg_sq_absmax"], -1.0);
  EXPECT_NE(message([&] { q.load_state_dict(neg); }).find("must be finite and >= 0"), std::string::npos);
  StateDict wrong = sd;
  wrong.tensors["state.0.exp_avg"] = zeros({40, 120});
  EXPECT_NE(message([&] { q.load_state_dict(wrong); }).find("(expected u8)"), std::string::npos);
  StateDict blocks = sd;
  blocks.tensors["state.0.exp_avg_absmax"] = zeros({2});
  EXPECT_NE(message([&] { q.load_state_dict(blocks); }).find("expected [3]"), std::string::npos);

  AdamW8bitOptions o;
  o.amsgrad = true;
  EXPECT_NE(message([&] { AdamW8bit({w}, o); }).find("amsgrad has no 8-bit state"), std::string::npos);
  o = AdamW8bitOptions();
  o.state_bits = 16;
  EXPECT_NE(message([&] { AdamW8bit({w}, o); }).find("state_bits must be 8 or 32, got 16"), std::string::npos);
  o = AdamW8bitOptions();
  o.fused = false;
  EXPECT_NE(message([&] { AdamW8bit({w}, o); }).find("needs fused = true"), std::string::npos);
}

// A checkpoint of either optimizer resumes in the other: AdamW's f32 moments are quantized as a
// step would store them (the codes of the written-out rule, block by block), AdamW8bit's codes are
// read back to f32 exactly; options and steps carry over, and training goes on.
TEST(AdamW8bit, StateConvertsBetweenAdamWAndAdamW8bit) {
  manual_seed(4);
  const Tensor init = randn({5000});
  Tensor a = nn::parameter(init.clone()), b = nn::parameter(init.clone());
  AdamW f32({a});
  AdamW8bit q({b});
  for (int s = 0; s < 3; ++s) {
    const Tensor g = randn({5000});
    a.set_grad(g);
    b.set_grad(g.clone());
    f32.step();
    q.step();
  }
  // AdamW -> AdamW8bit.
  Tensor c = nn::parameter(a.detach().clone());
  AdamW8bit into8(std::vector<Tensor>{c});
  into8.load_state_dict(f32.state_dict());
  const auto m32 = f32.state(a)->buffers.at("exp_avg").to_vector<float>();
  const ParamState* s8 = into8.state(c);
  ASSERT_NE(s8, nullptr);
  EXPECT_EQ(s8->step, 3);
  const auto codes = s8->buffers.at("exp_avg").to_vector<uint8_t>();
  const auto absmax = s8->buffers.at("exp_avg_absmax").to_vector<float>();
  ASSERT_EQ(absmax.size(), 3u);
  for (size_t i = 0; i < codes.size(); ++i) {
    const float am = absmax[i / kBlock];
    ASSERT_GT(am, 0x1p-126f);  // a normal reciprocal: the moment times 1 / am
    ASSERT_EQ(codes[i], nearest(kernels::quant_code(true), m32[i] * (1.0f / am))) << "element " << i;
  }
  // AdamW8bit -> AdamW: the f32 moments are what the codes stand for.
  Tensor d = nn::parameter(b.detach().clone());
  AdamW from8(std::vector<Tensor>{d});
  from8.load_state_dict(q.state_dict());
  const auto qm = q.state(b)->buffers.at("exp_avg").to_vector<uint8_t>();
  const auto qa = q.state(b)->buffers.at("exp_avg_absmax").to_vector<float>();
  const auto back = from8.state(d)->buffers.at("exp_avg").to_vector<float>();
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], kernels::quant_code(true)[qm[i]] * qa[i / kBlock]);
  EXPECT_EQ(from8.state(d)->buffers.count("exp_avg_absmax"), 0u);
  // Both go on training.
  for (Tensor* p : {&c, &d}) p->set_grad(ones_like(*p));
  into8.step();
  from8.step();
  EXPECT_EQ(into8.state(c)->step, 4);
  EXPECT_EQ(from8.state(d)->step, 4);
}

}  // namespace
}  // namespace mg::optim
