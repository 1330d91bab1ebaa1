// CUDA side of kernels/amp_ops.h (amp.cu): amp_ops.cc has validated the inputs (one device,
// contiguous tensors, floating dtypes) before calling these.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mg::kernels::cuda {

void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, float inv_scale);
void add_stochastic_bf16(const Tensor& param, const Tensor& update, float alpha, uint64_t seed);
void batch_norm_update_stats(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean,
                             const Tensor& invstd, double unbias, double momentum, double eps);

}  // namespace mg::kernels::cuda
