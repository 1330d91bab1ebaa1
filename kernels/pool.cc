// Checks, output shapes and dispatch for kernels/pool.h; the loops are in cpu/pool.cc and
// cuda/pool.cu.
#include "kernels/pool.h"

#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

// ---------------------------------------------------------------- pooling

namespace {

// Checks pooling arguments against x and returns the output shape [N, C, Ho, Wo].
Shape pool_out_shape(const char* op, const Shape& x, const Pool2dArgs& a, bool dilated) {
  check_4d(op, x, "input");
  MG_CHECK(a.kernel.h >= 1 && a.kernel.w >= 1, ValueError, op, ": kernel_size must be positive, got ", str(a.kernel));
  MG_CHECK(a.stride.h >= 1 && a.stride.w >= 1, ValueError, op, ": stride must be positive, got ", str(a.stride));
  MG_CHECK(a.padding.h >= 0 && a.padding.w >= 0, ValueError, op, ": padding must be non-negative, got ",
           str(a.padding));
  MG_CHECK(a.dilation.h >= 1 && a.dilation.w >= 1, ValueError, op, ": dilation must be positive, got ",
           str(a.dilation));
  MG_CHECK(dilated || a.dilation == Int2(1), ValueError, op, ": dilation is not supported, got ", str(a.dilation));
  const int64_t eh = a.dilation.h * (a.kernel.h - 1) + 1, ew = a.dilation.w * (a.kernel.w - 1) + 1;
  // Otherwise a window could lie entirely in the padding.
  MG_CHECK(a.padding.h <= eh / 2 && a.padding.w <= ew / 2, ValueError, op, ": padding ", str(a.padding),
           " should be at most half of the (effective) kernel size ", hw(eh, ew));
  const int64_t Ho = conv_output_size(x[2], a.kernel.h, a.stride.h, a.padding.h, a.dilation.h, a.ceil_mode);
  const int64_t Wo = conv_output_size(x[3], a.kernel.w, a.stride.w, a.padding.w, a.dilation.w, a.ceil_mode);
  MG_CHECK(Ho >= 1 && Wo >= 1, ShapeError, op, ": kernel ", hw(eh, ew), " is larger than the padded input ",
           hw(x[2] + 2 * a.padding.h, x[3] + 2 * a.padding.w), " (input ", shape_str(x), ", padding ", str(a.padding),
           ")");
  return {x[0], x[1], Ho, Wo};
}

// The checks every single-tensor pool op starts with (`t` is the input or grad_output):
// defined and floating. Returns its device.
Device floating_device(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  const Device dev = common_device(op, {&t});
  check_floating(op, t, what);
  return dev;
}

// For the backwards whose output shape alone does not say the input's: both 4-D, equal in N, C.
void check_grad_matches_input_nc(const char* op, const Tensor& grad_out, const Shape& x_shape) {
  check_4d(op, x_shape, "input");
  check_4d(op, grad_out.sizes(), "grad_output");
  MG_CHECK(grad_out.size(0) == x_shape[0] && grad_out.size(1) == x_shape[1], ShapeError, op, ": grad_output ",
           shape_str(grad_out.sizes()), " does not match input ", shape_str(x_shape), " in N, C");
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dArgs& args, bool return_indices) {
  const char* op = "max_pool2d";
  const Device dev = floating_device(op, x, "input");
  const Shape os = pool_out_shape(op, x.sizes(), args, true);
  const DType ct = compute_dtype(dev, x.dtype());
  const MemoryFormat fmt = device_format(x, dev);
  Tensor out = empty(os, {ct, dev}, fmt), idx = return_indices ? empty(os, {DType::i64, dev}, fmt) : Tensor();
  backend(dev, "max_pool2d").max_pool2d(prep(x, ct, fmt), args, out, idx);
  return {finish(out, x.dtype()), idx};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& x_shape, MemoryFormat x_format) {
  const char* op = "max_pool2d_backward";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, indices, "indices");
  const Device dev = common_device(op, {&grad_out, &indices});
  check_floating(op, grad_out, "grad_output");
  MG_CHECK(indices.dtype() == DType::i64, DTypeError, op, ": indices must be i64, got ", indices.dtype());
  check_grad_matches_input_nc(op, grad_out, x_shape);
  MG_CHECK(indices.sizes() == grad_out.sizes(), ShapeError, op, ": indices shape ", shape_str(indices.sizes()),
           " differs from grad_output's ", shape_str(grad_out.sizes()));
  const DType ct = compute_dtype(dev, grad_out.dtype());
  const MemoryFormat fmt = device_format(x_format, dev);
  Tensor gx = empty(x_shape, {ct, dev}, fmt);
  backend(dev, "max_pool2d_backward").max_pool2d_backward(prep(grad_out, ct, fmt), prep(indices, DType::i64, fmt), gx);
  return finish(gx, grad_out.dtype());
}

Tensor avg_pool2d(const Tensor& x, const Pool2dArgs& args) {
  const char* op = "avg_pool2d";
  const Device dev = floating_device(op, x, "input");
  const Shape os = pool_out_shape(op, x.sizes(), args, false);
  const DType ct = compute_dtype(dev, x.dtype());
  const MemoryFormat fmt = device_format(x, dev);
  Tensor out = empty(os, {ct, dev}, fmt);
  backend(dev, "avg_pool2d").avg_pool2d(prep(x, ct, fmt), args, out);
  return finish(out, x.dtype());
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, const Pool2dArgs& args,
                           MemoryFormat x_format) {
  const char* op = "avg_pool2d_backward";
  const Device dev = floating_device(op, grad_out, "grad_output");
  check_grad_shape(op, grad_out, pool_out_shape(op, x_shape, args, false));
  const DType ct = compute_dtype(dev, grad_out.dtype());
  const MemoryFormat fmt = device_format(x_format, dev);
  Tensor gx = empty(x_shape, {ct, dev}, fmt);
  backend(dev, "avg_pool2d_backward").avg_pool2d_backward(prep(grad_out, ct, fmt), args, gx);
  return finish(gx, grad_out.dtype());
}

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  const char* op = "adaptive_avg_pool2d";
  const Device dev = floating_device(op, x, "input");
  check_4d(op, x.sizes(), "input");
  MG_CHECK(output_size.h >= 1 && output_size.w >= 1, ValueError, op, ": output_size must be positive, got ",
           str(output_size));
  MG_CHECK(x.size(2) >= 1 && x.size(3) >= 1, ShapeError, op, ": input ", shape_str(x.sizes()),
           " has an empty spatial dimension");
  const DType ct = compute_dtype(dev, x.dtype());
  const MemoryFormat fmt = device_format(x, dev);
  Tensor out = empty({x.size(0), x.size(1), output_size.h, output_size.w}, {ct, dev}, fmt);
  backend(dev, "adaptive_avg_pool2d").adaptive_avg_pool2d(prep(x, ct, fmt), out);
  return finish(out, x.dtype());
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, MemoryFormat x_format) {
  const char* op = "adaptive_avg_pool2d_backward";
  const Device dev = floating_device(op, grad_out, "grad_output");
  check_grad_matches_input_nc(op, grad_out, x_shape);
  const DType ct = compute_dtype(dev, grad_out.dtype());
  const MemoryFormat fmt = device_format(x_format, dev);
  Tensor gx = empty(x_shape, {ct, dev}, fmt);
  backend(dev, "adaptive_avg_pool2d_backward").adaptive_avg_pool2d_backward(prep(grad_out, ct, fmt), gx);
  return finish(gx, grad_out.dtype());
}

}  // namespace mg::kernels
