// kernels/cuda/fp8.cu against the CPU reference (kernels/cpu/fp8.cc, fp8_math.h), bit for bit:
// the hardware's f32 -> FP8 conversion (cvt.rn.satfinite) and memgrad's round-to-nearest-even
// give the same codes for every value, e4m3 and e5m2, from f32, f16 and bf16 inputs (normals,
// subnormals, exact midpoints, values past the largest finite, infinities, NaN); amax and the
// scale are the same bits; dequantizing gives the same values. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/fp8_math.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace mg::testing {
namespace {

using kernels::Fp8Format;

class Fp8Parity : public CudaTest {};

// Values for the format at scale 1: every binade it holds and beyond, each code's value, the
// midpoints between neighbouring codes (ties), and the specials.
std::vector<float> probe_values(const kernels::fp8_math::Format& f) {
  std::vector<float> v;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  const int lo = -(f.bias + f.mantissa_bits + 3), hi = static_cast<int>(std::log2(f.max_finite)) + 3;
  for (int e = lo; e <= hi; ++e)
    for (int k = 0; k < 64; ++k) v.push_back(std::ldexp(frac(rng), e));
  for (int c = 0; c < f.max_code; ++c) {
    const float a = kernels::fp8_math::decode(static_cast<uint8_t>(c), f);
    const float b = kernels::fp8_math::decode(static_cast<uint8_t>(c + 1), f);
    v.push_back(a);
    v.push_back(0.5f * (a + b));
    v.push_back(std::nextafter(0.5f * (a + b), 0.0f));
    v.push_back(std::nextafter(0.5f * (a + b), INFINITY));
  }
  for (float s : {INFINITY, NAN, 0.0f, 3.4e38f, f.max_finite, std::nextafter(f.max_finite, INFINITY)}) v.push_back(s);
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

TEST_F(Fp8Parity, QuantizeMatchesTheCpuCodeForCode) {
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const auto& f = fmt == Fp8Format::E4M3 ? kernels::fp8_math::kE4M3 : kernels::fp8_math::kE5M2;
    const std::vector<float> vals = probe_values(f);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor x = raw::to_dtype(from_vector(vals, {static_cast<int64_t>(vals.size())}), dt);
      const Tensor one = ones({1});
      const std::vector<uint8_t> cpu = kernels::fp8_quantize(x, one, fmt).to_vector<uint8_t>();
      const std::vector<uint8_t> gpu = kernels::fp8_quantize(to_cuda(x), to_cuda(one), fmt).cpu().to_vector<uint8_t>();
      const std::vector<float> xs = raw::to_dtype(x, DType::f32).to_vector<float>();
      int64_t differ = 0;
      for (size_t i = 0; i < cpu.size(); ++i) {
        // NaN: any NaN code of the sign (the hardware writes S.1111.111 / S.11111.11).
        const bool nan = std::isnan(xs[i]);
        if (nan ? !std::isnan(kernels::fp8_math::decode(gpu[i], f)) : cpu[i] != gpu[i]) {
          if (++differ <= 5)
            ADD_FAILURE() << dstr(dt) << (fmt == Fp8Format::E4M3 ? " e4m3" : " e5m2") << ": x = " << xs[i]
                          << ", CPU code " << int(cpu[i]) << ", GPU code " << int(gpu[i]);
        }
      }
      EXPECT_EQ(differ, 0) << "of " << cpu.size() << " values";
    }
  }
}

// Current scaling on a tensor with a few large outliers: the same amax and scale bits, the same
// codes, and the same dequantized values in f32 and bf16.
TEST_F(Fp8Parity, CurrentScalingAndDequantizeMatchTheCpu) {
  Generator g(9);
  std::vector<float> v = randn({1 << 16}, {}, &g).to_vector<float>();
  v[123] = 900.0f;
  v[4567] = -1e-30f;
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int margin : {0, 3}) {
      const Tensor x = from_vector(v, {static_cast<int64_t>(v.size())});
      const kernels::Fp8Scale c = kernels::fp8_current_scale(x, fmt, margin);
      const kernels::Fp8Scale d = kernels::fp8_current_scale(to_cuda(x), fmt, margin);
      EXPECT_TRUE(same_bits(c.amax.item<float>(), d.amax.cpu().item<float>()));
      EXPECT_TRUE(same_bits(c.scale.item<float>(), d.scale.cpu().item<float>()))
          << c.scale.item<float>() << " vs " << d.scale.cpu().item<float>();
      const Tensor qc = kernels::fp8_quantize(x, c.scale, fmt), qd = kernels::fp8_quantize(to_cuda(x), d.scale, fmt);
      EXPECT_EQ(qc.to_vector<uint8_t>(), qd.cpu().to_vector<uint8_t>());
      for (DType out : {DType::f32, DType::bf16}) {
        const std::vector<float> a =
            raw::to_dtype(kernels::fp8_dequantize(qc, c.scale, fmt, out), DType::f32).to_vector<float>();
        const std::vector<float> b =
            raw::to_dtype(kernels::fp8_dequantize(qd, d.scale, fmt, out).cpu(), DType::f32).to_vector<float>();
        int64_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += !same_bits(a[i], b[i]);
        EXPECT_EQ(differ, 0) << dstr(out);
      }
    }
  // A NaN anywhere makes amax NaN and the scale 1 on both.
  v[77] = NAN;
  const Tensor x = from_vector(v, {static_cast<int64_t>(v.size())});
  const kernels::Fp8Scale d = kernels::fp8_current_scale(to_cuda(x), Fp8Format::E4M3);
  EXPECT_TRUE(std::isnan(d.amax.cpu().item<float>()));
  EXPECT_EQ(d.scale.cpu().item<float>(), 1.0f);
}

