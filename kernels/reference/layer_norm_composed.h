// Layer norm composed of generic kernels (mean, mul, rsqrt, ...): the plain reference the
// backends' fused layer-norm kernels are tested against. Test-only; not part of //kernels.
#pragma once

#include <array>
#include <tuple>

#include "core/tensor.h"

namespace mg::kernels {

// Same contract as kernels::layer_norm_forward / layer_norm_backward (kernels/norm.h).
std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_composed(const Tensor& x, const Shape& normalized_shape,
                                                               const Tensor& weight, const Tensor& bias, double eps);
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_composed(const Tensor& grad_out, const Tensor& x,
                                                                const Shape& normalized_shape, const Tensor& mean,
                                                                const Tensor& rstd, const Tensor& weight,
                                                                std::array<bool, 3> mask = {true, true, true});

}  // namespace mg::kernels
