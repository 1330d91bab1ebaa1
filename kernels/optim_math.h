// The per-element Adam/AdamW and SGD update rules, written once for the CPU loop and the CUDA
// multi-tensor kernels so both paths compute the same expression in the same order.
#pragma once

#ifdef __CUDACC__
#define MG_OPTIM_HD __host__ __device__ __forceinline__
#else
#define MG_OPTIM_HD inline
#endif

#include <bit>
#include <cmath>
#include <cstdint>

namespace mg::kernels::optim_math {

// Scalars of one Adam call in the math type T; step_size and bc2_sqrt are per tensor.
template <class T>
struct AdamScalars {
  T lr, beta1, beta2, eps, weight_decay;
  bool decoupled, amsgrad, maximize;
};

// A product, sum or difference rounded on its own: on the device nvcc would otherwise contract
// a * b + c into one FMA wherever it sees fit, a choice that can differ from kernel to kernel (the
// fused lists' update and the FP8 weight cast's, kernels/cuda/fp8.cu), so that two kernels of one
// rule would not give the same bits. On the host, the plain expression, as written inline.
#ifdef __CUDA_ARCH__
#define MG_OPTIM_RN(name, op, f32, f64)                           \
  template <class A, class B>                                     \
  MG_OPTIM_HD auto name(A a, B b) {                               \
    if constexpr (sizeof(A) == 4 && sizeof(B) == 4)               \
      return f32(a, b);                                           \
    else                                                          \
      return f64(static_cast<double>(a), static_cast<double>(b)); \
  }
#else
#define MG_OPTIM_RN(name, op, f32, f64) \
  template <class A, class B>           \
  MG_OPTIM_HD auto name(A a, B b) {     \
    return a op b;                      \
  }
#endif
MG_OPTIM_RN(mul_rn, *, __fmul_rn, __dmul_rn)
MG_OPTIM_RN(add_rn, +, __fadd_rn, __dadd_rn)
MG_OPTIM_RN(sub_rn, -, __fsub_rn, __dsub_rn)
#undef MG_OPTIM_RN

// torch.optim.Adam (foreach=False) for one element: m = b1*m + (1-b1)*g,
// v = b2*v + (1-b2)*(g*g), denom = sqrt(vmax or v)/sqrt(1-b2^t) + eps, p -= lr/(1-b1^t) * m/denom,
// each operation rounded on its own (mul_rn).
template <class T>
MG_OPTIM_HD void adam_element(T& p, T g, T& m, T& v, T* vmax, const AdamScalars<T>& s, T step_size, T bc2_sqrt) {
  if (s.maximize) g = -g;
  if (s.weight_decay != T(0)) {
    if (s.decoupled)
      p = mul_rn(p, sub_rn(T(1), mul_rn(s.lr, s.weight_decay)));
    else
      g = add_rn(g, mul_rn(s.weight_decay, p));
  }
  m = add_rn(mul_rn(s.beta1, m), mul_rn(sub_rn(T(1), s.beta1), g));
  v = add_rn(mul_rn(s.beta2, v), mul_rn(sub_rn(T(1), s.beta2), mul_rn(g, g)));
  T vv = v;
  if (s.amsgrad) {
    // NaN-propagating max, like torch.maximum.
    if (v > *vmax || v != v) *vmax = v;  // a NaN in either stays
    vv = *vmax;
  }
  const T denom = add_rn(sqrt(vv) / bc2_sqrt, s.eps);
  p = sub_rn(p, mul_rn(step_size, m / denom));
}

template <class T>
struct SGDScalars {
  T lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
};

// torch.optim.SGD for one element; buf is null without momentum.
template <class T>
MG_OPTIM_HD void sgd_element(T& p, T g, T* buf, bool first_step, const SGDScalars<T>& s) {
  if (s.maximize) g = -g;
  if (s.weight_decay != T(0)) g = g + s.weight_decay * p;
  if (buf) {
    if (first_step)
      *buf = g;
    else
      *buf = s.momentum * *buf + (T(1) - s.dampening) * g;
    g = s.nesterov ? g + s.momentum * *buf : *buf;
  }
  p = p - s.lr * g;
}

// clip_grad_norm_: the norm from the accumulated sum of |x|^p (max |x| for p = inf), and the
// factor the gradients are scaled by (PyTorch's clamp of max_norm / (norm + 1e-6) at 1; a NaN
// norm gives a NaN factor, as in PyTorch).
MG_OPTIM_HD double finish_norm(double acc, double p) {
  if (std::isinf(p) || p == 1.0) return acc;
  return p == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / p);
}
MG_OPTIM_HD double clip_coefficient(double total_norm, double max_norm) {
  const double c = max_norm / (total_norm + 1e-6);
  return (c < 1.0 || c != c) ? c : 1.0;
}

