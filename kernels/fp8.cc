// Checks and dispatch for kernels/fp8.h; the loops are in cpu/fp8.cc and cuda/fp8.cu.
#include "kernels/fp8.h"

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

namespace {

bool is_half_or_f32(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

void check_scale(const char* op, const Tensor& scale, Device dev, const char* name = "scale") {
  MG_CHECK(scale.defined() && scale.numel() == 1, ShapeError, op, ": ", name, " must be a one-element tensor, got ",
           scale.defined() ? shape_str(scale.sizes()) : std::string("an undefined tensor"));
  MG_CHECK(scale.dtype() == DType::f32, DTypeError, op, ": ", name, " must be f32, got ", scale.dtype());
  MG_CHECK(scale.device() == dev, DeviceError, op, ": ", name, " is on ", scale.device(), ", the tensor on ", dev);
}

}  // namespace

namespace {
Fp8Scale empty_scale(Device dev) {
  const TensorOptions f32(DType::f32, dev);
  return Fp8Scale{empty({1}, f32), empty({1}, f32), empty({1}, f32)};
}

void check_cast_input(const char* op, const char* name, const Tensor& x) {
  MG_CHECK(x.defined() && is_half_or_f32(x.dtype()), DTypeError, op, ": ", name, " must be f32, f16 or bf16, got ",
           x.defined() ? dtype_name(x.dtype()) : "an undefined tensor");
}

// What a cast of x [R, C] writes, allocated as `outputs` asks, with its scale_inv.
Fp8Matrix cast_outputs(const Tensor& xc, Fp8Format format, Fp8CastOutputs outputs, const Tensor& scale_inv) {
  Fp8Matrix m;
  m.format = format;
  m.scale_inv = scale_inv;
  const TensorOptions u8(DType::u8, xc.device());
  if (outputs.rows) m.codes = empty(xc.sizes(), u8);
  if (outputs.transposed) m.codes_t = empty({xc.size(1), xc.size(0)}, u8);
  if (outputs.column_sums) m.column_sums = empty({xc.size(1)}, TensorOptions(DType::f32, xc.device()));
  return m;
}

// The codes of a contiguous x [R, C] (of gelu_tanh(x) with `gelu`) whose scale s is set (or will
// be, in stream order).
Fp8Matrix codes_of(const char* op, const Tensor& xc, const Fp8Scale& s, Fp8Format format, Fp8CastOutputs outputs,
                   bool gelu = false) {
  Fp8Matrix m = cast_outputs(xc, format, outputs, s.scale_inv);
  m.scale = s.scale;
  backend(xc.device(), op).fp8_quantize_transpose(xc, gelu, s.scale, format, m.codes, m.codes_t, m.column_sums);
  return m;
}

// fp8_current_scale of a contiguous, checked x (of gelu_tanh(x) with `gelu`).
Fp8Scale current_scale(const char* op, const Tensor& xc, bool gelu, Fp8Format format, int margin) {
  MG_CHECK(margin >= 0, ValueError, op, ": margin must be >= 0, got ", margin);
  Fp8Scale s = empty_scale(xc.device());
  backend(xc.device(), op).fp8_amax_scale(xc, gelu, format, margin, s.amax, s.scale, s.scale_inv);
  return s;
}

// g and pre as the GELU-backward casts take them: one shape, dtype and device.
void check_gelu_pair(const char* op, const Tensor& g, const Tensor& pre) {
  check_cast_input(op, "g", g);
  MG_CHECK(g.dim() == 2, ShapeError, op, ": g must be 2-D, got ", shape_str(g.sizes()));
  MG_CHECK(pre.defined() && pre.dtype() == g.dtype(), DTypeError, op, ": pre must be ", dtype_name(g.dtype()),
           " as g is, got ", pre.defined() ? dtype_name(pre.dtype()) : "an undefined tensor");
  MG_CHECK(pre.sizes() == g.sizes(), ShapeError, op, ": pre ", shape_str(pre.sizes()), " and g ", shape_str(g.sizes()),
           " differ in shape");
  MG_CHECK(pre.device() == g.device(), DeviceError, op, ": pre is on ", pre.device(), ", g on ", g.device());
}
}  // namespace

Fp8Scale fp8_current_scale(const Tensor& x, Fp8Format format, int margin) {
  const char* op = "fp8_current_scale";
  check_cast_input(op, "x", x);
  return current_scale(op, raw::contiguous(x), false, format, margin);
}

Fp8Matrix fp8_cast(const Tensor& x, Fp8Format format, Fp8CastOutputs outputs, int margin, Fp8Of of) {
  const char* op = "fp8_cast";
  check_cast_input(op, "x", x);
  MG_CHECK(x.dim() == 2, ShapeError, op, ": x must be 2-D, got ", shape_str(x.sizes()));
  MG_CHECK(outputs.rows || outputs.transposed, ValueError, op, ": asked for neither the codes nor their transpose");
  const Tensor xc = raw::contiguous(x);
  const bool gelu = of == Fp8Of::GeluOfX;
  return codes_of(op, xc, current_scale(op, xc, gelu, format, margin), format, outputs, gelu);
}

Fp8Matrix fp8_cast_scaled(const Tensor& x, Fp8Format format, Fp8CastOutputs outputs, const Tensor& scale,
                          const Tensor& scale_inv, Fp8Of of) {
  const char* op = "fp8_cast_scaled";
  check_cast_input(op, "x", x);
  MG_CHECK(x.dim() == 2, ShapeError, op, ": x must be 2-D, got ", shape_str(x.sizes()));
  MG_CHECK(outputs.rows || outputs.transposed, ValueError, op, ": asked for neither the codes nor their transpose");
  check_scale(op, scale, x.device());
  check_scale(op, scale_inv, x.device(), "scale_inv");
  return codes_of(op, raw::contiguous(x), Fp8Scale{Tensor(), scale, scale_inv}, format, outputs, of == Fp8Of::GeluOfX);
}

namespace {
// fp8_cast_delayed of xc (contiguous, checked), of binary(GeluTanhBackward, xc, pre) where pre is
// defined, of unary(GeluTanh, xc) with `gelu`.
Fp8Matrix delayed_cast(const char* op, const Tensor& xc, const Tensor& pre, bool gelu, Fp8Format format,
                       Fp8CastOutputs outputs, Fp8History& history, int margin) {
  MG_CHECK(outputs.rows || outputs.transposed, ValueError, op, ": asked for neither the codes nor their transpose");
  MG_CHECK(margin >= 0, ValueError, op, ": margin must be >= 0, got ", margin);
  // Current scaling: for a cast of nothing (no amax to add) and a history's first cast, which
  // starts it with its amax.
  const auto current = [&](bool start_history) {
    const Tensor v = pre.defined() ? binary(Binary::GeluTanhBackward, xc, pre) : xc;
    const Fp8Scale s = current_scale(op, v, gelu, format, margin);
    if (start_history) {
      history.amax = zeros({kFp8HistorySlots}, TensorOptions(DType::f32, xc.device()));
      raw::copy_(raw::slice(history.amax, 0, 0, 1, 1), s.amax);
      history.casts = 1;
    }
    return codes_of(op, v, s, format, outputs, gelu);
  };
  if (xc.numel() == 0) return current(false);
  // A history on another device (a model moved, histories loaded where its masters live) follows x.
  if (history.amax.defined() && history.amax.device() != xc.device())
    history.amax = raw::to_device(history.amax, xc.device());
  if (history.amax.defined()) {
    MG_CHECK(history.amax.dtype() == DType::f32, DTypeError, op, ": the history must be f32, got ",
             dtype_name(history.amax.dtype()));
    MG_CHECK(history.amax.numel() == kFp8HistorySlots, ShapeError, op, ": the history must have ", kFp8HistorySlots,
             " slots, got ", shape_str(history.amax.sizes()));
  }
  if (history.casts == 0 || !history.amax.defined()) return current(true);
  const int slot = history.slot();
  const TensorOptions f32(DType::f32, xc.device());
  Fp8Matrix m = cast_outputs(xc, format, outputs, empty({1}, f32));
  m.scale = empty({1}, f32);
  backend(xc.device(), op)
      .fp8_quantize_transpose_delayed(xc, gelu, pre, history.amax, slot, format, margin, m.scale, m.scale_inv, m.codes,
                                      m.codes_t, m.column_sums);
  ++history.casts;
  return m;
}

}  // namespace

Fp8Matrix fp8_cast_delayed(const Tensor& x, Fp8Format format, Fp8CastOutputs outputs, Fp8History& history, int margin,
                           Fp8Of of) {
  const char* op = "fp8_cast_delayed";
  check_cast_input(op, "x", x);
  MG_CHECK(x.dim() == 2, ShapeError, op, ": x must be 2-D, got ", shape_str(x.sizes()));
  return delayed_cast(op, raw::contiguous(x), Tensor(), of == Fp8Of::GeluOfX, format, outputs, history, margin);
}

Fp8WeightCast fp8_reserve_delayed(const Tensor& x, Fp8Format format, const Fp8History& history, int margin) {
  const char* op = "fp8_reserve_delayed";
  MG_CHECK(x.defined() && x.dim() == 2, ShapeError, op, ": x must be 2-D, got ",
           x.defined() ? shape_str(x.sizes()) : std::string("an undefined tensor"));
  MG_CHECK(margin >= 0, ValueError, op, ": margin must be >= 0, got ", margin);
  MG_CHECK(history.casts > 0 && history.amax.defined(), ValueError, op,
           ": the history has no cast yet (its first cast uses current scaling)");
  MG_CHECK(history.amax.device() == x.device(), DeviceError, op, ": the history is on ", history.amax.device(),
           ", x on ", x.device());
  const TensorOptions f32(DType::f32, x.device());
  const Fp8Matrix m = cast_outputs(x, format, {true, true, false}, empty({1}, f32));
  Fp8WeightCast c;
  c.codes = m.codes;
  c.codes_t = m.codes_t;
  c.history = history.amax;
  c.scale = empty({1}, f32);
  c.scale_inv = m.scale_inv;
  c.slot = history.slot();
  c.format = format;
  c.margin = margin;
  return c;
}

Fp8Matrix fp8_cast_gelu_backward_delayed(const Tensor& g, const Tensor& pre, Fp8Format format, Fp8CastOutputs outputs,
                                         Fp8History& history, int margin) {
  const char* op = "fp8_cast_gelu_backward_delayed";
  check_gelu_pair(op, g, pre);
  return delayed_cast(op, raw::contiguous(g), raw::contiguous(pre), false, format, outputs, history, margin);
}

Fp8Matrix fp8_cast_gelu_backward(const Tensor& g, const Tensor& pre, Fp8Format format, Fp8CastOutputs outputs,
                                 int margin) {
  const char* op = "fp8_cast_gelu_backward";
  check_gelu_pair(op, g, pre);
  MG_CHECK(g.is_contiguous(), ShapeError, op, ": g must be a contiguous 2-D tensor (it is overwritten), got ",
           shape_str(g.sizes()), " (not contiguous)");
  MG_CHECK(outputs.rows || outputs.transposed, ValueError, op, ": asked for neither the codes nor their transpose");
  MG_CHECK(margin >= 0, ValueError, op, ": margin must be >= 0, got ", margin);
  Fp8Scale s = empty_scale(g.device());
  backend(g.device(), op)
      .fp8_gelu_backward_amax_scale(g, raw::contiguous(pre), format, margin, s.amax, s.scale, s.scale_inv);
  return codes_of(op, g, s, format, outputs);
}

namespace {
void check_codes(const char* op, const char* name, const Tensor& t, const Tensor& inv, Device dev) {
  MG_CHECK(t.defined() && t.dtype() == DType::u8, DTypeError, op, ": ", name, " must hold u8 codes, got ",
           t.defined() ? dtype_name(t.dtype()) : "an undefined tensor");
  MG_CHECK(t.dim() == 2, ShapeError, op, ": ", name, " must be 2-D, got ", shape_str(t.sizes()));
  MG_CHECK(t.device() == dev, DeviceError, op, ": ", name, " is on ", t.device(), ", a on ", dev);
  check_scale(op, inv, dev);
}

// The codes' values in f32: decode(code) * inv (the GEMM's fallback).
Tensor decoded(const Tensor& codes, Fp8Format f, const Tensor& inv) {
  // fp8_dequantize divides by its scale: 1 / inv is the scale again (the fallback's values can
  // differ from a GEMM's scaling of the product by an f32 rounding; the fallback is not the
  // reference, the CPU backend's fp8_gemm is).
  return fp8_dequantize(codes, unary(Unary::Reciprocal, inv), f, DType::f32);
}
}  // namespace

Tensor fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb, const Tensor& b_inv,
                const Tensor& bias, DType dtype, Fp8Epilogue epilogue, const Tensor& aux, Fp8Accum accum) {
  const char* op = "fp8_gemm";
  MG_CHECK(a.defined(), ValueError, op, ": a is undefined");
  const Device dev = a.device();
  check_codes(op, "a", a, a_inv, dev);
  check_codes(op, "b", b, b_inv, dev);
  MG_CHECK(a.size(1) == b.size(1), ShapeError, op, ": a ", shape_str(a.sizes()), " and b ", shape_str(b.sizes()),
           " differ in the reduced dimension (a [M, K] @ b [N, K]^T)");
  MG_CHECK(!(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2), ValueError, op,
           ": both operands are E5M2 (one must be E4M3, as Hopper's FP8 GEMMs take them)");
  MG_CHECK(is_half_or_f32(dtype), DTypeError, op, ": the result must be f32, f16 or bf16, got ", dtype_name(dtype));
  const int64_t m = a.size(0), n = b.size(0);
  if (bias.defined()) {
    MG_CHECK(bias.dtype() == dtype && bias.dim() == 1 && bias.size(0) == n && bias.device() == dev, ShapeError, op,
             ": bias must be [", n, "] of ", dtype_name(dtype), " on ", dev, ", got ", shape_str(bias.sizes()), " of ",
             dtype_name(bias.dtype()), " on ", bias.device());
    MG_CHECK(epilogue != Fp8Epilogue::DGelu, ValueError, op, ": the DGelu epilogue takes no bias");
  }
  if (epilogue != Fp8Epilogue::None)
    MG_CHECK(aux.defined() && aux.dtype() == dtype && aux.dim() == 2 && aux.size(0) == m && aux.size(1) == n &&
                 aux.is_contiguous() && aux.device() == dev,
             ShapeError, op, ": the epilogue's aux must be a contiguous [", m, ", ", n, "] tensor of ",
             dtype_name(dtype), " on ", dev);
  const Tensor ac = raw::contiguous(a), bc = raw::contiguous(b), bi = bias.defined() ? raw::contiguous(bias) : bias;
  Backend& be = backend(dev, op);
  Tensor out = empty({m, n}, TensorOptions(dtype, dev));
  // The plain GEMM, in f32 from the decoded codes where the backend has none.
  const bool fast = accum == Fp8Accum::Fast || (accum == Fp8Accum::Auto && fa == Fp8Format::E4M3 && fb == fa);
  if (!be.fp8_gemm(ac, fa, a_inv, bc, fb, b_inv, bi, out, fast)) {
    Tensor f = empty({m, n}, TensorOptions(DType::f32, dev));
    be.gemm(decoded(ac, fa, a_inv), false, decoded(bc, fb, b_inv), true, f, 1.0, 0.0);
    if (bi.defined()) f = add(f, raw::to_dtype(bi, DType::f32));
    raw::copy_(out, f);
  }
  // DGelu as the GELU-backward kernel after the GEMM: with FP8 operands cuBLASLt 13 ran its DGELU
  // epilogue as a generic kernel of its own, 555 us a call at GPT-2 XL's MLP on the H100 (26.6 ms
  // of a 192 ms step; bench/results/h100_fp8_recipe_casts_2026-12-06.log), several times this
  // elementwise kernel's cost.
  if (epilogue == Fp8Epilogue::DGelu) be.binary(Binary::GeluTanhBackward, out, aux, out);
  return out;
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
