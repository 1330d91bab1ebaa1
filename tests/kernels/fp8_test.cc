// kernels/fp8_math.h and kernels/fp8.h on the CPU: known codes of both formats, every code's
// round trip, round-to-nearest-even against a brute-force search over all 256 codes, saturation
// and NaN; the current-scaling rule and the quantize / dequantize ops, with the error the
// format's mantissa allows; bad input.
#include "kernels/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "core/random.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_math.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "tests/error_of.h"

namespace mg::kernels {
namespace {

using fp8_math::decode;
using fp8_math::encode;
using fp8_math::kE4M3;
using fp8_math::kE5M2;

TEST(Fp8Math, KnownCodes) {
  EXPECT_EQ(encode(1.0f, kE4M3), 0x38);  // biased exponent 7, mantissa 0
  EXPECT_EQ(encode(448.0f, kE4M3), 0x7e);
  EXPECT_EQ(encode(464.0f, kE4M3), 0x7e);                    // past the largest finite: saturated
  EXPECT_EQ(encode(-1e30f, kE4M3), 0xfe);                    // and with its sign
  EXPECT_EQ(encode(INFINITY, kE4M3), 0x7e);                  // satfinite: inf saturates too
  EXPECT_EQ(encode(NAN, kE4M3) & 0x7f, 0x7f);                // NaN stays NaN
  EXPECT_EQ(encode(std::ldexp(1.0f, -9), kE4M3), 0x01);      // the smallest subnormal
  EXPECT_EQ(encode(std::ldexp(1.0f, -10), kE4M3), 0x00);     // half of it: a tie, to even (0)
  EXPECT_EQ(encode(std::ldexp(1.5f, -9), kE4M3), 0x02);      // 1.5 units: a tie, to even (2)
  EXPECT_EQ(encode(1.0625f, kE4M3), 0x38);                   // between 1 and 1.125: to even (1)
  EXPECT_EQ(encode(1.1875f, kE4M3), 0x3a);                   // between 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(encode(std::ldexp(1.96875f, -7), kE4M3), 0x08);  // the subnormals' top rounds up into 2^-6
  EXPECT_EQ(encode(-0.0f, kE4M3), 0x80);
  EXPECT_EQ(encode(1.0f, kE5M2), 0x3c);  // biased exponent 15
  EXPECT_EQ(encode(57344.0f, kE5M2), 0x7b);
  EXPECT_EQ(encode(61440.0f, kE5M2), 0x7b);  // the tie with 2^16 (inf's place): saturated
  EXPECT_EQ(encode(INFINITY, kE5M2), 0x7b);
  EXPECT_EQ(encode(std::ldexp(1.0f, -16), kE5M2), 0x01);
  EXPECT_TRUE(std::isinf(decode(0x7c, kE5M2)));
  EXPECT_TRUE(std::isnan(decode(0x7d, kE5M2)));
  EXPECT_TRUE(std::isnan(decode(0x7f, kE4M3)));
  EXPECT_EQ(decode(0x7e, kE4M3), 448.0f);
  EXPECT_EQ(decode(0x01, kE4M3), std::ldexp(1.0f, -9));
}

// Every finite code decodes to a value that encodes back to it (the two zeros included).
TEST(Fp8Math, EveryFiniteCodeRoundTrips) {
  for (const fp8_math::Format* f : {&kE4M3, &kE5M2})
    for (int c = 0; c < 256; ++c) {
      const float v = decode(static_cast<uint8_t>(c), *f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(encode(v, *f), c) << "code " << c << " (" << v << ")";
    }
}

// Round to nearest, ties to even, against a brute-force search: for values spread over every
// binade a format holds (and past its ends), the chosen code is a nearest finite one, and on a
// tie the one with an even mantissa; beyond the largest finite the largest finite.
TEST(Fp8Math, RoundsToTheNearestCodeTiesToEven) {
  std::mt19937 rng(3);
  for (const fp8_math::Format* f : {&kE4M3, &kE5M2}) {
    const int lo = -(f->bias + f->mantissa_bits + 2), hi = static_cast<int>(std::log2(f->max_finite)) + 2;
    std::uniform_real_distribution<float> frac(1.0f, 2.0f);
    std::uniform_int_distribution<int> ex(lo, hi);
    for (int k = 0; k < 20000; ++k) {
      float x = std::ldexp(frac(rng), ex(rng));
      if (k % 7 == 0) {                                       // an exact midpoint between two neighbouring codes
        const int c = static_cast<int>(rng() % f->max_code);  // c + 1 is finite too
        x = 0.5f * (decode(static_cast<uint8_t>(c), *f) + decode(static_cast<uint8_t>(c + 1), *f));
      }
      if (k % 2) x = -x;
      const uint8_t got = encode(x, *f);
      int best = -1;
      double best_err = 0;
      for (int c = 0; c < 256; ++c) {
        const float v = decode(static_cast<uint8_t>(c), *f);
        if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
        const double err = std::fabs(static_cast<double>(v) - x);
        if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
      }
      EXPECT_EQ(got, best) << "x = " << x;
    }
  }
}

TEST(Fp8Math, ScaleRule) {
  EXPECT_EQ(fp8_math::scale_for(448.0f, kE4M3, 0), 1.0f);
  EXPECT_EQ(fp8_math::scale_for(2.0f, kE4M3, 0), 224.0f);
  EXPECT_EQ(fp8_math::scale_for(2.0f, kE4M3, 2), 56.0f);  // 2^2 of headroom
  EXPECT_EQ(fp8_math::scale_for(0.0f, kE4M3, 0), 1.0f);
  EXPECT_EQ(fp8_math::scale_for(NAN, kE5M2, 0), 1.0f);
  EXPECT_EQ(fp8_math::scale_for(INFINITY, kE5M2, 0), 1.0f);
  EXPECT_EQ(fp8_math::scale_for(1e-42f, kE5M2, 0), 3.40282347e38f);  // capped at the largest f32
}

// Current scaling of a tensor: its amax lands on the largest finite code, and each element
// comes back within half a step of its binade: 2^-(M+1) of its magnitude for normals (M the
// mantissa bits: 1/16 for e4m3, 1/8 for e5m2), and half the subnormal step below them.
TEST(Fp8Ops, CurrentScalingQuantizesWithinHalfAStep) {
  Generator g(11);
  std::vector<float> v = randn({4096}, {}, &g).to_vector<float>();
  for (float& e : v) e *= 3.0f;
  Tensor x = from_vector(v, {4096});
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const fp8_math::Format& f = fmt == Fp8Format::E4M3 ? kE4M3 : kE5M2;
    Fp8Scale s = fp8_current_scale(x, fmt);
    const std::vector<float> xv = x.to_vector<float>();
    float amax = 0;
    for (float v : xv) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(s.amax.item<float>(), amax);
    EXPECT_EQ(s.scale.item<float>(), f.max_finite / amax);
    Tensor q = fp8_quantize(x, s.scale, fmt);
    ASSERT_EQ(q.dtype(), DType::u8);
    ASSERT_EQ(q.sizes(), x.sizes());
    const std::vector<uint8_t> qv = q.to_vector<uint8_t>();
    const std::vector<float> back = fp8_dequantize(q, s.scale, fmt).to_vector<float>();
    const float scale = s.scale.item<float>();
    const double min_normal = std::ldexp(1.0, 1 - f.bias) / scale;
    const double sub_step = std::ldexp(1.0, 1 - f.bias - f.mantissa_bits) / scale;
    int at_max = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      at_max += (qv[i] & 0x7f) == f.max_code;
      const double a = std::fabs(xv[i]);
      // Half a step, plus the f32 roundings of x * scale and of the division (2^-24 each).
      const double bound = (a >= min_normal ? std::ldexp(a, -(f.mantissa_bits + 1)) : 0.5 * sub_step) + a * 0x1p-23;
      ASSERT_LE(std::fabs(back[i] - xv[i]), bound) << "element " << i << " = " << xv[i];
    }
    EXPECT_GE(at_max, 1) << "the amax element takes the largest finite code";
  }
}

TEST(Fp8Ops, BadInputIsAClearError) {
  Tensor x = ones({4});
  Tensor scale = ones({1});
  EXPECT_THROW(fp8_quantize(x, ones({1}, {DType::f64}), Fp8Format::E4M3), DTypeError);
  EXPECT_THROW(fp8_quantize(x, ones({2}), Fp8Format::E4M3), ShapeError);
  EXPECT_THROW(fp8_quantize(ones({4}, {DType::i64}), scale, Fp8Format::E4M3), DTypeError);
  EXPECT_THROW(fp8_dequantize(x, scale, Fp8Format::E4M3), DTypeError);  // f32 is not codes
  EXPECT_THROW(fp8_dequantize(zeros({4}, {DType::u8}), scale, Fp8Format::E4M3, DType::i32), DTypeError);
  EXPECT_THROW(fp8_current_scale(x, Fp8Format::E5M2, -1), ValueError);
}

// fp8_cast: the codes are fp8_quantize's at the current scale, the transpose holds the same
// codes transposed, and scale_inv is 1 / scale rounded once.
TEST(Fp8Ops, CastWritesTheCodesAndTheirTranspose) {
  Generator g(3);
  const Tensor x = raw::to_dtype(randn({48, 80}, {}, &g), DType::bf16);
  const Fp8Matrix m = fp8_cast(x, Fp8Format::E4M3, true, true);
  const Fp8Scale s = fp8_current_scale(x, Fp8Format::E4M3);
  EXPECT_EQ(m.scale_inv.item<float>(), 1.0f / s.scale.item<float>());
  const std::vector<uint8_t> q = fp8_quantize(x, s.scale, Fp8Format::E4M3).to_vector<uint8_t>();
  ASSERT_EQ(m.codes.sizes(), (Shape{48, 80}));
  ASSERT_EQ(m.codes_t.sizes(), (Shape{80, 48}));
  const std::vector<uint8_t> rows = m.codes.to_vector<uint8_t>(), cols = m.codes_t.to_vector<uint8_t>();
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t c = 0; c < 80; ++c) {
      ASSERT_EQ(rows[r * 80 + c], q[r * 80 + c]) << r << ", " << c;
      ASSERT_EQ(cols[c * 48 + r], q[r * 80 + c]) << r << ", " << c;
    }
  const Fp8Matrix only_t = fp8_cast(x, Fp8Format::E5M2, false, true);
  EXPECT_FALSE(only_t.codes.defined());
  EXPECT_EQ(only_t.codes_t.sizes(), (Shape{80, 48}));
}