// Adam's bias corrections for step t (>= 1), in double: the step size lr / (1 - b1^t) and
// sqrt(1 - b2^t). The host and the capturable device path compute them with this expression.
MG_OPTIM_HD void adam_bias_corrections(double lr, double beta1, double beta2, double t, double* step_size,
                                       double* bc2_sqrt) {
  *step_size = lr / (1.0 - std::pow(beta1, t));
  *bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, t));
}

// ---- 8-bit optimizer state (blockwise dynamic quantization, after Dettmers et al. 2022) ----
// A moment tensor is stored as one byte per element: an index into a 256-entry code of values in
// [-1, 1] (m) or [0, 1] (v), and one f32 absmax per block of kQuantBlock elements; element i is
// code[q[i]] * absmax[i / kQuantBlock]. The codes are dynamic-tree ones: a decade (power-of-ten
// range) per exponent step and a linear fraction inside it, finer in the larger decades, so a block
// keeps small values to about 7 decades below its largest with a relative error of a few percent,
// and values near the largest to a fraction of a percent.
//   signed (m):   0, 1, and +-10^(k-6) * (0.1 + 0.9 (j + 1/2) / 2^k) for decade k = 0..6, j < 2^k
//                 (2 * 127 + 2 = 256 values)
//   unsigned (v): 0 and 10^(k-7) * (0.1 + 0.9 (j + 1/2) / 2^k) for decade k = 0..7, j < 2^k
//                 (255 + 1 = 256 values; v spans the square of m's range, so one decade more)
// Rounding is to the nearest code value (ties to the smaller index), deterministic.
constexpr int kQuantBlock = 2048;
constexpr int kQuantCodeSize = 256;

