// Loss CPU kernels: the NLL gather and the fused cross-entropy (one logsumexp per row forward,
// softmax - onehot backward), accumulated in f64: the reference for cuda/cross_entropy.cu.
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/strided_loop.h"
#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

template <class T>
int64_t cross_entropy_forward_t(const Tensor& logits, const Tensor& target, int64_t ignore_index, double e,
                                const Tensor& loss, const Tensor& lse) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t M = logits.size(0), C = logits.size(1);
  const T* x = static_cast<const T*>(logits.raw_data());
  const int64_t* t = static_cast<const int64_t*>(target.raw_data());
  A* pl = static_cast<A*>(loss.raw_data());
  A* pe = static_cast<A*>(lse.raw_data());
  for (int64_t i = 0; i < M; ++i) {
    const T* row = x + i * C;
    double mx = -std::numeric_limits<double>::infinity(), s = 0, sx = 0;
    for (int64_t j = 0; j < C; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    const double shift = std::isinf(mx) ? 0.0 : mx;
    for (int64_t j = 0; j < C; ++j) {
      s += std::exp(static_cast<double>(row[j]) - shift);
      sx += static_cast<double>(row[j]);
    }
    const double l = shift + std::log(s);
    pe[i] = static_cast<A>(l);
    if (t[i] == ignore_index) {
      pl[i] = A(0);
      continue;
    }
    // The loop knows the row, so it names it (the CUDA kernel reports the value only).
    MG_CHECK(t[i] >= 0 && t[i] < C, IndexError, "cross_entropy: target ", t[i], " at position ", i,
             " is out of range for ", C, " classes (expected [0, ", C - 1, "] or ignore_index ", ignore_index, ")");
    // Without smoothing the mean-logit term is left out, not multiplied by 0: a row with -inf
    // logits (a masked vocabulary) has sx = -inf, and 0 * -inf would make the loss NaN.
    const double smooth = e != 0.0 ? e / static_cast<double>(C) * sx : 0.0;
    pl[i] = static_cast<A>(l - (1.0 - e) * static_cast<double>(row[t[i]]) - smooth);
  }
  return ignore_index;
}

template <class T>
void cross_entropy_backward_t(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              int64_t ignore_index, double e, const Tensor& grad) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t M = logits.size(0), C = logits.size(1);
  const T* x = static_cast<const T*>(logits.raw_data());
  const int64_t* t = static_cast<const int64_t*>(target.raw_data());
  const A* pc = static_cast<const A*>(coef.raw_data());
  const A* pe = static_cast<const A*>(lse.raw_data());
  T* g = static_cast<T*>(grad.raw_data());
  const int64_t cs = coef.numel() == 1 ? 0 : 1;
  for (int64_t i = 0; i < M; ++i) {
    const bool ignored = t[i] == ignore_index;
    const double c = ignored ? 0.0 : static_cast<double>(pc[i * cs]), l = pe[i];
    for (int64_t j = 0; j < C; ++j) {
      const double q =
          std::exp(static_cast<double>(x[i * C + j]) - l) - e / static_cast<double>(C) - (j == t[i] ? 1.0 - e : 0.0);
      g[i * C + j] = static_cast<T>(ignored ? 0.0 : c * q);
    }
  }
}

}  // namespace

template <>
void CpuBackend::nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index,
                                  const Tensor& out) {
  const int64_t cdim = log_probs.dim() == 1 ? 0 : 1;
  const int64_t C = log_probs.size(cdim);
  const int64_t sc = log_probs.stride(cdim);
  Shape lp_st = log_probs.strides();
  lp_st.erase(lp_st.begin() + cdim);
  MG_DISPATCH_FLOAT(log_probs.dtype(), "nll_loss_forward", [&] {
    using T = scalar_t;
    const T* pl = static_cast<const T*>(log_probs.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    MG_DISPATCH_INDEX(target.dtype(), "nll_loss_forward", [&] {
      using I = scalar_t;
      const I* pt = static_cast<const I*>(target.raw_data());
      strided_loop<3>(target.sizes(), {out.strides(), target.strides(), lp_st}, [&](auto off, auto st, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = pt[off[1] + i * st[1]];
          T& o = po[off[0] + i * st[0]];
          if (t == ignore_index) {
            o = static_cast<T>(0.0f);
            continue;
          }
          MG_CHECK(t >= 0 && t < C, IndexError, "nll_loss_forward: target ", t, " out of range [0, ", C, ")");
          o = static_cast<T>(-static_cast<opmath_t<T>>(pl[off[2] + i * st[2] + t * sc]));
        }
      });
    });
  });
}

template <>
int64_t CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                          double smoothing, const Tensor& loss, const Tensor& lse) {
  int64_t bad = ignore_index;
  MG_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    bad = cross_entropy_forward_t<scalar_t>(logits, target, ignore_index, smoothing, loss, lse);
  });
  return bad;
}

template <>
void CpuBackend::cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target,
                                        const Tensor& lse, int64_t ignore_index, double smoothing, const Tensor& grad) {
  MG_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", [&] {
    cross_entropy_backward_t<scalar_t>(coef, logits, target, lse, ignore_index, smoothing, grad);
  });
}

// The two passes in turn: the loops read the logits from cache-sized rows anyway.
template <>
int64_t CpuBackend::cross_entropy_forward_backward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                   double smoothing, const Tensor& coef, const Tensor& loss,
                                                   const Tensor& lse, const Tensor& grad) {
  const int64_t bad = cross_entropy_forward(logits, target, ignore_index, smoothing, loss, lse);
  if (bad == ignore_index) cross_entropy_backward(coef, logits, target, lse, ignore_index, smoothing, grad);
  return bad;
}

}  // namespace mg::kernels
