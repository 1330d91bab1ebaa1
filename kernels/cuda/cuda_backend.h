// The CUDA backend: kernels/backend.h implemented with our kernels, cuBLAS(Lt) and cuDNN, one
// file per op family; the declaration both backends share is kernels/backend_impl.h.
#pragma once

#include "kernels/backend_impl.h"
#include "kernels/optim_math.h"

namespace mg::kernels {

using CudaBackend = BackendImpl<DeviceType::CUDA>;

// kernels/cuda/fp8.cu: parameter p [R, C]'s Adam update (optim_math::adam_element with these
// scalars and the host's bias corrections; a nonzero *found_inf skips it) and the FP8 cast `c` of
// its new values (AdamTensors::fp8_casts) in one pass. False, launching nothing, where its tile
// kernel does not take the tensors (R or C not a multiple of 4, a list not 16-byte aligned, a
// 16-bit gradient, amsgrad): the caller then updates and casts apart.
bool adam_fp8_cast(const Tensor& p, const Tensor& g, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                   const optim_math::AdamScalars<float>& s, float step_size, float bc2_sqrt, const float* found_inf,
                   const Fp8WeightCast& c);

}  // namespace mg::kernels
