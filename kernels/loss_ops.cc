// Validation and dispatch for kernels/loss_ops.h. The CPU loop is the reference for the
// CUDA kernel (kernels/cuda/cross_entropy.cu); both accumulate in f64 / f32 respectively.
#include "kernels/loss_ops.h"

#include <cmath>
#include <limits>

#include "kernels/ops.h"

#ifdef MG_WITH_CUDA
#include "kernels/cuda/loss_cuda.h"
#endif

namespace mg::kernels {
namespace {

DType acc_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

void check_inputs(const char* op, const Tensor& logits, const Tensor& target, double e) {
  MG_CHECK(logits.defined() && target.defined(), ValueError, op, ": undefined input");
  MG_CHECK(is_floating(logits.dtype()), DTypeError, op, ": logits must be floating, got ", logits.dtype());
  MG_CHECK(logits.dim() == 2, ShapeError, op, ": logits must be [M, C], got ", shape_str(logits.sizes()));
  MG_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, DTypeError, op,
           ": target must hold class indices (i64 or i32), got ", target.dtype());
  MG_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), ShapeError, op, ": target shape ",
           shape_str(target.sizes()), " should be [", logits.size(0), "] for logits ", shape_str(logits.sizes()));
  MG_CHECK(target.device() == logits.device(), DeviceError, op, ": target is on ", target.device(),
           " but logits are on ", logits.device());
  MG_CHECK(e >= 0.0 && e <= 1.0, ValueError, op, ": label_smoothing must be in [0, 1], got ", e);
  MG_CHECK(logits.size(1) >= 1, ShapeError, op, ": logits need at least one class, got ", shape_str(logits.sizes()));
}

Tensor prep_target(const Tensor& t) { return raw::contiguous(t.dtype() == DType::i64 ? t : cast(t, DType::i64)); }

template <class T>
void cpu_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double e, const Tensor& loss,
                 const Tensor& lse) {
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
    MG_CHECK(t[i] >= 0 && t[i] < C, IndexError, "cross_entropy: target ", t[i], " at position ", i,
             " is out of range for ", C, " classes (expected [0, ", C - 1, "] or ignore_index ", ignore_index, ")");
    pl[i] = static_cast<A>(l - (1.0 - e) * static_cast<double>(row[t[i]]) - e / static_cast<double>(C) * sx);
  }
}

template <class T>
void cpu_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
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
      const double q = std::exp(static_cast<double>(x[i * C + j]) - l) - e / static_cast<double>(C) -
                       (j == t[i] ? 1.0 - e : 0.0);
      g[i * C + j] = static_cast<T>(ignored ? 0.0 : c * q);
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                 double label_smoothing) {
  const char* op = "cross_entropy";
  check_inputs(op, logits, target, label_smoothing);
  Tensor x = raw::contiguous(logits), t = prep_target(target);
  const TensorOptions o{acc_dtype(logits.dtype()), logits.device()};
  Tensor loss = empty({logits.size(0)}, o), lse = empty({logits.size(0)}, o);
  if (logits.is_cuda()) {
#ifdef MG_WITH_CUDA
    const int64_t v = cuda::cross_entropy_forward(x, t, ignore_index, label_smoothing, loss, lse);
    MG_CHECK(v == ignore_index, IndexError, op, ": target ", v, " is out of range for ", logits.size(1),
             " classes (expected [0, ", logits.size(1) - 1, "] or ignore_index ", ignore_index, ")");
    return {loss, lse};
#endif
  }
  MG_CHECK(logits.device().is_cpu(), DeviceError, op, ": no kernel for device ", logits.device());
  MG_DISPATCH_FLOAT(logits.dtype(), op, [&] { cpu_forward<scalar_t>(x, t, ignore_index, label_smoothing, loss, lse); });
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_backward";
  check_inputs(op, logits, target, label_smoothing);
  const DType ad = acc_dtype(logits.dtype());
  const int64_t M = logits.size(0);
  MG_CHECK(lse.defined() && lse.sizes() == Shape{M} && lse.dtype() == ad, ShapeError, op, ": lse must be [", M,
           "] of ", ad);
  MG_CHECK(coef.defined() && (coef.numel() == 1 || coef.numel() == M), ShapeError, op,
           ": coef must have 1 or ", M, " elements, got shape ", shape_str(coef.sizes()));
  Tensor x = raw::contiguous(logits), t = prep_target(target), l = raw::contiguous(lse);
  Tensor c = raw::contiguous(coef.dtype() == ad ? coef : cast(coef, ad));
  Tensor grad = empty(logits.sizes(), {logits.dtype(), logits.device()});
  if (logits.is_cuda()) {
#ifdef MG_WITH_CUDA
    cuda::cross_entropy_backward(c, x, t, l, ignore_index, label_smoothing, grad);
    return grad;
#endif
  }
  MG_CHECK(logits.device().is_cpu(), DeviceError, op, ": no kernel for device ", logits.device());
  MG_DISPATCH_FLOAT(logits.dtype(), op, [&] { cpu_backward<scalar_t>(c, x, t, l, ignore_index, label_smoothing, grad); });
  return grad;
}

}  // namespace mg::kernels
