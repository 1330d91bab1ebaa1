// Mixed-precision CPU loops: the fused unscale + inf/NaN check and the stochastic-rounding bf16
// update, with amp_math.h's per-element rules (the same bits as cuda/amp.cu for a given seed).
#include <cmath>

#include "kernels/amp_math.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

template <class T>
bool unscale_cpu(const Tensor& g, double inv_scale) {
  using M = opmath_t<T>;
  T* p = static_cast<T*>(g.raw_data());
  const int64_t n = g.numel();
  const M s = static_cast<M>(inv_scale);
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const M v = static_cast<M>(p[i]);
    bad |= !std::isfinite(v);
    p[i] = static_cast<T>(v * s);
  }
  return bad;
}

template <class U>
void stochastic_cpu(const Tensor& param, const Tensor& update, float alpha, uint64_t seed) {
  auto* p = static_cast<uint16_t*>(param.raw_data());
  const U* u = static_cast<const U*>(update.raw_data());
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = BFloat16::to_float(p[i]) + alpha * static_cast<float>(u[i]);
    p[i] = amp_math::bf16_stochastic_bits(v, static_cast<uint32_t>(amp_math::mix(seed, static_cast<uint64_t>(i))));
  }
}

}  // namespace

template <>
void CpuBackend::amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                                  const Tensor& found_inf, double growth_factor, double backoff_factor,
                                  int64_t growth_interval) {
  amp_math::update_scale(*scale.data_ptr<float>(), *growth_tracker.data_ptr<int64_t>(), *skipped.data_ptr<int64_t>(),
                         *found_inf.data_ptr<float>() != 0.0f, growth_factor, backoff_factor, growth_interval);
}

template <>
void CpuBackend::amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, float inv_scale,
                             const Tensor& scale) {
  if (scale.defined()) inv_scale = amp_math::inverse_scale(*scale.data_ptr<float>());
  bool bad = false;
  for (const Tensor& g : grads)
    MG_DISPATCH_FLOAT(g.dtype(), "amp_unscale_", [&] { bad |= unscale_cpu<scalar_t>(g, inv_scale); });
  if (bad) raw::fill_(found_inf, 1.0);
}

template <>
void CpuBackend::add_stochastic_bf16(const Tensor& param, const Tensor& update, float alpha, uint64_t seed) {
  if (update.dtype() == DType::f32)
    stochastic_cpu<float>(param, update, alpha, seed);
  else
    stochastic_cpu<BFloat16>(param, update, alpha, seed);
}

}  // namespace mg::kernels
