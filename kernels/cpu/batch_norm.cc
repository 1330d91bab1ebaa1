// Batch normalization on the CPU over x viewed as [N, C, S] (S = H*W, or 1 for [N, C]):
// per-channel statistics in f64 accumulators (two passes: mean, then squared deviations,
// which stays accurate where E[x^2] - E[x]^2 would cancel), then one fused scale+shift pass.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

struct NCS {
  int64_t N, C, S;
  int64_t M() const { return N * S; }  // values per channel
};

NCS ncs(const Tensor& x) {
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
  return {x.size(0), x.size(1), S};
}

// Channels per thread: enough that each thread has ~64K values.
int64_t channel_grain(const NCS& s) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(s.M(), 1)); }

// Channel c's sum of (x - shift) and of (x - shift)^2, in f64. Four independent
// accumulators per sum let the additions pipeline (one chain would wait on every add).
template <class T>
void channel_sums(const NCS& s, const T* x, int64_t c, double shift, double* sum, double* sumsq) {
  double a[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
  for (int64_t n = 0; n < s.N; ++n) {
    const T* v = x + (n * s.C + c) * s.S;
    int64_t k = 0;
    for (; k + 4 <= s.S; k += 4)
      for (int u = 0; u < 4; ++u) {
        const double d = static_cast<double>(v[k + u]) - shift;
        a[u] += d;
        q[u] += d * d;
      }
    for (; k < s.S; ++k) {
      const double d = static_cast<double>(v[k]) - shift;
      a[0] += d;
      q[0] += d * d;
    }
  }
  *sum = (a[0] + a[1]) + (a[2] + a[3]);
  *sumsq = (q[0] + q[1]) + (q[2] + q[3]);
}

// Channel c's sum(g) and sum(g * (x - mean)), in f64, four accumulators each.
template <class T>
void grad_sums(const NCS& s, const T* g, const T* x, int64_t c, double mean, double* sum_g, double* sum_gd) {
  double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  for (int64_t n = 0; n < s.N; ++n) {
    const int64_t o = (n * s.C + c) * s.S;
    int64_t k = 0;
    for (; k + 4 <= s.S; k += 4)
      for (int u = 0; u < 4; ++u) {
        const double gv = g[o + k + u];
        a[u] += gv;
        b[u] += gv * (static_cast<double>(x[o + k + u]) - mean);
      }
    for (; k < s.S; ++k) {
      const double gv = g[o + k];
      a[0] += gv;
      b[0] += gv * (static_cast<double>(x[o + k]) - mean);
    }
  }
  *sum_g = (a[0] + a[1]) + (a[2] + a[3]);
  *sum_gd = (b[0] + b[1]) + (b[2] + b[3]);
}

template <class T>
void normalize_channel(const NCS& s, const T* x, T* out, int64_t c, double scale, double shift) {
  const T sc = static_cast<T>(scale), sh = static_cast<T>(shift);
  for (int64_t n = 0; n < s.N; ++n) {
    const int64_t o = (n * s.C + c) * s.S;
    for (int64_t k = 0; k < s.S; ++k) out[o + k] = x[o + k] * sc + sh;
  }
}

template <class T>
void forward_training_t(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                        const Tensor& running_var, double momentum, double eps, const Tensor& out,
                        const Tensor& save_mean, const Tensor& save_invstd) {
  const NCS s = ncs(x);
  const T* px = data_as<T>(x);
  const T *pw = data_as<T>(weight), *pb = data_as<T>(bias);
  T *prm = data_as<T>(running_mean), *prv = data_as<T>(running_var);
  T *po = data_as<T>(out), *pm = data_as<T>(save_mean), *pi = data_as<T>(save_invstd);
  const double M = static_cast<double>(s.M());
  cpu::parallel_for(s.C, channel_grain(s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // Two passes: the mean, then squared deviations from it (no E[x^2] - E[x]^2 cancellation).
      double sum, unused, dev, sq;
      channel_sums(s, px, c, 0.0, &sum, &unused);
      const double mean = sum / M;
      channel_sums(s, px, c, mean, &dev, &sq);
      const double var = std::max(0.0, sq / M - (dev / M) * (dev / M));  // dev ~ 0: rounding of the mean
      const double invstd = 1.0 / std::sqrt(var + eps);
      pm[c] = static_cast<T>(mean);
      pi[c] = static_cast<T>(invstd);
      const double scale = (pw ? pw[c] : 1.0) * invstd;
      normalize_channel(s, px, po, c, scale, (pb ? pb[c] : 0.0) - mean * scale);
      if (prm) prm[c] = static_cast<T>((1.0 - momentum) * prm[c] + momentum * mean);
      if (prv) prv[c] = static_cast<T>((1.0 - momentum) * prv[c] + momentum * var * M / (M - 1.0));
    }
  });
}

