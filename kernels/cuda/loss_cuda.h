// CUDA side of kernels/loss_ops.h (validated and allocated there).
#pragma once

#include "core/tensor.h"

namespace mg::kernels::cuda {

// logits contiguous [M, C], target i64 contiguous [M]; loss/lse [M] f32 (f64 for f64).
// Returns the first out-of-range target (or ignore_index when all are valid), read back once.
int64_t cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                              const Tensor& loss, const Tensor& lse);
void cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            int64_t ignore_index, double smoothing, const Tensor& grad);

}  // namespace mg::kernels::cuda