// amax reads 8 elements a load from a 16-byte-aligned start and one at a time otherwise (and in
// the last n % 8): a contiguous view starting 0 to 7 elements into its storage, of lengths that
// leave every remainder, with the largest magnitude placed first, in the middle and last, gives
// the CPU's amax bits every time, as does an empty tensor (amax 0, scale 1).
TEST_F(Fp8Parity, AmaxOfUnalignedStartsAndOddLengthsMatchesTheCpu) {
  Generator g(13);
  const std::vector<float> base = randn({300}, {}, &g).to_vector<float>();
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t start = 0; start < 8; ++start)
      for (int64_t len : {1, 7, 8, 9, 15, 17, 64, 131, 257})
        for (int at : {0, 1, 2}) {
          std::vector<float> v = base;
          const int64_t peak = start + (at == 0 ? 0 : at == 1 ? len / 2 : len - 1);
          v[peak] = -37.5f;  // exact in f16 and bf16
          const Tensor whole = raw::to_dtype(from_vector(v, {static_cast<int64_t>(v.size())}), dt);
          const Tensor view = raw::slice(to_cuda(whole), 0, start, start + len, 1);
          const kernels::Fp8Scale c =
              kernels::fp8_current_scale(raw::slice(whole, 0, start, start + len, 1), Fp8Format::E4M3);
          const kernels::Fp8Scale d = kernels::fp8_current_scale(view, Fp8Format::E4M3);
          EXPECT_EQ(d.amax.cpu().item<float>(), 37.5f) << dstr(dt) << " start " << start << " len " << len;
          EXPECT_TRUE(same_bits(c.scale.item<float>(), d.scale.cpu().item<float>()))
              << dstr(dt) << " start " << start << " len " << len;
        }
  const kernels::Fp8Scale e = kernels::fp8_current_scale(to_cuda(zeros({0})), Fp8Format::E5M2);
  EXPECT_EQ(e.amax.cpu().item<float>(), 0.0f);
  EXPECT_EQ(e.scale.cpu().item<float>(), 1.0f);
}

// fp8_cast on the device: the same scale_inv bits, codes and transposed codes as on the CPU.
TEST_F(Fp8Parity, CastAndTransposeMatchTheCpu) {
  Generator g(12);
  const Tensor x = raw::to_dtype(randn({200, 72}, {}, &g), DType::bf16);  // not a multiple of the 32 x 32 tile
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const kernels::Fp8Matrix c = kernels::fp8_cast(x, fmt, true, true),
                             d = kernels::fp8_cast(to_cuda(x), fmt, true, true);
    EXPECT_TRUE(same_bits(c.scale_inv.item<float>(), d.scale_inv.cpu().item<float>()));
    EXPECT_EQ(c.codes.to_vector<uint8_t>(), d.codes.cpu().to_vector<uint8_t>());
    EXPECT_EQ(c.codes_t.to_vector<uint8_t>(), d.codes_t.cpu().to_vector<uint8_t>());
  }
}

// The column sums a cast takes (a linear's bias gradient) on the device, through the vector tile
// kernels (64 x 128 tiles for rows and columns multiples of 8 from a start 8 elements aligned, up to
// [3104, 8192]; 32 x 128 for multiples of 4, [100, 68], or a start 4 elements aligned) and the
// 32 x 32 one (any shape, and a start not 4 elements aligned), against the CPU's row-by-row
// f32 sums: the device adds each tile's rows, then the tiles, in another order. Both are within R * 2^-24 * sum |x| of
// the exact sum (f32's rounding of each of R - 1 additions, 2^-24 of the running magnitude), so they differ by at most
// twice that. The codes are the CPU's bit for bit, with the sums asked or not.
TEST_F(Fp8Parity, CastColumnSumsMatchTheCpuWithinF32Rounding) {
  Generator g(13);
  for (DType dt : {DType::f32, DType::bf16})
    for (Shape shape : {Shape{256, 640}, Shape{200, 72}, Shape{100, 68}, Shape{33, 37}, Shape{3104, 8192}})
      for (int64_t start : {0, 1, 4}) {
        const int64_t n = shape_numel(shape), R = shape[0], C = shape[1];
        const Tensor flat = raw::to_dtype(randn({n + start}, {}, &g), dt);
        const Tensor x = raw::reshape(raw::slice(flat, 0, start, start + n, 1), shape);
        const Tensor xd = raw::reshape(raw::slice(to_cuda(flat), 0, start, start + n, 1), shape);
        const std::string what = dstr(dt) + " " + shape_str(shape) + " start " + std::to_string(start);
        const kernels::Fp8Matrix c = kernels::fp8_cast(x, Fp8Format::E5M2, {true, true, true});
        const kernels::Fp8Matrix d = kernels::fp8_cast(xd, Fp8Format::E5M2, {true, true, true});
        EXPECT_EQ(c.codes.to_vector<uint8_t>(), d.codes.cpu().to_vector<uint8_t>()) << what;
        EXPECT_EQ(c.codes_t.to_vector<uint8_t>(), d.codes_t.cpu().to_vector<uint8_t>()) << what;
        const std::vector<float> v = raw::contiguous(raw::to_dtype(x, DType::f32)).to_vector<float>();
        const std::vector<float> a = c.column_sums.to_vector<float>(), b = d.column_sums.cpu().to_vector<float>();
        for (int64_t col = 0; col < C; ++col) {
          double mag = 0;
          for (int64_t r = 0; r < R; ++r) mag += std::fabs(v[r * C + col]);
          ASSERT_NEAR(a[col], b[col], 2.0 * R * 0x1p-24 * mag) << what << " column " << col;
        }
      }
}

