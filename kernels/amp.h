// Mixed-precision kernels: the GradScaler's fused multi-tensor unscale + inf/NaN check (no
// host read of its own) and the stochastic-rounding update of pure-bf16 parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mg::kernels {

// For every tensor g in `grads`: g *= inv_scale in place, and found_inf[0] = 1 when any
// element of any g (before scaling) is inf or NaN; found_inf is left as it was otherwise, so
// one flag can gather several calls. found_inf: a one-element f32 tensor on the gradients'
// device. Gradients may be f32, f16, bf16 or f64, of any layout (a non-contiguous one goes
// through a contiguous copy). On CUDA one launch covers up to 64 tensors and nothing is read
// back to the host: the caller reads found_inf once per step. Bumps each gradient's version.
// Errors: DeviceError (a gradient elsewhere than found_inf), DTypeError (a non-floating
// gradient, a found_inf that is not f32), ShapeError (found_inf with numel != 1).
void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, double inv_scale);
// The same with the loss scale in device memory (`scale`: f32, one element, found_inf's device):
// each gradient is multiplied by 1 / scale[0] as read when the kernel runs (a captured step).
void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& scale);

// GradScaler.update on the device, nothing read back (torch._amp_update_scale_): with
// found_inf[0] != 0, scale *= backoff_factor, growth_tracker = 0 and skipped += 1; otherwise
// growth_tracker += 1 and on reaching growth_interval scale *= growth_factor (unless that is
// inf) and growth_tracker = 0. scale, found_inf: f32 [1]; growth_tracker, skipped: i64 [1]; one
// device. Errors: ValueError naming the tensor that does not fit.
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& skipped,
                       const Tensor& found_inf, double growth_factor, double backoff_factor, int64_t growth_interval);

// param += alpha * update for a bf16 `param`, computed in f32 and rounded to bf16
// stochastically (kernels/amp_math.h): updates far below bf16's resolution still move the
// parameter in expectation, where round-to-nearest would drop them. `update`: any floating
// dtype, param's shape and device. `seed` must differ between calls (the optimizer mixes
// its step count and the parameter's index); the same seed gives the same bits on CPU and
// CUDA. Bumps param's version. Errors: DTypeError, ShapeError, DeviceError.
void add_stochastic_bf16_(const Tensor& param, const Tensor& update, double alpha, uint64_t seed);

}  // namespace mg::kernels