// fp8_cast's column sums: the f32 sums of x's own values (before the scale), row by row, as the
// bias gradient of a linear is taken from its output gradient's cast. The values are multiples
// of 1/16 below 8 in magnitude (exact in bf16), so every partial sum over 40 rows is a multiple of
// 1/16 below 320: exact in f32 in any order, and the sums must equal the f64 ones.
TEST(Fp8Ops, CastTakesTheColumnSumsOfTheValues) {
  std::mt19937 rng(4);
  std::vector<float> vals(40 * 24);
  for (float& e : vals) e = static_cast<float>(static_cast<int>(rng() % 255) - 127) / 16.0f;
  const Tensor x = raw::to_dtype(from_vector(vals, {40, 24}), DType::bf16);
  const Fp8Matrix m = fp8_cast(x, Fp8Format::E5M2, {false, true, true});
  ASSERT_EQ(m.column_sums.sizes(), (Shape{24}));
  ASSERT_EQ(m.column_sums.dtype(), DType::f32);
  EXPECT_FALSE(m.codes.defined());
  const std::vector<float> v = raw::to_dtype(x, DType::f32).to_vector<float>(), got = m.column_sums.to_vector<float>();
  for (int64_t c = 0; c < 24; ++c) {
    double want = 0;
    for (int64_t r = 0; r < 40; ++r) want += v[r * 24 + c];
    EXPECT_EQ(got[c], static_cast<float>(want)) << "column " << c;
  }
  EXPECT_FALSE(fp8_cast(x, Fp8Format::E5M2, true, true).column_sums.defined());
}