// Delayed scaling on the device against the CPU over a run of casts whose amax rises and falls
// (past the history's, so some values saturate, and back): the same scale_inv, codes, transposed
// codes, history bits and scale after every cast (and the codes again from that scale, as a
// checkpoint replay casts), through the 64 x 128 tile kernel (up to 3,136 tiles adding their amax
// to one history slot), the 32 x 128 one ([100, 68]) and the 32 x 32 one.
TEST_F(Fp8Parity, DelayedScalingMatchesTheCpuCastForCast) {
  Generator g(14);
  for (Shape shape : {Shape{256, 640}, Shape{100, 68}, Shape{33, 37}, Shape{3104, 8192}}) {
    kernels::Fp8History hc, hd;
    const Tensor base = raw::to_dtype(randn(shape, {}, &g), DType::bf16);
    const double factors[] = {1.0, 0.5, 8.0, 0.25, 3.0, 1.0, 0.125, 2.0};
    const int casts = shape[0] > 1000 ? 6 : 2 * kernels::kFp8HistoryLen + 4;
    for (int k = 0; k < casts; ++k) {
      const Tensor x = raw::to_dtype(kernels::mul_scalar(base, factors[k % 8] * (k < 20 ? 1.0 : 0.01)), DType::bf16);
      const kernels::Fp8Matrix c = kernels::fp8_cast_delayed(x, Fp8Format::E5M2, {true, true, false}, hc);
      const kernels::Fp8Matrix d = kernels::fp8_cast_delayed(to_cuda(x), Fp8Format::E5M2, {true, true, false}, hd);
      const std::string what = shape_str(shape) + " cast " + std::to_string(k);
      ASSERT_TRUE(same_bits(c.scale_inv.item<float>(), d.scale_inv.cpu().item<float>())) << what;
      ASSERT_TRUE(same_bits(c.scale.item<float>(), d.scale.cpu().item<float>())) << what;
      ASSERT_EQ(c.codes.to_vector<uint8_t>(), d.codes.cpu().to_vector<uint8_t>()) << what;
      ASSERT_EQ(c.codes_t.to_vector<uint8_t>(), d.codes_t.cpu().to_vector<uint8_t>()) << what;
      // A checkpoint replay's cast with the scale the cast wrote: the same codes.
      const kernels::Fp8Matrix r =
          kernels::fp8_cast_scaled(to_cuda(x), Fp8Format::E5M2, {true, true, false}, d.scale, d.scale_inv);
      ASSERT_EQ(r.codes.cpu().to_vector<uint8_t>(), c.codes.to_vector<uint8_t>()) << what;
      ASSERT_EQ(r.codes_t.cpu().to_vector<uint8_t>(), c.codes_t.to_vector<uint8_t>()) << what;
      const std::vector<float> a = hc.amax.to_vector<float>(), b = hd.amax.cpu().to_vector<float>();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(same_bits(a[i], b[i])) << what << " slot " << i;
    }
    EXPECT_EQ(hd.casts, casts);
  }
}