struct QuantCode {
  float v[kQuantCodeSize];
};
// The code in ascending order, computed at compile time (one table for the CPU loop and the CUDA
// kernels' constant memory: both read the same 256 floats).
constexpr QuantCode make_dynamic_code(bool is_signed) {
  constexpr double kPow10[8] = {1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0};
  double v[kQuantCodeSize] = {};
  int n = 0;
  const int decades = is_signed ? 7 : 8;
  for (int k = 0; k < decades; ++k) {
    const double scale = kPow10[k + 8 - decades];
    const int items = 1 << k;
    for (int j = 0; j < items; ++j) {
      const double x = scale * (0.1 + 0.9 * (j + 0.5) / items);
      v[n++] = x;
      if (is_signed) v[n++] = -x;
    }
  }
  v[n++] = 0.0;
  if (is_signed) v[n++] = 1.0;
  for (int i = 1; i < n; ++i)  // insertion sort, at compile time
    for (int j = i; j > 0 && v[j - 1] > v[j]; --j) {
      const double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  QuantCode c{};
  for (int i = 0; i < kQuantCodeSize; ++i) c.v[i] = static_cast<float>(v[i]);
  return c;
}
inline constexpr QuantCode kCodeSigned = make_dynamic_code(true);
inline constexpr QuantCode kCodeUnsigned = make_dynamic_code(false);
static_assert(kCodeSigned.v[0] > -1.0f && kCodeSigned.v[255] == 1.0f && kCodeSigned.v[127] == 0.0f);
static_assert(kCodeUnsigned.v[0] == 0.0f && kCodeUnsigned.v[255] < 1.0f);

// The index of the code value nearest x (x in code's range; outside it, the end index). A NaN x
// gives an arbitrary index: its block's absmax is then NaN too (block_absmax propagates it), so
// the state reads back NaN, as an f32 moment would.
// `code` is anything indexed like the table (a pointer, or the CUDA kernel's per-lane view of its
// shared-memory copies).
template <class Code>
MG_OPTIM_HD unsigned char quantize_nearest(const Code& code, float x) {
  static_assert(kQuantCodeSize == 256, "the search below takes 8 steps");
  // pos: the last index whose value is <= x (0 when x is below them all), in 8 steps written out
  // and without branches, so the searches of a thread's elements interleave (and a CPU loop over
  // elements vectorizes: kernels/cpu/optim.cc).
  int pos = 0;
  pos += code[pos + 128] <= x ? 128 : 0;
  pos += code[pos + 64] <= x ? 64 : 0;
  pos += code[pos + 32] <= x ? 32 : 0;
  pos += code[pos + 16] <= x ? 16 : 0;
  pos += code[pos + 8] <= x ? 8 : 0;
  pos += code[pos + 4] <= x ? 4 : 0;
  pos += code[pos + 2] <= x ? 2 : 0;
  pos += code[pos + 1] <= x ? 1 : 0;
  // The nearer of pos and pos + 1 (ties: the smaller); the last index has no neighbour above.
  const int last = kQuantCodeSize - 1, above = pos < last ? pos + 1 : last;
  const bool lower = (pos == last) | (x - code[pos] <= code[above] - x);  // | : no branch
  return static_cast<unsigned char>(lower ? pos : pos + 1);
}

// quantize_nearest by a table lookup instead of the search: in the CUDA kernel, where the search's
// eight dependent steps were most of the 8-bit update's instructions, and in the CPU loop in the
// form below that vectorizes (quantize_nearest_lut32; written like this one, GCC 12 left the CPU
// loop scalar, 2.5x slower than the search: bench/results/cpu_adam8bit_lookup_vs_search_2026-12-06.log).
//
// A float's sign, exponent and top kQuantLutMantissaBits mantissa bits name a bucket of values
// (magnitudes below 2^-24 share one; those of 2 and more, the infinities and NaN share the top
// bucket of their sign). QuantLut holds, for each bucket, `lo`: the last index whose code value is
// at or below the bucket's smallest value (0 when none is). No bucket holds a code value past
// code[lo + 1] (tests/optim/adam8bit_test.cc checks every one: the buckets are narrower than the
// codes' spacing, and where one is not, the tiny bucket holding the unsigned code's 0 and its
// smallest value, or a top bucket reaching infinity, lo is 0 or 255 and the bucket holds one code
// past it at most), so the last index whose value is <= x is lo or lo + 1: one comparison instead
// of eight, then quantize_nearest's choice of the nearer neighbour. The same index as
// quantize_nearest for every x, a NaN included.
constexpr int kQuantLutMantissaBits = 7;
constexpr int kQuantLutMinExp = 103;  // biased exponent of 2^-24
constexpr int kQuantLutMaxExp = 127;  // of 2^0
constexpr int kQuantLutBuckets = 1 << kQuantLutMantissaBits;
constexpr int kQuantLutBinades = kQuantLutMaxExp - kQuantLutMinExp + 1;
constexpr int kQuantLutSize = 1 + 2 * kQuantLutBinades * kQuantLutBuckets;

MG_OPTIM_HD uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}

// The bucket of a float's bits.
constexpr MG_OPTIM_HD int quant_lut_bucket(uint32_t b) {
  const int e = static_cast<int>((b >> 23) & 0xffu);
  if (e < kQuantLutMinExp) return 0;
  const bool top = e > kQuantLutMaxExp;
  const int m =
      top ? kQuantLutBuckets - 1 : static_cast<int>((b >> (23 - kQuantLutMantissaBits)) & (kQuantLutBuckets - 1));
  const int binade = (top ? kQuantLutMaxExp : e) - kQuantLutMinExp;
  return 1 + static_cast<int>(b >> 31) * kQuantLutBinades * kQuantLutBuckets + binade * kQuantLutBuckets + m;
}