template <class T>
void forward_eval_t(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                    const Tensor& running_var, double eps, const Tensor& out) {
  const NCS s = ncs(x);
  const T *pw = data_as<T>(weight), *pb = data_as<T>(bias), *prm = data_as<T>(running_mean),
          *prv = data_as<T>(running_var);
  cpu::parallel_for(s.C, channel_grain(s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[c]) + eps);
      const double scale = (pw ? pw[c] : 1.0) * invstd;
      normalize_channel(s, data_as<T>(x), data_as<T>(out), c, scale, (pb ? pb[c] : 0.0) - prm[c] * scale);
    }
  });
}

template <class T>
void backward_t(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& invstd,
                bool training, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  const NCS s = ncs(x);
  const T *pg = data_as<T>(grad_out), *px = data_as<T>(x), *pw = data_as<T>(weight);
  const T *pm = data_as<T>(mean), *pi = data_as<T>(invstd);
  T *pdx = data_as<T>(grad_x), *pdw = data_as<T>(grad_weight), *pdb = data_as<T>(grad_bias);
  const double M = static_cast<double>(s.M());
  cpu::parallel_for(s.C, channel_grain(s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double mu = pm[c], is = pi[c], w = pw ? pw[c] : 1.0;
      double sum_g, sum_gd;  // sum(g), sum(g * (x - mean))
      grad_sums(s, pg, px, c, mu, &sum_g, &sum_gd);
      if (pdw) pdw[c] = static_cast<T>(sum_gd * is);
      if (pdb) pdb[c] = static_cast<T>(sum_g);
      if (!pdx) continue;
      // training: dx = w*is * (g - mean(g) - (x - mu) * is^2 * mean(g * (x - mu)));
      // eval: the statistics are constants, dx = w*is * g.
      const T a = static_cast<T>(w * is);
      const T mg = training ? static_cast<T>(sum_g / M) : T(0);
      const T k2 = training ? static_cast<T>(is * is * sum_gd / M) : T(0);
      const T muT = static_cast<T>(mu);
      for (int64_t n = 0; n < s.N; ++n) {
        const int64_t o = (n * s.C + c) * s.S;
        for (int64_t k = 0; k < s.S; ++k) pdx[o + k] = a * (pg[o + k] - mg - (px[o + k] - muT) * k2);
      }
    }
  });
}

}  // namespace

template <>
void CpuBackend::batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                             const Tensor& running_mean, const Tensor& running_var, double momentum,
                                             double eps, const Tensor& out, const Tensor& save_mean,
                                             const Tensor& save_invstd) {
  if (x.dtype() == DType::f64)
    return forward_training_t<double>(x, weight, bias, running_mean, running_var, momentum, eps, out, save_mean,
                                      save_invstd);
  forward_training_t<float>(x, weight, bias, running_mean, running_var, momentum, eps, out, save_mean, save_invstd);
}

// The CPU fuses no ReLU: kernels/norm.cc runs it apart.
template <>
bool CpuBackend::batch_norm_relu_forward_training(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                  const Tensor&, double, double, const Tensor&, const Tensor&,
                                                  const Tensor&, const Tensor&) {
  return false;
}

template <>
bool CpuBackend::batch_norm_relu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;
}

template <>
void CpuBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& running_mean, const Tensor& running_var, double eps,
                                         const Tensor& out) {
  if (x.dtype() == DType::f64) return forward_eval_t<double>(x, weight, bias, running_mean, running_var, eps, out);
  forward_eval_t<float>(x, weight, bias, running_mean, running_var, eps, out);
}

template <>
void CpuBackend::batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                     const Tensor& invstd, bool training, const Tensor& grad_x,
                                     const Tensor& grad_weight, const Tensor& grad_bias) {
  if (x.dtype() == DType::f64)
    return backward_t<double>(grad_out, x, weight, mean, invstd, training, grad_x, grad_weight, grad_bias);
  backward_t<float>(grad_out, x, weight, mean, invstd, training, grad_x, grad_weight, grad_bias);
}

}  // namespace mg::kernels
