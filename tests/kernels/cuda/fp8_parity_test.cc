// kernels/cuda/fp8.cu against the CPU reference (kernels/cpu/fp8.cc, fp8_math.h), bit for bit:
// the hardware's f32 -> FP8 conversion (cvt.rn.satfinite) and memgrad's round-to-nearest-even
// give the same codes for every value, e4m3 and e5m2, from f32, f16 and bf16 inputs (normals,
// subnormals, exact midpoints, values past the largest finite, infinities, NaN); amax and the
// scale are the same bits; dequantizing gives the same values. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/fp8.h"
#include "kernels/fp8_math.h"
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

}  // namespace
}  // namespace mg::testing
