// FP8 CPU loops: the reference for cuda/fp8.cu, with fp8_math.h's rounding and scale rule.
#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/fp8_math.h"

namespace mg::kernels {
namespace {

const fp8_math::Format& format_of(Fp8Format f) { return f == Fp8Format::E4M3 ? fp8_math::kE4M3 : fp8_math::kE5M2; }

// Runs f with x's elements read as float.
template <class F>
void with_floats(const Tensor& x, F f) {
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::f32:
      return f([p = static_cast<const float*>(x.raw_data())](int64_t i) { return p[i]; }, n);
    case DType::f16:
      return f([p = static_cast<const Half*>(x.raw_data())](int64_t i) { return static_cast<float>(p[i]); }, n);
    default:
      return f([p = static_cast<const BFloat16*>(x.raw_data())](int64_t i) { return static_cast<float>(p[i]); }, n);
  }
}

// x itself, or with `gelu` unary(GeluTanh, x) in x's dtype: the values a gelu cast casts.
Tensor values_cast(CpuBackend& be, const Tensor& x, bool gelu) {
  if (!gelu) return x;
  Tensor v = empty(x.sizes(), TensorOptions(x.dtype()));
  be.unary(Unary::GeluTanh, x, v);
  return v;
}

}  // namespace

template <>
void CpuBackend::fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& out) {
  const fp8_math::Format& f = format_of(format);
  const float s = *scale.data_ptr<float>();
  auto* q = static_cast<uint8_t*>(out.raw_data());
  with_floats(x, [&](auto at, int64_t n) {
    for (int64_t i = 0; i < n; ++i) q[i] = fp8_math::encode(at(i) * s, f);
  });
}

template <>
void CpuBackend::fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& out) {
  const fp8_math::Format& f = format_of(format);
  const float s = *scale.data_ptr<float>();
  const auto* c = static_cast<const uint8_t*>(q.raw_data());
  const int64_t n = q.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = fp8_math::decode(c[i], f) / s;
    switch (out.dtype()) {
      case DType::f32:
        static_cast<float*>(out.raw_data())[i] = v;
        break;
      case DType::f16:
        static_cast<Half*>(out.raw_data())[i] = Half(v);
        break;
      default:
        static_cast<BFloat16*>(out.raw_data())[i] = BFloat16(v);
    }
  }
}

template <>
void CpuBackend::fp8_amax_scale(const Tensor& x_in, bool gelu, Fp8Format format, int margin, const Tensor& amax,
                                const Tensor& scale, const Tensor& scale_inv) {
  const Tensor x = values_cast(*this, x_in, gelu);
  float m = 0.0f;
  with_floats(x, [&](auto at, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(at(i));
      if (std::isnan(a) || a > m) m = a;
      if (std::isnan(m)) break;
    }
  });
  *amax.data_ptr<float>() = m;
  const float sc = fp8_math::scale_for(m, format_of(format), margin);
  *scale.data_ptr<float>() = sc;
  if (scale_inv.defined()) *scale_inv.data_ptr<float>() = 1.0f / sc;
}

template <>
void CpuBackend::fp8_gelu_backward_amax_scale(const Tensor& g, const Tensor& pre, Fp8Format format, int margin,
                                              const Tensor& amax, const Tensor& scale, const Tensor& scale_inv) {
  binary(Binary::GeluTanhBackward, g, pre, g);
  fp8_amax_scale(g, false, format, margin, amax, scale, scale_inv);
}

template <>
void CpuBackend::fp8_quantize_transpose(const Tensor& x_in, bool gelu, const Tensor& scale, Fp8Format format,
                                        const Tensor& out, const Tensor& out_t, const Tensor& col_sums) {
  const Tensor x = values_cast(*this, x_in, gelu);
  const fp8_math::Format& f = format_of(format);
  const float s = *scale.data_ptr<float>();
  const int64_t rows = x.size(0), cols = x.size(1);
  auto* q = out.defined() ? static_cast<uint8_t*>(out.raw_data()) : nullptr;
  auto* qt = out_t.defined() ? static_cast<uint8_t*>(out_t.raw_data()) : nullptr;
  float* sums = col_sums.defined() ? col_sums.data_ptr<float>() : nullptr;
  if (sums) std::fill(sums, sums + cols, 0.0f);
  with_floats(x, [&](auto at, int64_t) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float v = at(r * cols + c);
        const uint8_t code = fp8_math::encode(v * s, f);
        if (q) q[r * cols + c] = code;
        if (qt) qt[c * rows + r] = code;
        if (sums) sums[c] += v;  // row by row, in f32
      }
  });
}