// Delayed scaling: the first cast of a history is current scaling's; each later one takes its
// scale from the largest amax of the history's previous kFp8HistoryLen casts (a value beyond it
// saturates), and its own amax joins the history for the casts after it.
TEST(Fp8Ops, DelayedScalingUsesTheLargestAmaxOfTheRecentCasts) {
  Generator g(8);
  const Tensor base = raw::to_dtype(randn({32, 48}, {}, &g), DType::bf16);
  const float a0 = fp8_current_scale(base, Fp8Format::E4M3).amax.item<float>();
  Fp8History h;
  const auto check = [&](const Tensor& x, float history_amax, const char* what) {
    const Fp8Matrix m = fp8_cast_delayed(x, Fp8Format::E4M3, {true, true, true}, h);
    const float scale = fp8_math::scale_for(history_amax, kE4M3, 0);
    EXPECT_EQ(m.scale_inv.item<float>(), 1.0f / scale) << what;
    EXPECT_EQ(m.scale.item<float>(), scale) << what;
    // What a checkpoint region's replay casts with: the same codes from the cast's own scale.
    const Fp8Matrix again = fp8_cast_scaled(x, Fp8Format::E4M3, {true, true, false}, m.scale, m.scale_inv);
    EXPECT_EQ(again.codes.to_vector<uint8_t>(), m.codes.to_vector<uint8_t>()) << what;
    EXPECT_EQ(again.codes_t.to_vector<uint8_t>(), m.codes_t.to_vector<uint8_t>()) << what;
    EXPECT_EQ(again.scale_inv.item<float>(), m.scale_inv.item<float>()) << what;
    const Tensor s = full({1}, scale);
    EXPECT_EQ(m.codes.to_vector<uint8_t>(), fp8_quantize(x, s, Fp8Format::E4M3).to_vector<uint8_t>()) << what;
    EXPECT_EQ(m.codes_t.to_vector<uint8_t>(),
              fp8_quantize(raw::transpose(x, 0, 1), s, Fp8Format::E4M3).to_vector<uint8_t>())
        << what;
    EXPECT_TRUE(m.column_sums.defined()) << what;
    return m;
  };
  check(base, a0, "the first cast: its own amax");
  EXPECT_EQ(h.casts, 1);
  check(mul_scalar(base, 0.25), a0, "a smaller tensor: the history's amax");
  // Four times the history's amax: the largest values saturate at 448 (code 0x7e, or 0xfe negative).
  const Fp8Matrix big = check(mul_scalar(base, 4.0), a0, "a larger tensor");
  int saturated = 0;
  for (uint8_t c : big.codes.to_vector<uint8_t>()) saturated += (c & 0x7f) == 0x7e;
  EXPECT_GT(saturated, 0);
  // The big cast's amax now leads the history for kFp8HistoryLen casts, then drops out.
  for (int k = 0; k < kFp8HistoryLen - 1; ++k) check(mul_scalar(base, 0.5), 4.0f * a0, "after the big cast");
  check(mul_scalar(base, 0.5), 4.0f * a0, "the big cast is the 16th before");
  check(mul_scalar(base, 0.5), 0.5f * a0, "the big cast has left the history: the halves' amax");
  EXPECT_EQ(h.casts, kFp8HistoryLen + 4);
  Fp8History wrong;
  wrong.amax = zeros({3});
  wrong.casts = 1;
  EXPECT_THROW(fp8_cast_delayed(base, Fp8Format::E4M3, {true, false, false}, wrong), ShapeError);
  // A cast that meets an infinity leaves no amax: the next casts' scale is the finite casts'.
  Fp8History h2;
  fp8_cast_delayed(base, Fp8Format::E4M3, {true, false, false}, h2);
  Tensor with_inf = raw::to_dtype(base, DType::f32).clone();
  with_inf.data_ptr<float>()[5] = INFINITY;
  fp8_cast_delayed(with_inf, Fp8Format::E4M3, {true, false, false}, h2);
  const Fp8Matrix after = fp8_cast_delayed(base, Fp8Format::E4M3, {true, false, false}, h2);
  EXPECT_EQ(after.scale_inv.item<float>(), 1.0f / fp8_math::scale_for(a0, kE4M3, 0));
  // An empty tensor's cast leaves the history as it was.
  const int64_t casts = h2.casts;
  EXPECT_EQ(fp8_cast_delayed(zeros({0, 48}), Fp8Format::E4M3, {true, true, true}, h2).column_sums.sizes(), (Shape{48}));
  EXPECT_EQ(h2.casts, casts);
}

