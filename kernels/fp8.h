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
  Tensor amax;       // f32 [1]: max |x|
  Tensor scale;      // f32 [1]: fp8_math::scale_for(amax, format, margin)
  Tensor scale_inv;  // f32 [1]: 1 / scale, rounded once (what a GEMM of the codes multiplies by)
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

// A matrix cast for FP8 GEMMs. A GEMM of FP8 codes reads both operands along the reduced
// dimension (Hopper's "TN" form), so a linear layer needs x and w as they are for the forward and
// transposed for the two gradients: fp8_cast writes either or both in one pass.
struct Fp8Matrix {
  Tensor codes;        // u8 [R, C], the codes of x * scale (undefined unless asked)
  Tensor codes_t;      // u8 [C, R], the same codes transposed (undefined unless asked)
  Tensor scale_inv;    // f32 [1]: a code's value is decode(code) * scale_inv
  Tensor scale;        // f32 [1]: the scale the codes were made with (x * scale, rounded)
  Tensor column_sums;  // f32 [C]: x's column sums, from x's own values (undefined unless asked)
  Fp8Format format = Fp8Format::E4M3;
};
// What fp8_cast writes: the codes, their transpose, and x's column sums. A linear's backward asks
// for the sums with the output gradient's cast: they are its bias gradient, summed in the pass
// that reads the gradient for the codes instead of a reduction reading it again.
struct Fp8CastOutputs {
  bool rows = true;
  bool transposed = false;
  bool column_sums = false;
};
// What a cast casts: x's values, or gelu_tanh(x)'s (unary(GeluTanh)'s values, computed in the
// cast's passes): the FP8 MLP casts its hidden activation from the pre-activation its first GEMM
// wrote, so the activation is never written in the region's dtype and the GEMM needs no GELU
// epilogue. The amax, the column sums and the codes are all of the values cast.
enum class Fp8Of : uint8_t { X, GeluOfX };

// x [R, C] (f32, f16 or bf16) cast with current scaling: its amax, the scale, then the codes.
// Errors: DTypeError, ShapeError (not 2-D), ValueError (neither layout asked).
Fp8Matrix fp8_cast(const Tensor& x, Fp8Format format, Fp8CastOutputs outputs, int margin = 0, Fp8Of of = Fp8Of::X);
inline Fp8Matrix fp8_cast(const Tensor& x, Fp8Format format, bool rows, bool transposed, int margin = 0) {
  return fp8_cast(x, format, Fp8CastOutputs{rows, transposed, false}, margin);
}

// x [R, C] cast with a scale set before (`scale` and its `scale_inv`, f32 [1] on x's device, as
// an earlier cast's Fp8Matrix holds them): what a checkpoint region's replay casts with, so that
// its codes are its forward's whatever the histories did since. Errors as fp8_cast's, and
// ShapeError, DTypeError or DeviceError naming a scale that is not one f32 on x's device.
Fp8Matrix fp8_cast_scaled(const Tensor& x, Fp8Format format, Fp8CastOutputs outputs, const Tensor& scale,
                          const Tensor& scale_inv, Fp8Of of = Fp8Of::X);

// Delayed scaling: the scale of a cast comes from the largest amax of the same operand's previous
// kFp8HistoryLen casts (an operand: a linear layer's input, weight or output gradient across
// steps), and the cast takes its own amax for the casts after it in the pass that writes the codes:
// one pass over x where current scaling reads it twice (amax, then codes). A value beyond what
// the history expected saturates at the format's largest finite value, and the next casts' scale
// makes room for it. The first cast of a history has none: it is cast with current scaling, whose
// amax starts the history. The history lives on x's device; `casts` counts on the host, so a cast
// captured in a CUDA graph would replay one slot for ever: the recipe casts with current scaling
// while a graph is being captured.
inline constexpr int kFp8HistoryLen = 16;
inline constexpr int kFp8HistorySlots = kFp8HistoryLen + 2;  // and the cast in flight's, and the next one's
struct Fp8History {
  Tensor amax;        // f32 [kFp8HistorySlots], made at the first cast (fp8_math::history_max_bits)
  int64_t casts = 0;  // the casts made with this history
  int slot() const { return static_cast<int>(casts % kFp8HistorySlots); }  // the next cast's slot
};
// x [R, C] cast as fp8_cast casts it, with delayed scaling from `history` (which it updates).
// Errors as fp8_cast's. A history on another device than x's is copied to x's first.
Fp8Matrix fp8_cast_delayed(const Tensor& x, Fp8Format format, Fp8CastOutputs outputs, Fp8History& history,
                           int margin = 0, Fp8Of of = Fp8Of::X);
