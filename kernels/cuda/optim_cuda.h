// CUDA multi-tensor optimizer kernels behind kernels/optim_ops.h (optim_multi_tensor.cu).
// optim_ops.cc has validated the lists: one device, contiguous f32, matching shapes.
#pragma once

#include <vector>

#include "kernels/optim_ops.h"

namespace mg::kernels::cuda {

void adam_multi_tensor(const AdamTensors& t, const AdamHyper& h);
// momentum_buffers is empty when there is no momentum.
void sgd_multi_tensor(const SGDTensors& t, const SGDHyper& h);
// Sum of |x|^p over all tensors (max |x| for p = inf), one device, f32 contiguous.
double multi_tensor_norm_partial(const std::vector<Tensor>& ts, double norm_type);
void multi_tensor_scale(const std::vector<Tensor>& ts, double scale);

}  // namespace mg::kernels::cuda