// fp8_cast_scaled names the scale that is not one f32 on x's device, and x that is not 2-D.
TEST(Fp8Ops, ScaledCastBadInputIsAClearError) {
  const Tensor x = ones({8, 16}), one = full({1}, 2.0f);
  const auto message = [&](const Tensor& in, const Tensor& scale, const Tensor& inv) {
    return mg::testing::error_of([&] { fp8_cast_scaled(in, Fp8Format::E4M3, {true, false, false}, scale, inv); });
  };
  EXPECT_NE(message(x, full({2}, 1.0f), one).find("fp8_cast_scaled: scale must be a one-element tensor"),
            std::string::npos);
  EXPECT_NE(message(x, one, Tensor()).find("fp8_cast_scaled: scale_inv must be a one-element tensor, got an undefined"),
            std::string::npos);
  EXPECT_NE(message(x, one, raw::to_dtype(one, DType::bf16)).find("scale_inv must be f32, got bf16"),
            std::string::npos);
  EXPECT_NE(message(ones({8}), one, one).find("x must be 2-D"), std::string::npos);
  EXPECT_EQ(fp8_cast_scaled(x, Fp8Format::E4M3, {true, false, false}, one, full({1}, 0.5f)).codes.to_vector<uint8_t>(),
            fp8_quantize(x, one, Fp8Format::E4M3).to_vector<uint8_t>());
}

