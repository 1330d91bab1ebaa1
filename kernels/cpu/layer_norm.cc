// Layer norm on the CPU, one row at a time (llm.c's layernorm_forward/backward): two-pass
// mean and variance, statistics kept for backward. Row sums accumulate in double, so f32
// rows of thousands of elements lose nothing to summation order.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

template <class T>
void layer_norm_forward_t(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                          const Tensor& mean, const Tensor& rstd) {
  using M = opmath_t<T>;  // the stats dtype: float for f32/f16/bf16, double for f64
  const int64_t rows = x.size(0), n = x.size(1);
  const T* px = x.data_ptr<T>();
  const T* pw = weight.defined() ? weight.data_ptr<T>() : nullptr;
  const T* pb = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* po = out.data_ptr<T>();
  M* pm = mean.data_ptr<M>();
  M* pr = rstd.data_ptr<M>();
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = px + i * n;
    T* yr = po + i * n;
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += static_cast<double>(static_cast<M>(xr[j]));
    const double mu = n > 0 ? s / static_cast<double>(n) : 0.0;
    double v = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double d = static_cast<double>(static_cast<M>(xr[j])) - mu;
      v += d * d;
    }
    v = n > 0 ? v / static_cast<double>(n) : 0.0;
    const M m = static_cast<M>(mu);
    const M r = static_cast<M>(1.0 / std::sqrt(v + eps));
    pm[i] = m;
    pr[i] = r;
    for (int64_t j = 0; j < n; ++j) {
      M y = (static_cast<M>(xr[j]) - m) * r;
      if (pw) y *= static_cast<M>(pw[j]);
      if (pb) y += static_cast<M>(pb[j]);
      yr[j] = static_cast<T>(y);
    }
  }
}

template <class T>
void layer_norm_backward_t(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                           const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                           const Tensor& grad_bias) {
  using M = opmath_t<T>;
  const int64_t rows = x.size(0), n = x.size(1);
  const T* pg = grad_out.data_ptr<T>();
  const T* px = x.data_ptr<T>();
  const T* pw = weight.defined() ? weight.data_ptr<T>() : nullptr;
  const M* pm = mean.data_ptr<M>();
  const M* pr = rstd.data_ptr<M>();
  T* pdx = grad_x.defined() ? grad_x.data_ptr<T>() : nullptr;
  // Parameter gradients are sums over all rows: accumulate in double, round once.
  std::vector<double> dw(grad_weight.defined() ? n : 0, 0.0), db(grad_bias.defined() ? n : 0, 0.0);
  std::vector<M> xhat(n), gw(n);
  for (int64_t i = 0; i < rows; ++i) {
    const T* gr = pg + i * n;
    const T* xr = px + i * n;
    const M m = pm[i], r = pr[i];
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < n; ++j) {
      const M g = static_cast<M>(gr[j]);
      xhat[j] = (static_cast<M>(xr[j]) - m) * r;
      gw[j] = pw ? g * static_cast<M>(pw[j]) : g;
      sum_g += static_cast<double>(gw[j]);
      sum_gx += static_cast<double>(gw[j]) * static_cast<double>(xhat[j]);
      if (!dw.empty()) dw[j] += static_cast<double>(g) * static_cast<double>(xhat[j]);
      if (!db.empty()) db[j] += static_cast<double>(g);
    }
    if (!pdx) continue;
    const M mean_g = static_cast<M>(sum_g / static_cast<double>(n));
    const M mean_gx = static_cast<M>(sum_gx / static_cast<double>(n));
    T* dxr = pdx + i * n;
    for (int64_t j = 0; j < n; ++j) dxr[j] = static_cast<T>(r * (gw[j] - mean_g - xhat[j] * mean_gx));
  }
  if (!dw.empty()) {
    T* p = grad_weight.data_ptr<T>();
    for (int64_t j = 0; j < n; ++j) p[j] = static_cast<T>(dw[j]);
  }
  if (!db.empty()) {
    T* p = grad_bias.data_ptr<T>();
    for (int64_t j = 0; j < n; ++j) p[j] = static_cast<T>(db[j]);
  }
}

}  // namespace

template <>
void CpuBackend::layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                    const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  MG_DISPATCH_FLOAT(x.dtype(), "layer_norm",
                    [&] { layer_norm_forward_t<scalar_t>(x, weight, bias, eps, out, mean, rstd); });
}

template <>
void CpuBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                                     const Tensor& grad_bias) {
  MG_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    layer_norm_backward_t<scalar_t>(grad_out, x, mean, rstd, weight, grad_x, grad_weight, grad_bias);
  });
}

// The fused residual add runs as its parts on the CPU (kernels/norm.cc composes them).
template <>
bool CpuBackend::fused_add_layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              double, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;
}

// So does its FP8 cast (kernels::add_layer_norm_fp8_delayed: the norm in out_dtype, then the cast).
template <>
bool CpuBackend::fused_add_layer_norm_fp8(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          double, DType, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          int, Fp8Format, int, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&) {
  return false;
}

template <>
bool CpuBackend::fused_add_layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, const Tensor&) {
  return false;
}

}  // namespace mg::kernels