// An Adam update that also writes the FP8 recipe's cast of the new weight (AdamTensors::fp8_casts:
// one tile kernel on the device, or the list's update and the cast apart where the tile kernel
// does not take the shape) against the update, then fp8_cast_delayed of its result: the same
// parameters and moments, codes, scales and history, bit for bit, over several steps; a step a
// GradScaler skips leaves the weight as it is and casts it.
TEST_F(Fp8Parity, AdamUpdateWritesTheDelayedCastOfItsResult) {
  Generator g(16);
  for (Shape shape : {Shape{96, 160}, Shape{6400, 1600}, Shape{100, 68}, Shape{30, 18}}) {
    const Tensor p0 = to_cuda(randn(shape, {}, &g)), m0 = to_cuda(kernels::mul_scalar(randn(shape, {}, &g), 0.1));
    const Tensor v0 = to_cuda(zeros(shape));
    Tensor found = to_cuda(zeros({1}));
    // Two copies: one updated with the cast written, one updated and then cast.
    Tensor pa = p0.clone(), ma = m0.clone(), va = v0.clone(), pb = p0.clone(), mb = m0.clone(), vb = v0.clone();
    kernels::Fp8History ha, hb;
    for (int k = 0; k < 3; ++k) {  // a history of a few casts of the weight, the same in both
      kernels::fp8_cast_delayed(pa, Fp8Format::E4M3, {true, true, false}, ha);
      kernels::fp8_cast_delayed(pb, Fp8Format::E4M3, {true, true, false}, hb);
    }
    kernels::AdamHyper h;
    h.lr = 1e-2;
    h.weight_decay = 0.1;
    h.decoupled_weight_decay = true;
    for (int step = 1; step <= 4; ++step) {
      const std::string what = shape_str(shape) + " step " + std::to_string(step);
      const Tensor grad = to_cuda(randn(shape, {}, &g));
      const bool skipped = step == 3;
      const std::vector<float> before = pa.cpu().to_vector<float>();
      found.fill_(skipped ? 1.0 : 0.0);
      const kernels::Fp8WeightCast c = kernels::fp8_reserve_delayed(pa, Fp8Format::E4M3, ha);
      kernels::AdamTensors a{{pa}, {grad}, {ma}, {va}, {}, {}, {}, {step}, {}, {}, {c}};
      kernels::adam_multi_tensor_(a, h, {Tensor(), found});
      ++ha.casts;
      kernels::AdamTensors b{{pb}, {grad}, {mb}, {vb}, {}, {}, {}, {step}, {}, {}, {}};
      kernels::adam_multi_tensor_(b, h, {Tensor(), found});
      const kernels::Fp8Matrix want = kernels::fp8_cast_delayed(pb, Fp8Format::E4M3, {true, true, false}, hb);
      if (skipped) EXPECT_EQ(pa.cpu().to_vector<float>(), before) << what;
      for (const auto& [x, y, name] :
           {std::tuple{pa, pb, "param"}, std::tuple{ma, mb, "exp_avg"}, std::tuple{va, vb, "exp_avg_sq"}}) {
        const std::vector<float> xv = x.cpu().to_vector<float>(), yv = y.cpu().to_vector<float>();
        ASSERT_EQ(xv.size(), yv.size());
        for (size_t i = 0; i < xv.size(); ++i) ASSERT_TRUE(same_bits(xv[i], yv[i])) << what << " " << name << " " << i;
      }
      ASSERT_EQ(c.codes.cpu().to_vector<uint8_t>(), want.codes.cpu().to_vector<uint8_t>()) << what;
      ASSERT_EQ(c.codes_t.cpu().to_vector<uint8_t>(), want.codes_t.cpu().to_vector<uint8_t>()) << what;
      ASSERT_TRUE(same_bits(c.scale.cpu().item<float>(), want.scale.cpu().item<float>())) << what;
      ASSERT_TRUE(same_bits(c.scale_inv.cpu().item<float>(), want.scale_inv.cpu().item<float>())) << what;
      const std::vector<float> hav = ha.amax.cpu().to_vector<float>(), hbv = hb.amax.cpu().to_vector<float>();
      for (size_t i = 0; i < hav.size(); ++i) ASSERT_TRUE(same_bits(hav[i], hbv[i])) << what << " slot " << i;
    }
  }
}

