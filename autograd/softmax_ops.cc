// softmax and log_softmax over one dim (computed in at least f32 under autocast).

#include "autograd/op_support.h"

namespace mg {

// ---------------- softmax family ----------------

namespace {
// Both ops keep only their output y: the backward is a function of (g, y).
template <class Forward, class Backward>
Tensor softmax_like(const char* op, const Tensor& a, int64_t dim, Forward forward, Backward backward) {
  Tensor y = forward(a, dim);
  if (any_requires_grad({a}))
    record(op, {a}, y, [dim, sy = SavedTensor(y, op), backward](const Grads& g) {
      return Grads{backward(g[0], sy.unpack(), dim)};
    });
  return y;
}
}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  if (autograd::recompute_hook)
    if (Tensor r = autograd::recompute_hook("softmax", a, [dim](const Tensor& x) { return softmax(x, dim); });
        r.defined())
      return r;
  if (autocast::widen_needed({&a})) return softmax(autocast::widen(a), dim);
  return softmax_like("softmax", a, dim, kernels::softmax, kernels::softmax_backward);
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  if (autocast::widen_needed({&a})) return log_softmax(autocast::widen(a), dim);
  return softmax_like("log_softmax", a, dim, kernels::log_softmax, kernels::log_softmax_backward);
}

}  // namespace mg