template <>
void CpuBackend::fp8_quantize_transpose_delayed(const Tensor& x_in, bool gelu, const Tensor& gelu_pre,
                                                const Tensor& history, int slot, Fp8Format format, int margin,
                                                const Tensor& scale, const Tensor& scale_inv, const Tensor& out,
                                                const Tensor& out_t, const Tensor& col_sums) {
  Tensor x = values_cast(*this, x_in, gelu);
  if (gelu_pre.defined()) {
    x = empty(x_in.sizes(), TensorOptions(x_in.dtype()));
    binary(Binary::GeluTanhBackward, x_in, gelu_pre, x);
  }
  const int slots = static_cast<int>(history.numel());
  auto* hist = static_cast<unsigned*>(history.raw_data());
  const float sc = fp8_math::scale_for(std::bit_cast<float>(fp8_math::history_max_bits(hist, slots, slot)),
                                       format_of(format), margin);
  const Tensor s = empty({1}, TensorOptions(DType::f32));
  *s.data_ptr<float>() = sc;
  fp8_quantize_transpose(x, false, s, format, out, out_t, col_sums);
  *scale_inv.data_ptr<float>() = 1.0f / sc;
  if (scale.defined()) *scale.data_ptr<float>() = sc;
  unsigned m = 0;
  with_floats(x, [&](auto at, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(at(i));
      m = std::max(m, std::isnan(a) ? fp8_math::kNanAmaxBits : std::bit_cast<unsigned>(a));
    }
  });
  hist[slot] = std::max(hist[slot], m);
  hist[fp8_math::history_next(slot, slots)] = 0;
}

// The reference FP8 GEMM: the codes decoded exactly to f32 (every e4m3 and e5m2 value is an f32),
// Eigen's f32 product, then the two inverse scales and the bias in f32 and one rounding.
template <>
bool CpuBackend::fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb,
                          const Tensor& b_inv, const Tensor& bias, const Tensor& out, bool /*fast_accum*/) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const auto decode_all = [k](const Tensor& t, Fp8Format fmt, int64_t r) {
    const fp8_math::Format& f = format_of(fmt);
    const auto* c = static_cast<const uint8_t*>(t.raw_data());
    Mat mtx(r, k);
    for (int64_t i = 0; i < r * k; ++i) mtx.data()[i] = fp8_math::decode(c[i], f);
    return mtx;
  };
  const Mat A = decode_all(a, fa, m), B = decode_all(b, fb, n);
  Mat D(m, n);
  D.noalias() = A * B.transpose();
  const float s = *a_inv.data_ptr<float>() * *b_inv.data_ptr<float>();
  std::vector<float> bias_f(n, 0.0f);
  if (bias.defined())
    for (int64_t j = 0; j < n; ++j)
      bias_f[j] = bias.dtype() == DType::f32   ? bias.data_ptr<float>()[j]
                  : bias.dtype() == DType::f16 ? static_cast<float>(static_cast<const Half*>(bias.raw_data())[j])
                                               : static_cast<float>(static_cast<const BFloat16*>(bias.raw_data())[j]);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = D(i, j) * s + bias_f[j];
      switch (out.dtype()) {
        case DType::f32:
          static_cast<float*>(out.raw_data())[i * n + j] = v;
          break;
        case DType::f16:
          static_cast<Half*>(out.raw_data())[i * n + j] = Half(v);
          break;
        default:
          static_cast<BFloat16*>(out.raw_data())[i * n + j] = BFloat16(v);
      }
    }
  return true;
}

}  // namespace mg::kernels
