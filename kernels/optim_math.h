// The per-element Adam/AdamW and SGD update rules, written once for the CPU loop and the CUDA
// multi-tensor kernels so both paths compute the same expression in the same order.
#pragma once

#ifdef __CUDACC__
#define MG_OPTIM_HD __host__ __device__ __forceinline__
#else
#define MG_OPTIM_HD inline
#endif

#include <cmath>

namespace mg::kernels::optim_math {

// Scalars of one Adam call in the math type T; step_size and bc2_sqrt are per tensor.
template <class T>
struct AdamScalars {
  T lr, beta1, beta2, eps, weight_decay;
  bool decoupled, amsgrad, maximize;
};

// torch.optim.Adam (foreach=False) for one element: m = b1*m + (1-b1)*g,
// v = b2*v + (1-b2)*(g*g), denom = sqrt(vmax or v)/sqrt(1-b2^t) + eps, p -= lr/(1-b1^t) * m/denom.
template <class T>
MG_OPTIM_HD void adam_element(T& p, T g, T& m, T& v, T* vmax, const AdamScalars<T>& s, T step_size, T bc2_sqrt) {
  if (s.maximize) g = -g;
  if (s.weight_decay != T(0)) {
    if (s.decoupled)
      p = p * (T(1) - s.lr * s.weight_decay);
    else
      g = g + s.weight_decay * p;
  }
  m = s.beta1 * m + (T(1) - s.beta1) * g;
  v = s.beta2 * v + (T(1) - s.beta2) * (g * g);
  T vv = v;
  if (s.amsgrad) {
    // NaN-propagating max, like torch.maximum.
    if (v > *vmax || v != v) *vmax = v;  // a NaN in either stays
    vv = *vmax;
  }
  const T denom = sqrt(vv) / bc2_sqrt + s.eps;
  p = p - step_size * (m / denom);
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

}  // namespace mg::kernels::optim_math
