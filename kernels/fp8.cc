// Checks and dispatch for kernels/fp8.h; the loops are in cpu/fp8.cc and cuda/fp8.cu.
#include "kernels/fp8.h"

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

namespace {

bool is_half_or_f32(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

void check_scale(const char* op, const Tensor& scale, Device dev) {
  MG_CHECK(scale.defined() && scale.numel() == 1, ShapeError, op, ": scale must be a one-element tensor, got ",
           scale.defined() ? shape_str(scale.sizes()) : std::string("an undefined tensor"));
  MG_CHECK(scale.dtype() == DType::f32, DTypeError, op, ": scale must be f32, got ", scale.dtype());
  MG_CHECK(scale.device() == dev, DeviceError, op, ": scale is on ", scale.device(), ", the tensor on ", dev);
}

}  // namespace

Fp8Scale fp8_current_scale(const Tensor& x, Fp8Format format, int margin) {
  const char* op = "fp8_current_scale";
  MG_CHECK(x.defined() && is_half_or_f32(x.dtype()), DTypeError, op, ": x must be f32, f16 or bf16, got ",
           x.defined() ? dtype_name(x.dtype()) : "an undefined tensor");
  MG_CHECK(margin >= 0, ValueError, op, ": margin must be >= 0, got ", margin);
  Fp8Scale s;
  s.amax = empty({1}, TensorOptions(DType::f32, x.device()));
  s.scale = empty({1}, TensorOptions(DType::f32, x.device()));
  backend(x.device(), op).fp8_amax_scale(raw::contiguous(x), format, margin, s.amax, s.scale);
  return s;
}

Tensor fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format) {
  const char* op = "fp8_quantize";
  MG_CHECK(x.defined() && is_half_or_f32(x.dtype()), DTypeError, op, ": x must be f32, f16 or bf16, got ",
           x.defined() ? dtype_name(x.dtype()) : "an undefined tensor");
  check_scale(op, scale, x.device());
  Tensor out = empty(x.sizes(), TensorOptions(DType::u8, x.device()));
  backend(x.device(), op).fp8_quantize(raw::contiguous(x), scale, format, out);
  return out;
}

Tensor fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, DType dtype) {
  const char* op = "fp8_dequantize";
  MG_CHECK(q.defined() && q.dtype() == DType::u8, DTypeError, op, ": q must hold u8 codes, got ",
           q.defined() ? dtype_name(q.dtype()) : "an undefined tensor");
  MG_CHECK(is_half_or_f32(dtype), DTypeError, op, ": the result must be f32, f16 or bf16, got ", dtype_name(dtype));
  check_scale(op, scale, q.device());
  Tensor out = empty(q.sizes(), TensorOptions(dtype, q.device()));
  backend(q.device(), op).fp8_dequantize(raw::contiguous(q), scale, format, out);
  return out;
}

}  // namespace mg::kernels
