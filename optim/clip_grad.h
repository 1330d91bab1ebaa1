// Gradient clipping with torch.nn.utils' names: clip_grad_norm_ (one fused multi-tensor norm
// and one fused scale on CUDA) and clip_grad_value_. Call between backward() and step().
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mg::optim {

// Treats the gradients of `params` (those that have one) as one vector, computes its
// norm_type-norm (+inf: max |g|), and if it exceeds max_norm scales every gradient in place
// by max_norm / (total_norm + 1e-6). Returns the total norm before clipping (0 without
// gradients), one device->host read per device.
// A non-finite total norm (an inf/NaN gradient) is never hidden: with error_if_nonfinite it
// raises mg::ValueError naming the norm and leaves the gradients untouched; without, it is
// returned and the gradients are scaled by the resulting coefficient like PyTorch does
// (which turns them into NaN/0), so the caller (or GradScaler) can see it and skip the step.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// clip_grad_norm_ for a captured step (CUDA graphs): the same clipping, bitwise, but the norm
// stays on the device: returned as a one-element f32 tensor there, nothing read back, so the
// call can run inside a capture (and the GradScaler's skip still sees a NaN norm through the
// NaN gradients it makes). Gradients: one device, f32, contiguous (the AMP master gradients);
// anything else is a ValueError/DeviceError/DTypeError naming it. Returns an undefined tensor
// when no parameter has a gradient.
Tensor clip_grad_norm_on_device_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// Clamps every gradient of `params` into [-clip_value, clip_value] in place.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace mg::optim
