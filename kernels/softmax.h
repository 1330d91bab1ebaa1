// Raw softmax and log_softmax over one dim, and their backward formulas.
#pragma once

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- softmax family (dim may be negative; computed in at least f32) ----
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// grad_in = y * (g - sum(g * y, dim))
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);
// grad_in = g - exp(y) * sum(g, dim)
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);

}  // namespace mg::kernels
