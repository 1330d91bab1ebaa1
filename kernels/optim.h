// Multi-tensor optimizer kernels: Adam/AdamW and SGD updates, a total gradient norm and an
// in-place scale over lists of tensors, many tensors per CUDA launch (PyTorch's fused/foreach).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// True when `t` can go through the fused update: contiguous, f32 (or f64 on the CPU). The
// optimizers send every other parameter through their per-parameter path.
bool multi_tensor_supported(const Tensor& t);

// In-place updates with torch.optim.Adam/AdamW/SGD's rules (see optim/adam.h, optim/sgd.h).
// Every tensor must be on one device, contiguous, of one supported dtype, and the lists must
// have equal lengths and matching shapes: otherwise ValueError/DTypeError/DeviceError.
// Each parameter's version counter is bumped. Math is in the tensors' dtype.
void adam_multi_tensor_(const AdamTensors& t, const AdamHyper& h);
void sgd_multi_tensor_(const SGDTensors& t, const SGDHyper& h);

// The p-norm of all elements of all tensors taken together (norm_type = +inf: max |x|), the
// way clip_grad_norm_ defines it. Any floating dtype and layout; tensors may sit on several
// devices (one partial result per device, combined on the host). A non-finite element gives
// a non-finite result. On CUDA: one launch per 36 tensors, one device->host read per device.
double multi_tensor_norm(const std::vector<Tensor>& ts, double norm_type);

// ts[i] *= scale in place for every tensor (fused launches for f32 CUDA tensors).
void multi_tensor_scale_(const std::vector<Tensor>& ts, double scale);

}  // namespace mg::kernels