// The layer norm's pass writing the FP8 codes of its output for the linear after it
// (kernels::add_layer_norm_fp8_delayed, the fused kernel) against the norm writing bf16 then the
// delayed cast of that: the same sum, statistics, codes, transpose, scales and history, bit for
// bit. Widths of one to sixteen 128-element groups and one past the kernel's (composed), a last
// block of 16 rows, with and without the residual, its bias and the norm's bias; the history's
// scale grows past some values (saturation) in the third cast.
TEST_F(Fp8Parity, NormCastIsTheNormThenTheDelayedCast) {
  Generator g(17);
  struct Case {
    int64_t rows, n;
    bool res, rb, bias;
  };
  for (const Case c :
       {Case{96, 1600, true, true, true}, Case{48, 768, true, false, true}, Case{64, 2048, false, false, true},
        Case{32, 64, true, true, false}, Case{16, 2064, true, true, true}, Case{8208, 1600, true, false, true}}) {
    const std::string what = std::to_string(c.rows) + " x " + std::to_string(c.n);
    const Tensor w = to_cuda(kernels::add_scalar(kernels::mul_scalar(randn({c.n}, {}, &g), 0.1), 1.0));
    const Tensor b = c.bias ? to_cuda(kernels::mul_scalar(randn({c.n}, {}, &g), 0.1)) : Tensor();
    const Tensor rb = c.rb ? to_cuda(randn({c.n}, {}, &g)) : Tensor();
    kernels::Fp8History fused, apart;
    for (int k = 0; k < 4; ++k) {
      const std::string at = what + " cast " + std::to_string(k);
      const Tensor x = to_cuda(kernels::mul_scalar(randn({c.rows, c.n}, {}, &g), k == 2 ? 4.0 : 1.0));
      const Tensor res = c.res ? to_cuda(raw::to_dtype(randn({c.rows, c.n}, {}, &g), DType::bf16)) : Tensor();
      const kernels::Fp8NormCast f = kernels::add_layer_norm_fp8_delayed(x, res, {c.n}, w, b, 1e-5, DType::bf16, rb,
                                                                         Fp8Format::E4M3, {true, true, false}, fused);
      auto [sum, y, mean, rstd] = kernels::add_layer_norm_forward(x, res, {c.n}, w, b, 1e-5, DType::bf16, rb);
      const kernels::Fp8Matrix want = kernels::fp8_cast_delayed(y, Fp8Format::E4M3, {true, true, false}, apart);
      ASSERT_EQ(fused.casts, apart.casts) << at;
      for (const auto& [u, v, name] :
           {std::tuple{f.sum, sum, "sum"}, std::tuple{f.mean, mean, "mean"}, std::tuple{f.rstd, rstd, "rstd"},
            std::tuple{f.out.scale, want.scale, "scale"}, std::tuple{f.out.scale_inv, want.scale_inv, "scale_inv"},
            std::tuple{fused.amax, apart.amax, "history"}}) {
        const std::vector<float> uv = u.cpu().to_vector<float>(), vv = v.cpu().to_vector<float>();
        ASSERT_EQ(uv.size(), vv.size()) << at << " " << name;
        for (size_t i = 0; i < uv.size(); ++i) ASSERT_TRUE(same_bits(uv[i], vv[i])) << at << " " << name << " " << i;
      }
      ASSERT_EQ(f.out.codes.cpu().to_vector<uint8_t>(), want.codes.cpu().to_vector<uint8_t>()) << at;
      ASSERT_EQ(f.out.codes_t.cpu().to_vector<uint8_t>(), want.codes_t.cpu().to_vector<uint8_t>()) << at;
    }
  }
}

// A history made on the host (casts there, or a checkpoint loaded where a model's masters live)
// follows the next cast to the device: its amaxes carry over, so the device's cast takes the scale
// the host's next cast would have, code for code.
TEST_F(Fp8Parity, DelayedHistoryFollowsTheCastToTheDevice) {
  Generator g(15);
  const Tensor base = raw::to_dtype(randn({64, 96}, {}, &g), DType::bf16);
  kernels::Fp8History on_host, twin;
  for (double f : {1.0, 4.0, 0.5}) {
    kernels::fp8_cast_delayed(raw::to_dtype(kernels::mul_scalar(base, f), DType::bf16), Fp8Format::E4M3,
                              {true, false, false}, on_host);
    kernels::fp8_cast_delayed(raw::to_dtype(kernels::mul_scalar(base, f), DType::bf16), Fp8Format::E4M3,
                              {true, false, false}, twin);
  }
  const kernels::Fp8Matrix want = kernels::fp8_cast_delayed(base, Fp8Format::E4M3, {true, true, false}, twin);
  const kernels::Fp8Matrix got =
      kernels::fp8_cast_delayed(to_cuda(base), Fp8Format::E4M3, {true, true, false}, on_host);
  EXPECT_TRUE(on_host.amax.is_cuda());
  EXPECT_EQ(on_host.casts, 4);
  EXPECT_TRUE(same_bits(got.scale.cpu().item<float>(), want.scale.item<float>()));
  EXPECT_EQ(got.codes.cpu().to_vector<uint8_t>(), want.codes.to_vector<uint8_t>());
  EXPECT_EQ(got.codes_t.cpu().to_vector<uint8_t>(), want.codes_t.to_vector<uint8_t>());
}

// The GELU-backward cast under delayed scaling (the derivative taken in the cast's pass) against
// the device's own composition, binary(GeluTanhBackward) then fp8_cast_delayed (the derivative's
// tanh is the device's, not the CPU's: CastGeluBackwardEqualsTheDerivativeThenTheCast), cast after
// cast: the same scale_inv, codes, column sums and history bits.
TEST_F(Fp8Parity, GeluBackwardDelayedCastIsTheDerivativeThenTheDelayedCast) {
  Generator g(15);
  for (Shape shape : {Shape{256, 640}, Shape{33, 37}}) {
    kernels::Fp8History hc, hd;
    for (int k = 0; k < 6; ++k) {
      const Tensor gv = raw::to_dtype(kernels::mul_scalar(randn(shape, {}, &g), 1.0 + 2 * (k % 3)), DType::bf16);
      const Tensor pre = raw::to_dtype(kernels::mul_scalar(randn(shape, {}, &g), 3.0), DType::bf16);
      const Tensor gd = to_cuda(gv), pd = to_cuda(pre);
      const kernels::Fp8Matrix c = kernels::fp8_cast_delayed(kernels::binary(kernels::Binary::GeluTanhBackward, gd, pd),
                                                             Fp8Format::E5M2, {true, true, true}, hc);
      const kernels::Fp8Matrix d =
          kernels::fp8_cast_gelu_backward_delayed(gd, pd, Fp8Format::E5M2, {true, true, true}, hd);
      const std::string what = shape_str(shape) + " cast " + std::to_string(k);
      ASSERT_TRUE(same_bits(c.scale_inv.cpu().item<float>(), d.scale_inv.cpu().item<float>())) << what;
      ASSERT_EQ(c.codes.cpu().to_vector<uint8_t>(), d.codes.cpu().to_vector<uint8_t>()) << what;
      ASSERT_EQ(c.codes_t.cpu().to_vector<uint8_t>(), d.codes_t.cpu().to_vector<uint8_t>()) << what;
      const std::vector<float> a = hc.amax.cpu().to_vector<float>(), b = hd.amax.cpu().to_vector<float>();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(same_bits(a[i], b[i])) << what << " slot " << i;
      const std::vector<float> sc = c.column_sums.cpu().to_vector<float>(), sd = d.column_sums.cpu().to_vector<float>();
      for (size_t i = 0; i < sc.size(); ++i) ASSERT_TRUE(same_bits(sc[i], sd[i])) << what << " column " << i;
    }
  }
}