// A reserved cast (fp8_reserve_delayed) names the history's next slot and advances nothing; an
// update that writes it (AdamTensors::fp8_casts) gives the codes, scale and history of the update
// followed by fp8_cast_delayed, bit for bit on the CPU. Bad reservations and bad entries are clear
// errors naming the entry.
TEST(Fp8Ops, ReservedCastWrittenByAnUpdateIsTheDelayedCastOfItsResult) {
  Generator g(41);
  const Tensor p0 = randn({48, 32}, {}, &g), grad = randn({48, 32}, {}, &g);
  Tensor pa = p0.clone(), pb = p0.clone(), ma = zeros({48, 32}), va = zeros({48, 32}), mb = zeros({48, 32}),
         vb = zeros({48, 32});
  Fp8History ha, hb;
  for (int k = 0; k < 3; ++k) {
    fp8_cast_delayed(pa, Fp8Format::E4M3, {true, true, false}, ha);
    fp8_cast_delayed(pb, Fp8Format::E4M3, {true, true, false}, hb);
  }
  const Fp8WeightCast c = fp8_reserve_delayed(pa, Fp8Format::E4M3, ha);
  EXPECT_EQ(c.slot, ha.slot());
  EXPECT_EQ(ha.casts, 3);  // nothing advanced
  EXPECT_EQ(c.codes.sizes(), (Shape{48, 32}));
  EXPECT_EQ(c.codes_t.sizes(), (Shape{32, 48}));
  AdamHyper h;
  h.lr = 1e-2;
  adam_multi_tensor_({{pa}, {grad}, {ma}, {va}, {}, {}, {}, {1}, {}, {}, {c}}, h);
  adam_multi_tensor_({{pb}, {grad}, {mb}, {vb}, {}, {}, {}, {1}, {}, {}, {}}, h);
  const Fp8Matrix want = fp8_cast_delayed(pb, Fp8Format::E4M3, {true, true, false}, hb);
  EXPECT_EQ(pa.to_vector<float>(), pb.to_vector<float>());
  EXPECT_EQ(c.codes.to_vector<uint8_t>(), want.codes.to_vector<uint8_t>());
  EXPECT_EQ(c.codes_t.to_vector<uint8_t>(), want.codes_t.to_vector<uint8_t>());
  EXPECT_EQ(c.scale_inv.to_vector<float>(), want.scale_inv.to_vector<float>());
  EXPECT_EQ(ha.amax.to_vector<float>(), hb.amax.to_vector<float>());

  EXPECT_NE(mg::testing::error_of([&] {
              fp8_reserve_delayed(ones({8}), Fp8Format::E4M3, ha);
            }).find("fp8_reserve_delayed: x must be 2-D"),
            std::string::npos);
  EXPECT_NE(mg::testing::error_of([&] {
              fp8_reserve_delayed(pa, Fp8Format::E4M3, Fp8History{});
            }).find("the history has no cast yet"),
            std::string::npos);
  EXPECT_NE(
      mg::testing::error_of([&] { fp8_reserve_delayed(pa, Fp8Format::E4M3, ha, -1); }).find("margin must be >= 0"),
      std::string::npos);
  Fp8WeightCast bad = fp8_reserve_delayed(pa, Fp8Format::E4M3, ha);
  bad.codes_t = empty({48, 32}, {DType::u8});
  EXPECT_NE(mg::testing::error_of([&] {
              adam_multi_tensor_({{pa}, {grad}, {ma}, {va}, {}, {}, {}, {2}, {}, {}, {bad}}, h);
            }).find("adam_multi_tensor_: fp8_casts[0] needs contiguous u8 codes [48, 32] and codes_t [32, 48]"),
            std::string::npos);
  bad = fp8_reserve_delayed(pa, Fp8Format::E4M3, ha);
  bad.slot = kFp8HistorySlots;
  EXPECT_NE(mg::testing::error_of([&] {
              adam_multi_tensor_({{pa}, {grad}, {ma}, {va}, {}, {}, {}, {2}, {}, {}, {bad}}, h);
            }).find("fp8_casts[0]: slot 18 (0 to 17)"),
            std::string::npos);
  EXPECT_NE(mg::testing::error_of([&] {
              adam_multi_tensor_({{pa}, {grad}, {ma}, {va}, {}, {}, {}, {2}, {}, {}, {c, c}}, h);
            }).find("2 FP8 casts for 1 params"),
            std::string::npos);
}

// The GELU-backward cast under delayed scaling casts binary(GeluTanhBackward, g, pre)'s values, g
// left as it was: the same scale_inv, codes, column sums and history as fp8_cast_delayed of the
// derivative, cast after cast (the first one current scaling's), in f32, f16 and bf16.
TEST(Fp8Ops, GeluBackwardDelayedCastIsTheDerivativeThenTheDelayedCast) {
  Generator gen(22);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Fp8History fused, plain;
    for (int k = 0; k < 5; ++k) {
      const Tensor g = raw::to_dtype(mul_scalar(randn({24, 40}, {}, &gen), 1.0 + k), dt);
      const Tensor pre = raw::to_dtype(mul_scalar(randn({24, 40}, {}, &gen), 3.0), dt);
      const std::vector<float> g_before = raw::to_dtype(g, DType::f32).to_vector<float>();
      const Fp8Matrix want =
          fp8_cast_delayed(binary(Binary::GeluTanhBackward, g, pre), Fp8Format::E5M2, {true, true, true}, plain);
      const Fp8Matrix got = fp8_cast_gelu_backward_delayed(g, pre, Fp8Format::E5M2, {true, true, true}, fused);
      const std::string what = std::string(dtype_name(dt)) + " cast " + std::to_string(k);
      EXPECT_EQ(raw::to_dtype(g, DType::f32).to_vector<float>(), g_before) << what;
      EXPECT_EQ(got.scale_inv.item<float>(), want.scale_inv.item<float>()) << what;
      EXPECT_EQ(got.codes.to_vector<uint8_t>(), want.codes.to_vector<uint8_t>()) << what;
      EXPECT_EQ(got.codes_t.to_vector<uint8_t>(), want.codes_t.to_vector<uint8_t>()) << what;
      EXPECT_EQ(got.column_sums.to_vector<float>(), want.column_sums.to_vector<float>()) << what;
      EXPECT_EQ(fused.amax.to_vector<float>(), plain.amax.to_vector<float>()) << what;
    }
  }
  Fp8History h;
  EXPECT_THROW(fp8_cast_gelu_backward_delayed(ones({8, 16}), ones({8, 8}), Fp8Format::E5M2, {true, false, false}, h),
               ShapeError);
}

