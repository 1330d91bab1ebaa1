// Layer norm: the fused kernel pair of kernels/norm.h; backward needs only x, weight and
// the row statistics. (Batch norm is in conv_ops.cc with the other CNN layers.)
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

// ---------------- layer norm ----------------

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (autograd::recompute_hook)
    if (Tensor r = autograd::recompute_hook("layer_norm", x,
                                            [normalized_shape, weight, bias, eps](const Tensor& in) {
                                              return layer_norm(in, normalized_shape, weight, bias, eps);
                                            });
        r.defined())
      return r;
  if (autocast::widen_needed({&x, &weight, &bias}))
    return layer_norm(autocast::widen(x), normalized_shape, autocast::widen(weight), autocast::widen(bias), eps);
  auto [out, mean, rstd] = kernels::layer_norm_forward(x, normalized_shape, weight, bias, eps);
  if (!any_requires_grad({x, weight, bias})) return out;
  const std::array<bool, 3> mask{needs_grad(x), needs_grad(weight), needs_grad(bias)};
  // The normalized activations are not saved: backward recomputes them from the statistics.
  record("layer_norm", {x, weight, bias}, out,
         [mask, normalized_shape, sx = SavedTensor(x, "layer_norm"),
          sw = weight.defined() ? SavedTensor(weight, "layer_norm") : SavedTensor(),
          smean = SavedTensor(mean, "layer_norm"), srstd = SavedTensor(rstd, "layer_norm"), x_dt = x.dtype(),
          w_dt = weight.defined() ? weight.dtype() : x.dtype(),
          b_dt = bias.defined() ? bias.dtype() : x.dtype()](const Grads& g) {
           Tensor xv = sx.unpack();
           auto [gx, gw, gb] = kernels::layer_norm_backward(g[0], xv, normalized_shape, smean.unpack(), srstd.unpack(),
                                                            sw.unpack(), mask);
           return Grads{reduce_grad(gx, xv.sizes(), x_dt), reduce_grad(gw, normalized_shape, w_dt),
                        reduce_grad(gb, normalized_shape, b_dt)};
         });
  return out;
}

}  // namespace mg
