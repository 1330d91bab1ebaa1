// Checks and dispatch for kernels/loss.h; the CPU loops (cpu/loss.cc) are the reference for
// the CUDA kernels (cuda/cross_entropy.cu); they accumulate in f64 and f32 respectively.
#include "kernels/loss.h"

#include "kernels/dispatch.h"
#include "kernels/ops.h"
#include "kernels/elementwise.h"

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

}  // namespace

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index) {
  const Device dev = check_device("nll_loss_forward", {&log_probs, &target});
  MG_CHECK(is_floating(log_probs.dtype()), DTypeError, "nll_loss_forward: log_probs must be floating, got ",
           log_probs.dtype());
  MG_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, DTypeError,
           "nll_loss_forward: target must hold class indices (i64), got ", target.dtype(),
           " (one-hot or probability targets are not class indices)");
  MG_CHECK(log_probs.dim() >= 1, ShapeError, "nll_loss_forward: log_probs must be [C], [N, C] or [N, C, d1, ...], got ",
           shape_str(log_probs.sizes()));
  Shape want = log_probs.sizes();
  want.erase(want.begin() + (log_probs.dim() == 1 ? 0 : 1));
  MG_CHECK(target.sizes() == want, ShapeError, "nll_loss_forward: target shape ", shape_str(target.sizes()),
           " should be ", shape_str(want), " for log_probs ", shape_str(log_probs.sizes()));
  Tensor out = empty(want, {log_probs.dtype(), dev});
  backend(dev, "nll_loss_forward").nll_loss_forward(log_probs, target, ignore_index, out);
  return out;
}

std::tuple<Tensor, Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                 double label_smoothing) {
  const char* op = "cross_entropy";
  check_inputs(op, logits, target, label_smoothing);
  Tensor x = raw::contiguous(logits), t = prep_target(target);
  const TensorOptions o{acc_dtype(logits.dtype()), logits.device()};
  Tensor loss = empty({logits.size(0)}, o), lse = empty({logits.size(0)}, o);
  const int64_t v = backend(logits.device(), op).cross_entropy_forward(x, t, ignore_index, label_smoothing, loss, lse);
  MG_CHECK(v == ignore_index, IndexError, op, ": target ", v, " is out of range for ", logits.size(1),
           " classes (expected [0, ", logits.size(1) - 1, "] or ignore_index ", ignore_index, ")");
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              int64_t ignore_index, double label_smoothing, const Tensor& out) {
  const char* op = "cross_entropy_backward";
  check_inputs(op, logits, target, label_smoothing);
  const DType ad = acc_dtype(logits.dtype());
  const int64_t M = logits.size(0);
  MG_CHECK(lse.defined() && lse.sizes() == Shape{M} && lse.dtype() == ad, ShapeError, op, ": lse must be [", M, "] of ",
           ad);
  MG_CHECK(coef.defined() && (coef.numel() == 1 || coef.numel() == M), ShapeError, op, ": coef must have 1 or ", M,
           " elements, got shape ", shape_str(coef.sizes()));
  Tensor x = raw::contiguous(logits), t = prep_target(target), l = raw::contiguous(lse);
  Tensor c = raw::contiguous(coef.dtype() == ad ? coef : cast(coef, ad));
  MG_CHECK(!out.defined() || (out.sizes() == logits.sizes() && out.dtype() == logits.dtype() &&
                              out.device() == logits.device() && out.is_contiguous()),
           ValueError, op, ": out must be a contiguous ", logits.dtype(), " tensor of shape ",
           shape_str(logits.sizes()), " on ", logits.device());
  MG_CHECK(!out.defined() || !(out.storage() == x.storage()) || x.raw_data() == out.raw_data(), ValueError, op,
           ": out may be logits itself but must not partly overlap it");
  Tensor grad = out.defined() ? out : empty(logits.sizes(), {logits.dtype(), logits.device()});
  backend(logits.device(), op).cross_entropy_backward(c, x, t, l, ignore_index, label_smoothing, grad);
  return grad;
}

}  // namespace mg::kernels