// A gelu cast (Fp8Of::GeluOfX) casts unary(GeluTanh, x)'s values, x left as it was: under current
// scaling, with a scale set before (a checkpoint replay's) and under delayed scaling cast after
// cast, the same scale_inv, codes, transposed codes, column sums and history as the plain cast of
// the GELU's output, in f32, f16 and bf16.
TEST(Fp8Ops, GeluCastIsTheGeluThenTheCast) {
  Generator gen(23);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Fp8History fused, plain;
    for (int k = 0; k < 5; ++k) {
      const Tensor pre = raw::to_dtype(mul_scalar(randn({24, 40}, {}, &gen), 1.0 + k), dt);
      const std::vector<float> pre_before = raw::to_dtype(pre, DType::f32).to_vector<float>();
      const Tensor h = unary(Unary::GeluTanh, pre);
      const std::string what = std::string(dtype_name(dt)) + " cast " + std::to_string(k);
      const auto expect_same = [&](const Fp8Matrix& got, const Fp8Matrix& want, const char* how) {
        EXPECT_EQ(got.scale_inv.item<float>(), want.scale_inv.item<float>()) << what << " " << how;
        EXPECT_EQ(got.codes.to_vector<uint8_t>(), want.codes.to_vector<uint8_t>()) << what << " " << how;
        EXPECT_EQ(got.codes_t.to_vector<uint8_t>(), want.codes_t.to_vector<uint8_t>()) << what << " " << how;
        EXPECT_EQ(got.column_sums.to_vector<float>(), want.column_sums.to_vector<float>()) << what << " " << how;
      };
      const Fp8Matrix want = fp8_cast(h, Fp8Format::E4M3, {true, true, true});
      expect_same(fp8_cast(pre, Fp8Format::E4M3, {true, true, true}, 0, Fp8Of::GeluOfX), want, "current");
      expect_same(fp8_cast_scaled(pre, Fp8Format::E4M3, {true, true, true}, want.scale, want.scale_inv, Fp8Of::GeluOfX),
                  want, "scaled");
      expect_same(fp8_cast_delayed(pre, Fp8Format::E4M3, {true, true, true}, fused, 0, Fp8Of::GeluOfX),
                  fp8_cast_delayed(h, Fp8Format::E4M3, {true, true, true}, plain), "delayed");
      EXPECT_EQ(fused.amax.to_vector<float>(), plain.amax.to_vector<float>()) << what;
      EXPECT_EQ(raw::to_dtype(pre, DType::f32).to_vector<float>(), pre_before) << what;
    }
  }
}

// Codes of random values in both formats, with a scale that is not a power of two.
Fp8Matrix random_codes(int64_t rows, int64_t cols, Fp8Format f, uint64_t seed) {
  Generator g(seed);
  return fp8_cast(randn({rows, cols}, {}, &g), f, true, false);
}