// The gelu casts (the MLP's hidden activation cast from its pre-activation, Fp8Of::GeluOfX)
// against the device's own composition, unary(GeluTanh) then the plain cast (the GELU's tanh is the
// device's, not the CPU's): under current scaling (the amax pass and the cast both take the GELU),
// with a replay's scale, and under delayed scaling cast after cast, the same scale_inv, codes,
// transposed codes, column sums and history bits; in f32, f16 and bf16, for the vector kernels'
// shapes (8 and 4 elements a load) and one that leaves a tail (the one-element kernel), from an
// aligned start and one that is not (the amax pass's one-at-a-time loads; the composition's
// fresh GELU output takes a vector kernel, whose column sums are added in the same order).
TEST_F(Fp8Parity, GeluCastIsTheGeluThenTheCast) {
  Generator gen(19);
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (Shape shape : {Shape{256, 640}, Shape{100, 68}, Shape{33, 37}})
      for (int64_t start : {0, 1}) {
        kernels::Fp8History fused, plain;
        for (int k = 0; k < 4; ++k) {
          const int64_t n = shape_numel(shape);
          const Tensor p0 = to_cuda(raw::to_dtype(kernels::mul_scalar(randn({n + start}, {}, &gen), 1.0 + k), dt));
          const Tensor pre = raw::reshape(raw::slice(p0, 0, start, start + n, 1), shape);
          const Tensor h = kernels::unary(kernels::Unary::GeluTanh, pre);
          const std::string what =
              dstr(dt) + " " + shape_str(shape) + " start " + std::to_string(start) + " cast " + std::to_string(k);
          const auto expect_same = [&](const kernels::Fp8Matrix& got, const kernels::Fp8Matrix& want, const char* how) {
            ASSERT_TRUE(same_bits(got.scale_inv.cpu().item<float>(), want.scale_inv.cpu().item<float>()))
                << what << " " << how;
            ASSERT_EQ(got.codes.cpu().to_vector<uint8_t>(), want.codes.cpu().to_vector<uint8_t>())
                << what << " " << how;
            ASSERT_EQ(got.codes_t.cpu().to_vector<uint8_t>(), want.codes_t.cpu().to_vector<uint8_t>())
                << what << " " << how;
            const std::vector<float> a = got.column_sums.cpu().to_vector<float>(),
                                     b = want.column_sums.cpu().to_vector<float>();
            for (size_t i = 0; i < a.size(); ++i)
              ASSERT_TRUE(same_bits(a[i], b[i])) << what << " " << how << " col " << i;
          };
          const kernels::Fp8Matrix want = kernels::fp8_cast(h, Fp8Format::E4M3, {true, true, true});
          expect_same(kernels::fp8_cast(pre, Fp8Format::E4M3, {true, true, true}, 0, kernels::Fp8Of::GeluOfX), want,
                      "current");
          expect_same(kernels::fp8_cast_scaled(pre, Fp8Format::E4M3, {true, true, true}, want.scale, want.scale_inv,
                                               kernels::Fp8Of::GeluOfX),
                      want, "scaled");
          expect_same(
              kernels::fp8_cast_delayed(pre, Fp8Format::E4M3, {true, true, true}, fused, 0, kernels::Fp8Of::GeluOfX),
              kernels::fp8_cast_delayed(h, Fp8Format::E4M3, {true, true, true}, plain), "delayed");
          const std::vector<float> a = fused.amax.cpu().to_vector<float>(), b = plain.amax.cpu().to_vector<float>();
          for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(same_bits(a[i], b[i])) << what << " slot " << i;
        }
      }
}

