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

namespace {
// The error for a label outside [0, C) other than ignore_index (v: what the backend returned).
void check_label(int64_t v, const Tensor& logits, int64_t ignore_index) {
  if (v != ignore_index) raise_bad_label(v, logits.size(1), ignore_index);
}
// coef in the accumulation dtype, contiguous: [M] or one element.
Tensor prep_coef(const char* op, const Tensor& coef, int64_t M, DType ad, const Device& dev) {
  MG_CHECK(coef.defined() && (coef.numel() == 1 || coef.numel() == M), ShapeError, op, ": coef must have 1 or ", M,
           " elements, got shape ", coef.defined() ? shape_str(coef.sizes()) : std::string("(undefined)"));
  MG_CHECK(coef.device() == dev, DeviceError, op, ": coef is on ", coef.device(), " but logits are on ", dev);
  return raw::contiguous(coef.dtype() == ad ? coef : cast(coef, ad));
}
// `out`, where the gradient goes: contiguous, logits' dtype and shape, logits itself or apart from it.
void check_grad_out(const char* op, const Tensor& out, const Tensor& logits, const Tensor& x) {
  MG_CHECK(out.sizes() == logits.sizes() && out.dtype() == logits.dtype() && out.device() == logits.device() &&
               out.is_contiguous(),
           ValueError, op, ": out must be a contiguous ", logits.dtype(), " tensor of shape ",
           shape_str(logits.sizes()), " on ", logits.device());
  MG_CHECK(!(out.storage() == x.storage()) || x.raw_data() == out.raw_data(), ValueError, op,
           ": out may be logits itself but must not partly overlap it");
}
}  // namespace

std::tuple<Tensor, Tensor> cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                 double label_smoothing) {
  const char* op = "cross_entropy";
  check_inputs(op, logits, target, label_smoothing);
  Tensor x = raw::contiguous(logits), t = prep_target(target);
  const TensorOptions o{acc_dtype(logits.dtype()), logits.device()};
  Tensor loss = empty({logits.size(0)}, o), lse = empty({logits.size(0)}, o);
  check_label(backend(logits.device(), op).cross_entropy_forward(x, t, ignore_index, label_smoothing, loss, lse),
              logits, ignore_index);
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
  Tensor x = raw::contiguous(logits), t = prep_target(target), l = raw::contiguous(lse);
  const Tensor c = prep_coef(op, coef, M, ad, logits.device());
  if (out.defined()) check_grad_out(op, out, logits, x);
  Tensor grad = out.defined() ? out : empty(logits.sizes(), {logits.dtype(), logits.device()});
  backend(logits.device(), op).cross_entropy_backward(c, x, t, l, ignore_index, label_smoothing, grad);
  return grad;
}

std::tuple<Tensor, Tensor> cross_entropy_forward_backward(const Tensor& logits, const Tensor& target,
                                                          int64_t ignore_index, double label_smoothing,
                                                          const Tensor& coef, const Tensor& out) {
  const char* op = "cross_entropy_forward_backward";
  check_inputs(op, logits, target, label_smoothing);
  MG_CHECK(out.defined(), ValueError, op, ": out, where the gradient goes, is required (it may be logits itself)");
  const DType ad = acc_dtype(logits.dtype());
  const int64_t M = logits.size(0);
  Tensor x = raw::contiguous(logits), t = prep_target(target);
  const Tensor c = prep_coef(op, coef, M, ad, logits.device());
  check_grad_out(op, out, logits, x);
  const TensorOptions o{ad, logits.device()};
  Tensor loss = empty({M}, o), lse = empty({M}, o);
  check_label(backend(logits.device(), op)
                  .cross_entropy_forward_backward(x, t, ignore_index, label_smoothing, c, loss, lse, out),
              logits, ignore_index);
  return {loss, lse};
}

}  // namespace mg::kernels
