// What every autograd/<family>_ops.cc uses: the tape (record, SavedTensor), the kernels the
// forward and backward run on, and the policies applied around an op (op_policy.h). Included by those files only.
//
// A backward returns each input's gradient in whatever shape and dtype its math gives: the
// engine sums a broadcast gradient back to the input's shape and casts it to the input's dtype
// and device, once, for every op (engine.cc, conform).
#pragma once

#include <array>
#include <vector>

#include "autograd/autocast_policy.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "autograd/op_policy.h"
#include "kernels/ops.h"

namespace mg {

using autograd::any_requires_grad;
using autograd::around;
using autograd::as_is;
namespace policy = autograd::policy;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using Grads = std::vector<Tensor>;

// Saves `t` for backward only when `cond` holds (e.g. mul saves each input only if the other
// one needs a gradient, as PyTorch does).
inline SavedTensor save_if(bool cond, const Tensor& t, const char* op) {
  return cond ? SavedTensor(t, op) : SavedTensor();
}

// Runs `f` on a 4-D view of x: [C, H, W] is lifted to [1, C, H, W] and the result dropped back.
template <class F>
Tensor batched(const Tensor& x, const char* op, F f) {
  MG_CHECK(x.defined(), ValueError, op, ": input is an undefined tensor");
  MG_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op, ": expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got ",
           shape_str(x.sizes()));
  if (x.dim() == 4) return f(x);
  return f(x.unsqueeze(0)).squeeze(0);
}

// add_layer_norm's backward (norm_ops.cc), for an op that runs the stream's norm inside it (the
// FP8 recipe's norm and linear, fp8_linear.cc): the gradients of its five inputs (x, residual,
// weight, bias, residual_bias) from gy, the normalized output's, and gh, the sum's (either may be
// undefined; gh is only for a norm with a residual).
struct AddLayerNormBackward {
  std::array<bool, 5> mask{};  // which inputs need a gradient
  bool has_res = false;
  DType res_t = DType::f32, rb_t = DType::f32;  // the residual's and residual bias's dtypes
  Shape normalized_shape;
  SavedTensor sum, weight;  // the norm's input (the sum) and weight
  Tensor mean, rstd;
  Grads operator()(const Tensor& gy, const Tensor& gh) const;
};

}  // namespace mg