// The smallest and largest value of bucket `k` (the top buckets reach the infinities).
constexpr void quant_lut_bounds(int k, float* lo, float* hi) {
  constexpr uint32_t kLowBits = (1u << (23 - kQuantLutMantissaBits)) - 1;
  if (k == 0) {
    const float edge = std::bit_cast<float>((static_cast<uint32_t>(kQuantLutMinExp) << 23) - 1);
    *lo = -edge, *hi = edge;
    return;
  }
  const int j = k - 1, neg = j / (kQuantLutBinades * kQuantLutBuckets), r = j % (kQuantLutBinades * kQuantLutBuckets);
  const int binade = r / kQuantLutBuckets, m = r % kQuantLutBuckets;
  const uint32_t base = (static_cast<uint32_t>(kQuantLutMinExp + binade) << 23) |
                        (static_cast<uint32_t>(m) << (23 - kQuantLutMantissaBits));
  const bool top = binade == kQuantLutBinades - 1 && m == kQuantLutBuckets - 1;
  const float small = std::bit_cast<float>(base), large = top ? INFINITY : std::bit_cast<float>(base | kLowBits);
  if (neg)
    *lo = -large, *hi = -small;
  else
    *lo = small, *hi = large;
}

struct QuantLut {
  unsigned char lo[kQuantLutSize];
};
// The table of a code (ascending), computed at compile time like the code.
constexpr QuantLut make_quant_lut(const QuantCode& code) {
  QuantLut t{};
  for (int k = 0; k < kQuantLutSize; ++k) {
    float lo = 0, hi = 0;
    quant_lut_bounds(k, &lo, &hi);
    int pos = 0;  // the last index whose value is <= lo, 0 when none is (quantize_nearest's search)
    for (int step = 128; step > 0; step /= 2) pos += code.v[pos + step] <= lo ? step : 0;
    t.lo[k] = static_cast<unsigned char>(pos);
  }
  return t;
}
inline constexpr QuantLut kLutSigned = make_quant_lut(kCodeSigned);
inline constexpr QuantLut kLutUnsigned = make_quant_lut(kCodeUnsigned);

template <class Code, class Lut>
MG_OPTIM_HD unsigned char quantize_nearest_lut(const Code& code, const Lut& lut, float x) {
  constexpr int last = kQuantCodeSize - 1;
  const int lo = x == x ? lut[quant_lut_bucket(float_bits(x))] : 0;  // a NaN: 1, as the search gives
  const int pos = lo + static_cast<int>((lo < last) & (code[lo < last ? lo + 1 : last] <= x));
  const int above = pos < last ? pos + 1 : last;
  const bool lower = (pos == last) | (x - code[pos] <= code[above] - x);
  return static_cast<unsigned char>(lower ? pos : pos + 1);
}

// The tables as 32-bit entries, for the CPU loop (kernels/cpu/optim.cc): an AVX2 gather loads 32
// bits a lane.
struct QuantLut32 {
  int32_t lo[kQuantLutSize];
};
constexpr QuantLut32 widen_quant_lut(const QuantLut& t) {
  QuantLut32 w{};
  for (int k = 0; k < kQuantLutSize; ++k) w.lo[k] = t.lo[k];
  return w;
}
inline constexpr QuantLut32 kLut32Signed = widen_quant_lut(kLutSigned);
inline constexpr QuantLut32 kLut32Unsigned = widen_quant_lut(kLutUnsigned);