// The reference GEMM against the f64 product of the decoded codes: every product of two codes is
// exact in f32 (at most 4 x 4 significant bits), so the f32 sum over K terms is within
// K * 2^-24 of sum |a b| (the sequential bound; Eigen's blocked order is no worse), then the
// scales' product and the final multiply and bias add round once each (2^-24 of the magnitude).
TEST(Fp8Ops, GemmIsTheProductOfTheDecodedCodes) {
  const int64_t M = 32, N = 48, K = 96;
  for (auto [fa, fb] : {std::pair{Fp8Format::E4M3, Fp8Format::E4M3}, std::pair{Fp8Format::E5M2, Fp8Format::E4M3},
                        std::pair{Fp8Format::E4M3, Fp8Format::E5M2}}) {
    const Fp8Matrix a = random_codes(M, K, fa, 1), b = random_codes(N, K, fb, 2);
    Generator g(4);
    const Tensor bias = randn({N}, {}, &g);
    const Tensor out = fp8_gemm(a, b, bias, DType::f32);
    ASSERT_EQ(out.sizes(), (Shape{M, N}));
    const auto decode_all = [](const Fp8Matrix& m) {
      const auto& f = m.format == Fp8Format::E4M3 ? kE4M3 : kE5M2;
      std::vector<double> v;
      for (uint8_t c : m.codes.to_vector<uint8_t>()) v.push_back(decode(c, f));
      return v;
    };
    const std::vector<double> A = decode_all(a), B = decode_all(b);
    const double s = static_cast<double>(a.scale_inv.item<float>()) * b.scale_inv.item<float>();
    const std::vector<float> o = out.to_vector<float>(), bv = bias.to_vector<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += A[i * K + k] * B[j * K + k];
          mag += std::fabs(A[i * K + k] * B[j * K + k]);
        }
        const double want = exact * s + bv[j];
        const double bound = (K * mag * s + 4 * (std::fabs(exact * s) + std::fabs(bv[j]))) * 0x1p-24;
        ASSERT_NEAR(o[i * N + j], want, bound) << i << ", " << j;
      }
    // In bf16 the same values with the bias rounded to bf16 first and the result once more (half
    // of bf16's 2^-7 step each), plus the f32 rounding above.
    const std::vector<float> o16 =
        raw::to_dtype(fp8_gemm(a, b, raw::to_dtype(bias, DType::bf16), DType::bf16), DType::f32).to_vector<float>();
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_NEAR(o16[i], o[i], (std::fabs(o[i]) + std::fabs(bv[i % N])) * (0x1p-8 + 0x1p-22)) << i;
  }
}

// The DGELU epilogue, which the CPU composes: the plain result times gelu_tanh' of aux.
TEST(Fp8Ops, GemmEpilogueIsTheGeluDerivativeTimesTheProduct) {
  const Fp8Matrix a = random_codes(16, 32, Fp8Format::E4M3, 5), b = random_codes(48, 32, Fp8Format::E4M3, 6);
  const Tensor plain = fp8_gemm(a, b, Tensor(), DType::f32);
  const Tensor pre = unary(Unary::Tanh, plain);  // any aux will do
  const Tensor d = fp8_gemm(a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv, Tensor(), DType::f32,
                            Fp8Epilogue::DGelu, pre);
  EXPECT_EQ(d.to_vector<float>(), binary(Binary::GeluTanhBackward, plain, pre).to_vector<float>());
}

// fp8_cast_gelu_backward: g becomes binary(GeluTanhBackward, g, pre), bit for bit, and its cast
// is fp8_cast's of that (the same scale_inv, codes and transposed codes), in f32, f16 and bf16.
TEST(Fp8Ops, CastGeluBackwardIsTheDerivativeThenTheCast) {
  Generator gen(21);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor g0 = raw::to_dtype(randn({24, 40}, {}, &gen), dt);
    const Tensor pre = raw::to_dtype(mul_scalar(randn({24, 40}, {}, &gen), 3.0), dt);
    const Tensor want = binary(Binary::GeluTanhBackward, g0, pre);
    const Fp8Matrix ref = fp8_cast(want, Fp8Format::E5M2, true, true);
    const Tensor g = g0.clone();
    const Fp8Matrix got = fp8_cast_gelu_backward(g, pre, Fp8Format::E5M2, true, true);
    EXPECT_EQ(raw::to_dtype(g, DType::f32).to_vector<float>(), raw::to_dtype(want, DType::f32).to_vector<float>())
        << dtype_name(dt);
    EXPECT_EQ(got.scale_inv.item<float>(), ref.scale_inv.item<float>()) << dtype_name(dt);
    EXPECT_EQ(got.codes.to_vector<uint8_t>(), ref.codes.to_vector<uint8_t>()) << dtype_name(dt);
    EXPECT_EQ(got.codes_t.to_vector<uint8_t>(), ref.codes_t.to_vector<uint8_t>()) << dtype_name(dt);
    EXPECT_EQ(got.format, Fp8Format::E5M2);
  }
}

TEST(Fp8Ops, CastGeluBackwardBadInputIsAClearError) {
  const Tensor g = ones({8, 16}), pre = ones({8, 16});
  EXPECT_THROW(fp8_cast_gelu_backward(g, raw::to_dtype(pre, DType::bf16), Fp8Format::E5M2, true, false), DTypeError);
  EXPECT_THROW(fp8_cast_gelu_backward(g, ones({16, 8}), Fp8Format::E5M2, true, false), ShapeError);
  EXPECT_THROW(fp8_cast_gelu_backward(g, pre, Fp8Format::E5M2, false, false), ValueError);
  EXPECT_THROW(fp8_cast_gelu_backward(g, pre, Fp8Format::E5M2, true, false, -1), ValueError);
  EXPECT_THROW(fp8_cast_gelu_backward(ones({128}), ones({128}), Fp8Format::E5M2, true, false), ShapeError);
  EXPECT_THROW(fp8_cast_gelu_backward(ones({4, 4}, {DType::i64}), pre, Fp8Format::E5M2, true, false), DTypeError);
  try {  // a transposed view cannot be written in place as [R, C]
    fp8_cast_gelu_backward(ones({16, 8}).t(), pre, Fp8Format::E5M2, true, false);
    FAIL() << "a non-contiguous g was taken";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("not contiguous"), std::string::npos) << e.what();
  }
}

