// softmax and log_softmax over one dim (computed in at least f32 under autocast).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "autograd/autocast_policy.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/random.h"
#include "kernels/ops.h"

namespace mg {

using autograd::any_requires_grad;
using autograd::needs_grad;
using autograd::record;
using autograd::reduce_grad;
using autograd::SavedTensor;
using Grads = std::vector<Tensor>;

// ---------------- softmax family ----------------

Tensor softmax(const Tensor& a, int64_t dim) {
  if (autograd::recompute_hook)
    if (Tensor r = autograd::recompute_hook("softmax", a, [dim](const Tensor& x) { return softmax(x, dim); });
        r.defined())
      return r;
  if (autocast::widen_needed({&a})) return softmax(autocast::widen(a), dim);
  Tensor y = kernels::softmax(a, dim);
  if (any_requires_grad({a}))
    record("softmax", {a}, y, [dim, dt = a.dtype(), sy = SavedTensor(y, "softmax")](const Grads& g) {
      Tensor yv = sy.unpack();
      return Grads{reduce_grad(kernels::softmax_backward(g[0], yv, dim), yv.sizes(), dt)};
    });
  return y;
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  if (autocast::widen_needed({&a})) return log_softmax(autocast::widen(a), dim);
  Tensor y = kernels::log_softmax(a, dim);
  if (any_requires_grad({a}))
    record("log_softmax", {a}, y, [dim, dt = a.dtype(), sy = SavedTensor(y, "log_softmax")](const Grads& g) {
      Tensor yv = sy.unpack();
      return Grads{reduce_grad(kernels::log_softmax_backward(g[0], yv, dim), yv.sizes(), dt)};
    });
  return y;
}

}  // namespace mg