// fp8_cast_gelu_backward's one pass (the derivative and the amax) against the device's own
// composition, binary(GeluTanhBackward) then fp8_cast: the same g bits, scale_inv, codes and
// transposed codes in f32, f16 and bf16, for a shape whose element count is a multiple of 8 (the
// vector loads) and one that leaves a tail, and from a start that is not 16-byte aligned.
TEST_F(Fp8Parity, CastGeluBackwardEqualsTheDerivativeThenTheCast) {
  Generator gen(17);
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (Shape shape : {Shape{64, 96}, Shape{33, 37}})
      for (int64_t start : {0, 1}) {
        const int64_t n = shape_numel(shape);
        const Tensor g0 = to_cuda(raw::to_dtype(randn({n + start}, {}, &gen), dt));
        const Tensor pre = to_cuda(raw::to_dtype(kernels::mul_scalar(randn(shape, {}, &gen), 3.0), dt));
        const Tensor want = kernels::binary(kernels::Binary::GeluTanhBackward,
                                            raw::reshape(raw::slice(g0, 0, start, start + n, 1), shape), pre);
        const kernels::Fp8Matrix ref = kernels::fp8_cast(want, Fp8Format::E5M2, {true, true, true});
        const Tensor g = raw::reshape(raw::slice(g0.clone(), 0, start, start + n, 1), shape);
        const kernels::Fp8Matrix got = kernels::fp8_cast_gelu_backward(g, pre, Fp8Format::E5M2, {true, true, true});
        const std::string what = dstr(dt) + " " + shape_str(shape) + " start " + std::to_string(start);
        const std::vector<float> a = raw::to_dtype(g, DType::f32).cpu().to_vector<float>();
        const std::vector<float> b = raw::to_dtype(want, DType::f32).cpu().to_vector<float>();
        int64_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += !same_bits(a[i], b[i]);
        EXPECT_EQ(differ, 0) << what;
        EXPECT_TRUE(same_bits(got.scale_inv.cpu().item<float>(), ref.scale_inv.cpu().item<float>())) << what;
        EXPECT_EQ(got.codes.cpu().to_vector<uint8_t>(), ref.codes.cpu().to_vector<uint8_t>()) << what;
        EXPECT_EQ(got.codes_t.cpu().to_vector<uint8_t>(), ref.codes_t.cpu().to_vector<uint8_t>()) << what;
        // The same values summed: the same bits from an aligned start (the same kernel), else within
        // the two orders' f32 rounding (the test above).
        const std::vector<float> sa = got.column_sums.cpu().to_vector<float>();
        const std::vector<float> sb = ref.column_sums.cpu().to_vector<float>();
        for (int64_t col = 0; col < shape[1]; ++col) {
          double mag = 0;
          for (int64_t r = 0; r < shape[0]; ++r) mag += std::fabs(b[r * shape[1] + col]);
          if (start == 0)
            EXPECT_TRUE(same_bits(sa[col], sb[col])) << what << " column " << col;
          else
            EXPECT_NEAR(sa[col], sb[col], 2.0 * shape[0] * 0x1p-24 * mag) << what << " column " << col;
        }
      }
}

// Codes of small integers (|v| <= 4: exact in both formats) and power-of-two scales: every
// product, partial sum and result is an integer times a power of two below 2^11, exact in any
// accumulator the tensor cores use and in f16, so cuBLASLt's FP8 GEMM must give the CPU
// reference's result bit for bit. This holds the layout, the operand order, the formats and both
// scale pointers to the reference, every format pair Hopper takes.
TEST_F(Fp8Parity, GemmOfExactValuesMatchesTheCpuBitForBit) {
  const int64_t M = 64, N = 96, K = 128;
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> small(-4, 4);
  auto codes = [&](int64_t r, int64_t c, Fp8Format fmt) {
    const auto& f = fmt == Fp8Format::E4M3 ? kernels::fp8_math::kE4M3 : kernels::fp8_math::kE5M2;
    std::vector<uint8_t> v(r * c);
    for (auto& e : v) e = kernels::fp8_math::encode(static_cast<float>(small(rng)), f);
    Tensor t = empty({r, c}, {DType::u8});
    std::memcpy(t.raw_data(), v.data(), v.size());
    return t;
  };
  std::vector<float> bias_v(N);
  for (auto& b : bias_v) b = static_cast<float>(small(rng));
  for (auto [fa, fb] : {std::pair{Fp8Format::E4M3, Fp8Format::E4M3}, std::pair{Fp8Format::E5M2, Fp8Format::E4M3},
                        std::pair{Fp8Format::E4M3, Fp8Format::E5M2}}) {
    const Tensor a = codes(M, K, fa), b = codes(N, K, fb);
    const Tensor ai = from_vector(std::vector<float>{2.0f}, {1}), bi = from_vector(std::vector<float>{0.25f}, {1});
    for (DType out : {DType::f16, DType::bf16, DType::f32}) {
      const Tensor bias = raw::to_dtype(from_vector(bias_v, {N}), out);
      const Tensor c = kernels::fp8_gemm(a, fa, ai, b, fb, bi, bias, out);
      const Tensor d =
          kernels::fp8_gemm(to_cuda(a), fa, to_cuda(ai), to_cuda(b), fb, to_cuda(bi), to_cuda(bias), out).cpu();
      EXPECT_EQ(raw::to_dtype(c, DType::f32).to_vector<float>(), raw::to_dtype(d, DType::f32).to_vector<float>())
          << (fa == Fp8Format::E4M3 ? "e4m3" : "e5m2") << " x " << (fb == Fp8Format::E4M3 ? "e4m3" : "e5m2") << " -> "
          << dstr(out);
    }
  }
}