// The norm's output cast for the linear after it (add_layer_norm_fp8_delayed; the CPU composes
// the two): the codes, scales and history of the norm in bf16 then fp8_cast_delayed, the norm's sum
// and statistics add_layer_norm_forward's, over a 3-D stream with a residual and its bias; a bad
// argument is the norm's error, named after the op.
TEST(Fp8Ops, NormCastIsTheNormThenTheDelayedCast) {
  Generator g(43);
  const Tensor w = randn({32}, {}, &g), b = randn({32}, {}, &g), rb = randn({32}, {}, &g);
  Fp8History fused, apart;
  for (int k = 0; k < 3; ++k) {
    const Tensor x = randn({2, 8, 32}, {}, &g), res = raw::to_dtype(randn({2, 8, 32}, {}, &g), DType::bf16);
    const Fp8NormCast f = add_layer_norm_fp8_delayed(x, res, {32}, w, b, 1e-5, DType::bf16, rb, Fp8Format::E4M3,
                                                     {true, true, false}, fused);
    auto [sum, y, mean, rstd] = add_layer_norm_forward(x, res, {32}, w, b, 1e-5, DType::bf16, rb);
    const Fp8Matrix want = fp8_cast_delayed(raw::reshape(y, {16, 32}), Fp8Format::E4M3, {true, true, false}, apart);
    EXPECT_EQ(f.sum.sizes(), x.sizes());
    EXPECT_EQ(f.sum.to_vector<float>(), sum.to_vector<float>());
    EXPECT_EQ(f.mean.to_vector<float>(), mean.to_vector<float>());
    EXPECT_EQ(f.rstd.to_vector<float>(), rstd.to_vector<float>());
    EXPECT_EQ(f.out.codes.to_vector<uint8_t>(), want.codes.to_vector<uint8_t>());
    EXPECT_EQ(f.out.codes_t.to_vector<uint8_t>(), want.codes_t.to_vector<uint8_t>());
    EXPECT_EQ(f.out.scale_inv.to_vector<float>(), want.scale_inv.to_vector<float>());
    EXPECT_EQ(fused.amax.to_vector<float>(), apart.amax.to_vector<float>());
    EXPECT_EQ(fused.casts, k + 1);
  }
  const std::string bad = mg::testing::error_of([&] {
    add_layer_norm_fp8_delayed(ones({4, 32}), ones({4, 16}), {32}, w, b, 1e-5, DType::bf16, Tensor(), Fp8Format::E4M3,
                               {true, true, false}, fused);
  });
  EXPECT_NE(bad.find("add_layer_norm_fp8_delayed"), std::string::npos) << bad;
  EXPECT_NE(bad.find("residual shape [4, 16]"), std::string::npos) << bad;
  EXPECT_THROW(add_layer_norm_fp8_delayed(ones({4, 32}), ones({4, 32}), {32}, w, b, 1e-5, DType::bf16, Tensor(),
                                          Fp8Format::E4M3, {false, false, false}, fused),
               ValueError);
}

TEST(Fp8Ops, GemmBadInputNamesTheOperand) {
  const Fp8Matrix a = random_codes(16, 32, Fp8Format::E5M2, 7), b = random_codes(16, 32, Fp8Format::E5M2, 8);
  const Fp8Matrix c = random_codes(16, 48, Fp8Format::E4M3, 9);
  EXPECT_THROW(fp8_gemm(a, b, Tensor(), DType::bf16), ValueError);  // e5m2 x e5m2
  EXPECT_THROW(fp8_gemm(c, b, Tensor(), DType::bf16), ShapeError);  // K 48 against 32
  EXPECT_THROW(fp8_gemm(a, c, Tensor(), DType::i32), ShapeError);   // K first
  Fp8Matrix not_codes = c;
  not_codes.codes = ones({16, 48});
  try {
    fp8_gemm(not_codes, c, Tensor(), DType::bf16);
    FAIL() << "f32 values are not codes";
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("a must hold u8 codes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fp8_gemm(c, c, ones({16}), DType::bf16), ShapeError);  // an f32 bias for a bf16 result
  EXPECT_THROW(fp8_cast(ones({4, 4}), Fp8Format::E4M3, false, false), ValueError);
  EXPECT_THROW(fp8_cast(ones({4}), Fp8Format::E4M3, true, false), ShapeError);
}

}  // namespace
}  // namespace mg::kernels
