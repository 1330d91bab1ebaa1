// FP8 tensors with per-tensor scaling: the pieces an FP8 GEMM's operands are made of. A tensor
// is stored as its u8 codes (kernels/fp8_math.h's e4m3 or e5m2) and one f32 scale in device
// memory; the value of code q is decode(q) / scale. The scale comes from the tensor's own amax
// ("current" scaling) and never goes through the host, so a captured step can hold it.
//
//   Fp8Scale s = kernels::fp8_current_scale(x, Fp8Format::E4M3);   // amax and scale, on x's device
//   Tensor q = kernels::fp8_quantize(x, s.scale, Fp8Format::E4M3);  // u8, x's shape
//   Tensor back = kernels::fp8_dequantize(q, s.scale, Fp8Format::E4M3, DType::f32);
#pragma once

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

struct Fp8Scale {
  Tensor amax;   // f32 [1]: max |x|
  Tensor scale;  // f32 [1]: fp8_math::scale_for(amax, format, margin)
};

// The amax of `x` (f32, f16 or bf16, any layout) and the scale that puts it at the format's
// largest finite value, 2^margin below it with a margin. Errors: DTypeError, ValueError (a
// negative margin).
Fp8Scale fp8_current_scale(const Tensor& x, Fp8Format format, int margin = 0);
// The codes of x * scale[0] (u8, x's shape), rounded to nearest even and saturating. `scale`: f32
// [1] on x's device. Errors: DTypeError, DeviceError, ShapeError naming the tensor.
Tensor fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format);
// decode(q) / scale[0] in `dtype` (f32, f16 or bf16), q's shape. Errors as fp8_quantize's.
Tensor fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, DType dtype = DType::f32);

}  // namespace mg::kernels
