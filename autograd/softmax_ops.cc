// softmax and log_softmax over one dim (computed in at least f32 under autocast).

#include "autograd/op_support.h"

namespace mg {

// ---------------- softmax family ----------------

Tensor softmax(const Tensor& a, int64_t dim) {
  if (autograd::recompute_hook)
    if (Tensor r = autograd::recompute_hook("softmax", a, [dim](const Tensor& x) { return softmax(x, dim); });
        r.defined())
      return r;
  if (autocast::widen_needed({&a})) return softmax(autocast::widen(a), dim);
  Tensor y = kernels::softmax(a, dim);
  if (any_requires_grad({a}))
    record("softmax", {a}, y, [dim, sy = SavedTensor(y, "softmax")](const Grads& g) {
      return Grads{kernels::softmax_backward(g[0], sy.unpack(), dim)};
    });
  return y;
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  if (autocast::widen_needed({&a})) return log_softmax(autocast::widen(a), dim);
  Tensor y = kernels::log_softmax(a, dim);
  if (any_requires_grad({a}))
    record("log_softmax", {a}, y, [dim, sy = SavedTensor(y, "log_softmax")](const Grads& g) {
      return Grads{kernels::log_softmax_backward(g[0], sy.unpack(), dim)};
    });
  return y;
}

}  // namespace mg
