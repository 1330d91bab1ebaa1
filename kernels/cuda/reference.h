// Plain CUDA kernels kept as the references their fused versions are tested against
// (test-only; not part of the backend contract).
#pragma once

#include "core/tensor.h"

namespace mg::kernels::cuda {

// One thread per row; the contract of Backend::layer_norm_forward (kernels/backend.h).
void layer_norm_forward_reference(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& out, const Tensor& mean, const Tensor& rstd);

}  // namespace mg::kernels::cuda