// Random data at GPT-like K's (a layer's 1024 features; a weight gradient's 8192 tokens): the
// normwise difference from the CPU reference, printed for each accumulation, within 2^-13 *
// sqrt(K). The reference sums in f32; the FP8 tensor cores keep about 14 bits in their
// accumulator between promotions to f32 (2^-13 a step; with fast accumulation, the e4m3 x e4m3
// default, only at the end), and the rounding errors of a random-signed sum grow as sqrt(K).
TEST_F(Fp8Parity, GemmOfRandomDataIsNearTheCpuReference) {
  const int64_t M = 256, N = 384;
  Generator g(22);
  for (int64_t K : {1024, 8192})
    for (auto [fa, fb] : {std::pair{Fp8Format::E4M3, Fp8Format::E4M3}, std::pair{Fp8Format::E5M2, Fp8Format::E4M3}}) {
      const kernels::Fp8Matrix a = kernels::fp8_cast(randn({M, K}, {}, &g), fa, true, false);
      const kernels::Fp8Matrix b = kernels::fp8_cast(randn({N, K}, {}, &g), fb, true, false);
      const std::vector<float> c = kernels::fp8_gemm(a, b, Tensor(), DType::f32).to_vector<float>();
      for (auto [accum, name] : {std::pair{kernels::Fp8Accum::Auto, "auto"}, std::pair{kernels::Fp8Accum::Fast, "fast"},
                                 std::pair{kernels::Fp8Accum::Promoted, "promoted"}}) {
        const std::vector<float> d =
            kernels::fp8_gemm(to_cuda(a.codes), fa, to_cuda(a.scale_inv), to_cuda(b.codes), fb, to_cuda(b.scale_inv),
                              Tensor(), DType::f32, kernels::Fp8Epilogue::None, Tensor(), accum)
                .cpu()
                .to_vector<float>();
        double diff = 0, norm = 0;
        for (size_t i = 0; i < c.size(); ++i) diff += (c[i] - d[i]) * double(c[i] - d[i]), norm += double(c[i]) * c[i];
        const double rel = std::sqrt(diff / norm);
        std::printf("%s x e4m3, K %lld, %s accumulation: normwise difference from the CPU %.3g\n",
                    fa == Fp8Format::E4M3 ? "e4m3" : "e5m2", static_cast<long long>(K), name, rel);
        EXPECT_LT(rel, 0x1p-13 * std::sqrt(static_cast<double>(K))) << name << ", K " << K;
      }
    }
}

// The DGELU epilogue on the device (the GEMM, then the GELU-backward kernel): the CPU's plain
// result times gelu_tanh'(pre), within the device tanh's accuracy (about 1e-4 relative) and f16's
// rounding (2^-11).
TEST_F(Fp8Parity, GemmGeluEpilogueMatchesTheComposedCpu) {
  const int64_t M = 64, N = 128, K = 64;
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> small(-2, 2);
  auto codes = [&](int64_t r, int64_t c) {
    std::vector<uint8_t> v(r * c);
    for (auto& e : v) e = kernels::fp8_math::encode(static_cast<float>(small(rng)), kernels::fp8_math::kE4M3);
    Tensor t = empty({r, c}, {DType::u8});
    std::memcpy(t.raw_data(), v.data(), v.size());
    return t;
  };
  const Tensor a = codes(M, K), b = codes(N, K);
  const Tensor inv = from_vector(std::vector<float>{0.125f}, {1});  // results in [-4, 4]: where GELU bends
  const Tensor plain = kernels::fp8_gemm(a, Fp8Format::E4M3, inv, b, Fp8Format::E4M3, inv, Tensor(), DType::f16);
  const std::vector<float> p = raw::to_dtype(plain, DType::f32).to_vector<float>();
  // The same codes as the gradient and pre = plain / 8 (another range of gelu').
  const Tensor pre = raw::to_dtype(kernels::mul(raw::to_dtype(plain, DType::f32), full({1}, 0.125)), DType::f16);
  const Tensor dg = kernels::fp8_gemm(to_cuda(a), Fp8Format::E4M3, to_cuda(inv), to_cuda(b), Fp8Format::E4M3,
                                      to_cuda(inv), Tensor(), DType::f16, kernels::Fp8Epilogue::DGelu, to_cuda(pre));
  const std::vector<float> want_d = kernels::binary(kernels::Binary::GeluTanhBackward, raw::to_dtype(plain, DType::f32),
                                                    raw::to_dtype(pre, DType::f32))
                                        .to_vector<float>();
  const std::vector<float> got_d = raw::to_dtype(dg.cpu(), DType::f32).to_vector<float>();
  for (size_t i = 0; i < p.size(); ++i)
    ASSERT_NEAR(got_d[i], want_d[i], std::fabs(want_d[i]) * (1e-4 + 0x1p-11) + std::fabs(p[i]) * 1e-4) << i;
}

}  // namespace
}  // namespace mg::testing
