// FP8 CPU loops: the reference for cuda/fp8.cu, with fp8_math.h's rounding and scale rule.
#include <cmath>

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
void CpuBackend::fp8_amax_scale(const Tensor& x, Fp8Format format, int margin, const Tensor& amax,
                                const Tensor& scale) {
  float m = 0.0f;
  with_floats(x, [&](auto at, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(at(i));
      if (std::isnan(a) || a > m) m = a;
      if (std::isnan(m)) break;
    }
  });
  *amax.data_ptr<float>() = m;
  *scale.data_ptr<float>() = fp8_math::scale_for(m, format_of(format), margin);
}

}  // namespace mg::kernels
