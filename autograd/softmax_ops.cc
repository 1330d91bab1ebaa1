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

namespace {
Tensor softmax_math(const Tensor& a, int64_t dim) {
  return softmax_like("softmax", a, dim, kernels::softmax, kernels::softmax_backward);
}
}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return around(policy::softmax, softmax_math, a, dim); }

namespace {
Tensor log_softmax_math(const Tensor& a, int64_t dim) {
  return softmax_like("log_softmax", a, dim, kernels::log_softmax, kernels::log_softmax_backward);
}
}  // namespace

Tensor log_softmax(const Tensor& a, int64_t dim) { return around(policy::log_softmax, log_softmax_math, a, dim); }

}  // namespace mg
