// Checks, output shapes and dispatch for kernels/conv.h: im2col + Eigen GEMM in cpu/conv.cc,
// cuDNN in cuda/conv.cc (which takes a channels-last input as it is).
#include "kernels/conv.h"

#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace mg::kernels {

namespace {

// A conv operand as the backend takes it: the compute dtype, in its own layout on CUDA (a
// channels-last tensor passes as it is), NCHW on the CPU.
Tensor as_operand(const Tensor& t, DType ct, Device dev) { return prep(t, ct, device_format(t, dev)); }

void check_conv_args(const char* op, const Conv2dArgs& a) {
  MG_CHECK(a.stride.h >= 1 && a.stride.w >= 1, ValueError, op, ": stride must be positive, got ", str(a.stride));
  MG_CHECK(a.padding.h >= 0 && a.padding.w >= 0, ValueError, op, ": padding must be non-negative, got ",
           str(a.padding));
  MG_CHECK(a.dilation.h >= 1 && a.dilation.w >= 1, ValueError, op, ": dilation must be positive, got ",
           str(a.dilation));
  MG_CHECK(a.groups >= 1, ValueError, op, ": groups must be positive, got ", a.groups);
}

// Checks a conv's input/weight shapes and arguments; returns the output shape.
Shape conv_out_shape(const char* op, const Shape& x, const Shape& w, const Conv2dArgs& a) {
  check_conv_args(op, a);
  check_4d(op, x, "input");
  MG_CHECK(w.size() == 4, ShapeError, op, ": weight must be 4-D [out_channels, in_channels/groups, kH, kW], got ",
           shape_str(w));
  const int64_t C = x[1], O = w[0], G = a.groups;
  MG_CHECK(C % G == 0, ValueError, op, ": groups=", G, " must divide the input channels (", C, ")");
  MG_CHECK(O % G == 0, ValueError, op, ": groups=", G, " must divide the output channels (weight ", shape_str(w),
           " has ", O, ")");
  MG_CHECK(C == w[1] * G, ShapeError, op, ": input has ", C, " channels but weight expects ", w[1] * G, " (groups=", G,
           "); input ", shape_str(x), ", weight ", shape_str(w));
  MG_CHECK(w[2] >= 1 && w[3] >= 1 && O >= 1, ShapeError, op, ": weight ", shape_str(w), " has an empty dimension");
  const int64_t Ho = conv_output_size(x[2], w[2], a.stride.h, a.padding.h, a.dilation.h);
  const int64_t Wo = conv_output_size(x[3], w[3], a.stride.w, a.padding.w, a.dilation.w);
  MG_CHECK(Ho >= 1 && Wo >= 1, ShapeError, op, ": kernel ", hw(w[2], w[3]), " (dilation ", str(a.dilation),
           ", effective ", hw(a.dilation.h * (w[2] - 1) + 1, a.dilation.w * (w[3] - 1) + 1),
           ") is larger than the padded input ", hw(x[2] + 2 * a.padding.h, x[3] + 2 * a.padding.w), " (input ",
           hw(x[2], x[3]), ", padding ", str(a.padding), ")");
  return {x[0], O, Ho, Wo};
}

}  // namespace

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation, bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  if (span < 0) return -1;
  int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  // With ceil_mode the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// ---------------------------------------------------------------- convolution

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args) {
  const char* op = "conv2d";
  check_defined(op, x, "input");
  check_defined(op, w, "weight");
  const Device dev = common_device(op, {&x, &w, &bias});
  check_floating(op, x, "input");
  check_same_dtype(op, w, "weight", x);
  check_same_dtype(op, bias, "bias", x);
  const Shape os = conv_out_shape(op, x.sizes(), w.sizes(), args);
  if (bias.defined())
    MG_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), ShapeError, op, ": bias shape ", shape_str(bias.sizes()),
             " should be [", w.size(0), "]");
  const DType ct = compute_dtype(dev, x.dtype());
  Tensor out = empty(os, {ct, dev}, device_format(x, dev));
  backend(dev, "conv2d_forward")
      .conv2d_forward(as_operand(x, ct, dev), as_operand(w, ct, dev), prep(bias, ct), args, out);
  return finish(out, x.dtype());
}

namespace {

// Both conv backwards: Backend::conv2d_backward_input (operand = the weight, result = grad of
// the input) and Backend::conv2d_backward_weight (operand = the input, result = grad of the
// weight). grad_output must have the shape of the forward's output.
using ConvBackward = void (Backend::*)(const Tensor&, const Tensor&, const Conv2dArgs&, const Tensor&);
Tensor conv_backward(const char* op, ConvBackward run, const Tensor& grad_out, const Tensor& operand,
                     bool operand_is_weight, const Shape& result_shape, const Conv2dArgs& args) {
  const char* what = operand_is_weight ? "weight" : "input";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, operand, what);
  const Device dev = common_device(op, {&grad_out, &operand});
  check_floating(op, operand, what);
  check_grad_shape(op, grad_out,
                   operand_is_weight ? conv_out_shape(op, result_shape, operand.sizes(), args)
                                     : conv_out_shape(op, operand.sizes(), result_shape, args));
  const DType ct = compute_dtype(dev, operand.dtype());
  // grad_input follows grad_output's layout; grad_weight is NCHW, the module weight's layout.
  Tensor result =
      empty(result_shape, {ct, dev}, operand_is_weight ? device_format(grad_out, dev) : MemoryFormat::Contiguous);
  (backend(dev, op).*run)(as_operand(grad_out, ct, dev), as_operand(operand, ct, dev), args, result);
  return finish(result, operand.dtype());
}

}  // namespace

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Shape& x_shape, const Conv2dArgs& args) {
  return conv_backward("conv2d_backward_input", &Backend::conv2d_backward_input, grad_out, w,
                       /*operand_is_weight=*/true, x_shape, args);
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& w_shape, const Conv2dArgs& args) {
  return conv_backward("conv2d_backward_weight", &Backend::conv2d_backward_weight, grad_out, x,
                       /*operand_is_weight=*/false, w_shape, args);
}

Tensor conv2d_backward_bias(const Tensor& grad_out) {
  check_defined("conv2d_backward_bias", grad_out, "grad_output");
  check_4d("conv2d_backward_bias", grad_out.sizes(), "grad_output");
  return sum(grad_out, {0, 2, 3});
}

}  // namespace mg::kernels