// quantize_nearest_lut on the 32-bit tables, host only, with each choice written as masks and
// shifts: GCC 12 vectorizes this form for AVX2 (a select feeding a gather's index keeps the
// written-out form above from vectorizing there). Four gathers a value where the search makes
// ten. The same index as quantize_nearest_lut for every x (tests/optim/adam8bit_test.cc).
inline unsigned char quantize_nearest_lut32(const float* code, const int32_t* lut, float x) {
  constexpr int last = kQuantCodeSize - 1;
  int32_t b;
  __builtin_memcpy(&b, &x, sizeof b);
  const int32_t sign = (b >> 31) & 1, e = (b >> 23) & 0xff,
                m = (b >> (23 - kQuantLutMantissaBits)) & (kQuantLutBuckets - 1);
  const int32_t over = (kQuantLutMaxExp - e) >> 31;  // all ones past 2^0: the top bucket of its sign
  const int32_t ec = e + (over & (kQuantLutMaxExp - e)), mc = m | (over & (kQuantLutBuckets - 1));
  int32_t k = 1 + sign * kQuantLutBinades * kQuantLutBuckets + (ec - kQuantLutMinExp) * kQuantLutBuckets + mc;
  k &= ~((e - kQuantLutMinExp) >> 31);            // below 2^-24: bucket 0
  const int32_t lo = lut[k] & (x == x ? -1 : 0);  // a NaN: 0
  const int32_t at_last = (last - 1 - lo) >> 31;  // all ones where lo is the last index
  const int32_t pos = lo + (~at_last & (code[lo + 1 + at_last] <= x ? 1 : 0));
  const int32_t pos_last = (last - 1 - pos) >> 31;
  const int32_t lower = (pos_last & 1) | (x - code[pos] <= code[pos + 1 + pos_last] - x ? 1 : 0);
  return static_cast<unsigned char>(pos + 1 - lower);
}

// The value quantize_nearest takes for x in a block of largest magnitude absmax: x times
// quant_inverse(absmax), the block's 1 / absmax rounded once, where that is a normal float (absmax
// in [2^-126, 2^126]: every block a training step makes); else x / absmax (a subnormal or an
// infinite absmax, whose reciprocal would overflow or lose bits), and 0 for an all-zero block (or a
// NaN absmax). One multiplication a value where a division costs several instructions on the
// device and 5 to 10 times a multiplication's throughput in AVX2; the product is the quotient or an
// ulp beside it, and both backends round it the same way.
MG_OPTIM_HD float quant_inverse(float absmax) {
  return absmax >= 0x1p-126f && absmax <= 0x1p126f ? 1.0f / absmax : 0.0f;
}
MG_OPTIM_HD float quant_normalize(float x, float absmax, float inverse) {
  return inverse != 0.0f ? x * inverse : absmax > 0.0f ? x / absmax : 0.0f;
}

// max(a, |b|) that keeps a NaN from either side (fmaxf would drop it).
MG_OPTIM_HD float nan_max_abs(float a, float b) {
  b = b < 0.0f ? -b : b;
  return (a != a || b != b) ? (a != a ? a : b) : (b > a ? b : a);
}

// One block of n (<= kQuantBlock) f32 values stored as codes of the signed or unsigned code: q[i]
// the nearest code to quant_normalize(v[i], absmax, ...), by quantize_nearest_lut32; returns the block's absmax. The
// host's quantization (the CPU update, a state dict's conversion); the CUDA kernel does the same
// with a block reduction. Always inlined: GCC 12 vectorizes these loops (the lookup's gathers)
// only in the body of the function it is compiling with AVX2 and -O3 (kernels/cpu/optim.cc's
// clone), not in an inline function it compiled apart and then inlined.
[[gnu::always_inline]] inline float quantize_block(const float* __restrict v, int64_t n, bool is_signed,
                                                   unsigned char* __restrict q) {
  const float* __restrict code = is_signed ? kCodeSigned.v : kCodeUnsigned.v;
  const int32_t* __restrict lut = is_signed ? kLut32Signed.lo : kLut32Unsigned.lo;
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = nan_max_abs(absmax, v[i]);
  // quant_normalize with its choice taken out of the loops (a division is not speculated), so
  // they have no branch.
  const float inverse = quant_inverse(absmax);
  if (inverse != 0.0f)
    for (int64_t i = 0; i < n; ++i) q[i] = quantize_nearest_lut32(code, lut, v[i] * inverse);
  else if (absmax > 0.0f)
    for (int64_t i = 0; i < n; ++i) q[i] = quantize_nearest_lut32(code, lut, v[i] / absmax);
  else
    for (int64_t i = 0; i < n; ++i) q[i] = quantize_nearest(code, 0.0f);
  return absmax;
}

}  // namespace mg::kernels::optim_math
