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
// True when adam_multi_tensor_ takes f16/bf16 gradients for the f32 parameter `p` (widened as
// they are read, the same result as the gradients cast to f32 first): f32 parameters on the CPU.
bool adam_takes_16bit_grads(const Tensor& p);
// low = param rounded to nearest even in low's dtype (f16 or bf16): contiguous CPU tensors of one
// shape, param f32; over every core, vectorized. What a CPU update writes as a low copy, and
// memory::HostParams' casts outside one. Errors: ValueError naming both tensors.
void write_low_copy(const Tensor& param, const Tensor& low);

// In-place updates with torch.optim.Adam/AdamW/SGD's rules (see optim/adam.h, optim/sgd.h).
// Every tensor must be on one device, contiguous, of one supported dtype, and the lists must
// have equal lengths and matching shapes: otherwise ValueError/DTypeError/DeviceError.
// Each parameter's version counter is bumped. Math is in the tensors' dtype.
// With DeviceScalars (a capturable step, see kernels/types.h) the lr and the skip flag are read
// from device memory when the update runs, and Adam takes t.step_counts (incremented unless
// skipped) instead of t.steps: nothing is read back to the host, so the call can be captured
// into a CUDA graph. The bias corrections are then computed on the device in double, the same
// expression the host computes for t.steps.
void adam_multi_tensor_(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d = {});
// AdamW/Adam with 8-bit blockwise-quantized moments (t.exp_avg_absmax and t.exp_avg_sq_absmax
// set; see kernels/types.h): per block of 2048 elements, the moments are read back through the
// codes and their absmax, updated with the same per-element rule as adam_multi_tensor_ (the f32
// parameter takes the step from the updated, unrounded moments), and stored again against the
// block's new absmax, rounded to the nearest code value. f32 params and grads, no amsgrad; the
// same step counts, DeviceScalars and low copies as adam_multi_tensor_. One fused kernel per
// 24 tensors on CUDA.
void adam8bit_multi_tensor_(const AdamTensors& t, const AdamHyper& h, const DeviceScalars& d = {});
// The number of 2048-element blocks of an n-element 8-bit moment (its absmax tensor's length).
int64_t quant_blocks(int64_t n);
// The 256 code values of the 8-bit moments, ascending: signed for exp_avg, unsigned for exp_avg_sq.
const float* quant_code(bool is_signed);
void sgd_multi_tensor_(const SGDTensors& t, const SGDHyper& h, const DeviceScalars& d = {});

// The p-norm of all elements of all tensors taken together (norm_type = +inf: max |x|), the
// way clip_grad_norm_ defines it. Any floating dtype and layout; tensors may sit on several
// devices (one partial result per device, combined on the host). A non-finite element gives
// a non-finite result. On CUDA: one launch per 36 tensors, one device->host read per device.
double multi_tensor_norm(const std::vector<Tensor>& ts, double norm_type);

// clip_grad_norm_ without a host read (a captured step): the norm_type-norm of all of `ts`
// taken together is computed on their device, and every tensor is scaled in place by
// min(max_norm / (norm + 1e-6), 1) read from device memory. Returns the norm as a one-element
// f32 tensor on that device. Same arithmetic as multi_tensor_norm + multi_tensor_scale_ (a
// factor of 1 leaves values bitwise unchanged). Every tensor: one device, f32, contiguous
// (ValueError/DeviceError/DTypeError otherwise); `ts` not empty.
Tensor multi_tensor_clip_(const std::vector<Tensor>& ts, double max_norm, double norm_type);

// ts[i] *= scale in place for every tensor (fused launches for f32 CUDA tensors).
void multi_tensor_scale_(const std::vector<Tensor>& ts, double scale);

// dst[i] = src[i] cast to dst[i]'s dtype (the rounding of raw::copy_) for every pair: f32 sources
// to f16 or bf16, contiguous, of one device and shape pairwise (ValueError/DTypeError/DeviceError
// otherwise). On CUDA one launch per 36 tensors instead of one per tensor: autocast's weight casts.
void multi_tensor_cast_(const std::vector<Tensor>& src, const std::vector<Tensor>& dst);

}  // namespace mg::kernels
