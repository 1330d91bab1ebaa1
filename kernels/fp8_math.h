// FP8 per element: the two OCP 8-bit float formats Hopper's tensor cores read, the rounding from
// f32 (the CPU's reference; the CUDA kernels use the hardware's conversion, which the parity test
// holds to this), and the per-tensor scale rule (written once for both).
//
//   e4m3 (E4M3FN): 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite 448, smallest
//                  normal 2^-6, subnormals down to 2^-9; no infinities, NaN is S.1111.111.
//   e5m2:          1 sign, 5 exponent (bias 15), 2 mantissa bits; largest finite 57344, smallest
//                  normal 2^-14, subnormals down to 2^-16; infinities S.11111.00, NaN S.11111.1x.
//
// Rounding: to nearest, ties to even, saturating (a finite value beyond the largest finite
// becomes the largest finite of its sign, and so does an infinity): the hardware's
// cvt.rn.satfinite, what cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) does; the
// device parity test holds this code to it bit for bit. NaN stays NaN.
//
// Scaling (per tensor, "current" scaling: from this tensor's own amax): q = fp8(x * scale) with
// scale = fp8_max / amax / 2^margin, so the tensor's largest magnitude lands at (or, with a
// margin, 2^margin below) the format's largest finite value; x is read back as decode(q) / scale.
// An amax of 0, or one that is not finite, gives scale 1 (nothing to stretch, or nothing to
// trust); a scale that would be infinite (amax far below the format's range) is capped at the
// largest finite f32.
#pragma once

#ifdef __CUDACC__
#define MG_FP8_HD __host__ __device__ __forceinline__
#else
#define MG_FP8_HD inline
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mg::kernels::fp8_math {

struct Format {
  int exponent_bits, mantissa_bits, bias;
  float max_finite;
  uint8_t max_code;  // the largest finite's bits, sign clear
  uint8_t nan_code;  // a NaN's bits, sign clear
};
constexpr Format kE4M3{4, 3, 7, 448.0f, 0x7e, 0x7f};
constexpr Format kE5M2{5, 2, 15, 57344.0f, 0x7b, 0x7f};

// f32 -> FP8 bits, rounded to nearest (ties to even), saturating.
inline uint8_t encode(float x, const Format& f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | f.nan_code;
  const float a = std::fabs(x);
  if (!(a < f.max_finite)) return sign | f.max_code;  // >= the largest finite, or inf
  if (a == 0.0f) return sign;
  const int min_exp = 1 - f.bias;  // the smallest normal's exponent
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  e -= 1;             // a = (1 + frac) 2^e
  // The step between neighbours at a's binade (the subnormals share the smallest normal's).
  const int step_exp = (e < min_exp ? min_exp : e) - f.mantissa_bits;
  // a / step is exact in f32 (a power-of-two scaling; it stays normal), and rint rounds it to
  // the nearest integer, ties to even, in the default rounding mode.
  const float units = std::rint(std::ldexp(a, -step_exp));
  const int q = static_cast<int>(units);
  if (e < min_exp) return sign | static_cast<uint8_t>(q);  // q == 2^M is the smallest normal, correctly
  // q in [2^M, 2^(M+1)]: the implicit one and the mantissa; 2^(M+1) carries into the exponent.
  int biased = e + f.bias, m = q - (1 << f.mantissa_bits);
  if (m == (1 << f.mantissa_bits)) {
    ++biased;
    m = 0;
  }
  const int code = (biased << f.mantissa_bits) | m;
  return sign | static_cast<uint8_t>(code > f.max_code ? f.max_code : code);
}

// FP8 bits -> f32 (exact).
inline float decode(uint8_t bits, const Format& f) {
  const bool neg = bits & 0x80;
  const int mag = bits & 0x7f;
  const int biased = mag >> f.mantissa_bits, m = mag & ((1 << f.mantissa_bits) - 1);
  float v;
  if (f.exponent_bits == 4 && mag == 0x7f) {
    v = NAN;
  } else if (f.exponent_bits == 5 && biased == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else if (biased == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - f.bias - f.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>(m + (1 << f.mantissa_bits)), biased - f.bias - f.mantissa_bits);
  }
  return neg ? -v : v;
}

// The per-tensor scale for a tensor whose largest magnitude is `amax` (see the file comment).
// Plain arithmetic (halving is exact), the same on the host and in a kernel.
MG_FP8_HD float scale_for(float amax, const Format& f, int margin) {
  constexpr float kMaxF32 = 3.40282347e38f;
  if (!(amax > 0.0f) || amax > kMaxF32) return 1.0f;  // zero, NaN, inf
  float s = f.max_finite / amax;
  for (int i = 0; i < margin; ++i) s *= 0.5f;
  return s > kMaxF32 ? kMaxF32 : s;
}

// Delayed scaling (kernels/fp8.h, Fp8History): a cast's scale comes from the amaxes of the same
// operand's recent casts, kept as the bits of non-negative floats (a NaN as 0x7fc00000, above
// every other magnitude's bits, so an unsigned max is the NaN-first max). Of the `slots` entries,
// `cur` is the cast in flight's (its amax is being taken) and the one after it is zeroed for the
// next cast; the largest finite one of the others gives the scale (a cast that met an infinity
// or a NaN, an f16 step the GradScaler skips, leaves no amax: its slot is passed over).
inline constexpr unsigned kNanAmaxBits = 0x7fc00000u;
inline constexpr unsigned kInfBits = 0x7f800000u;
MG_FP8_HD int history_next(int cur, int slots) { return cur + 1 == slots ? 0 : cur + 1; }
MG_FP8_HD bool history_counts(unsigned bits, int i, int cur, int next) {
  return i != cur && i != next && bits < kInfBits;
}
MG_FP8_HD unsigned history_max_bits(const unsigned* hist, int slots, int cur) {
  const int next = history_next(cur, slots);
  unsigned m = 0;
  for (int i = 0; i < slots; ++i)
    if (history_counts(hist[i], i, cur, next) && hist[i] > m) m = hist[i];
  return m;
}

}  // namespace mg::kernels::fp8_math