// The cast fp8_cast_delayed(x, format, {true, true, false}, history, margin) would make next, for a
// producer that writes it in a pass of its own (an optimizer's update: AdamTensors::fp8_casts):
// its codes, transpose and scales allocated on x's device and the history's next slot named,
// nothing written and the history not advanced (the caller counts the cast once it is taken).
// x [R, C]; the history must have had its first cast (which uses current scaling) and live on
// x's device. Errors: ShapeError (x not 2-D), ValueError (a history without casts, a negative
// margin), DeviceError.
Fp8WeightCast fp8_reserve_delayed(const Tensor& x, Fp8Format format, const Fp8History& history, int margin = 0);

// The FP8 MLP backward's cast of the gradient reaching GELU's input under delayed scaling: the
// codes of g * gelu_tanh'(pre) (binary(GeluTanhBackward)'s values; g and pre [R, C] of one shape
// and dtype, g not written), the derivative taken in the cast's pass: nothing writes it in bf16.
// Errors as fp8_cast_gelu_backward's.
Fp8Matrix fp8_cast_gelu_backward_delayed(const Tensor& g, const Tensor& pre, Fp8Format format, Fp8CastOutputs outputs,
                                         Fp8History& history, int margin = 0);

// The FP8 MLP backward's cast of the gradient reaching GELU's input: g (f32, f16 or bf16 [R, C],
// contiguous; the gradient at GELU's output, overwritten) becomes g * gelu_tanh'(pre), the values
// binary(GeluTanhBackward) gives, and is cast as fp8_cast casts it. On CUDA the derivative and
// the amax are one pass over g (fp8_cast would read it again for the amax). Errors as fp8_cast's,
// and DTypeError, ShapeError or DeviceError for a pre unlike g or a g that is not contiguous.
Fp8Matrix fp8_cast_gelu_backward(const Tensor& g, const Tensor& pre, Fp8Format format, Fp8CastOutputs outputs,
                                 int margin = 0);
inline Fp8Matrix fp8_cast_gelu_backward(const Tensor& g, const Tensor& pre, Fp8Format format, bool rows,
                                        bool transposed, int margin = 0) {
  return fp8_cast_gelu_backward(g, pre, format, Fp8CastOutputs{rows, transposed, false}, margin);
}

// out [M, N] in `dtype` (bf16, f16 or f32) = (decode(a) @ decode(b)^T) * a_inv * b_inv + bias
// for codes a [M, K] and b [N, K] (u8, formats fa and fb, not both E5M2), accumulated in f32 (on
// the device as `accum` says: kernels/types.h, Fp8Accum). The DGelu epilogue multiplies the
// result by gelu_tanh'(aux) (an [M, N] tensor of `dtype`), as the GELU-backward kernel after the
// GEMM. Where the backend has no FP8 GEMM for the operands (a device without FP8 tensor cores, a
// shape cuBLASLt refuses) the codes are decoded to f32 and multiplied there: the same values up
// to the f32 summation order.
// Errors: DTypeError, ShapeError, DeviceError naming the operand.
Tensor fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb, const Tensor& b_inv,
                const Tensor& bias, DType dtype, Fp8Epilogue epilogue = Fp8Epilogue::None, const Tensor& aux = Tensor(),
                Fp8Accum accum = Fp8Accum::Auto);
inline Tensor fp8_gemm(const Fp8Matrix& a, const Fp8Matrix& b, const Tensor& bias, DType dtype) {
  return fp8_gemm(a.codes, a.format, a.scale_inv, b.codes, b.format, b.scale_inv, bias, dtype);
}

}  // namespace mg::kernels
