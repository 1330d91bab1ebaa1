// Validation and device dispatch for kernels/nn_ops.h (convolution, pooling, batch norm),
// the same pattern as ops.cc: check (naming the op and the values), decide shapes, make
// inputs contiguous NCHW, allocate, call the backend through MG_NN_KERNEL.
//
// The CUDA path (kernels/cuda/cuda_nn_ops.h: cuDNN convolutions, own pooling and batch-norm
// kernels) is compiled in with MG_WITH_CUDA_NN_OPS (next to MG_WITH_CUDA); without it a CUDA
// tensor gets a DeviceError before anything is allocated. CUDA convolutions take a
// channels-last input as it is (cuDNN then runs NHWC); outputs stay contiguous NCHW.
#include "kernels/nn_ops.h"

#include <cmath>
#include <initializer_list>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

#if defined(MG_WITH_CUDA) && defined(MG_WITH_CUDA_NN_OPS)
#include "kernels/cuda/cuda_nn_ops.h"
#define MG_NN_HAS_CUDA 1
#define MG_NN_KERNEL(DEV, FN, ...)                             \
  do {                                                         \
    if ((DEV).is_cuda()) ::mg::kernels::cuda::FN(__VA_ARGS__); \
    else ::mg::kernels::cpu::FN(__VA_ARGS__);                  \
  } while (0)
#else
#define MG_NN_HAS_CUDA 0
#define MG_NN_KERNEL(DEV, FN, ...)       \
  do {                                   \
    (void)(DEV);                         \
    ::mg::kernels::cpu::FN(__VA_ARGS__); \
  } while (0)
#endif

namespace mg::kernels {
namespace {

std::string str(Int2 v) { return v.h == v.w ? std::to_string(v.h) : "(" + std::to_string(v.h) + ", " + std::to_string(v.w) + ")"; }
std::string hw(int64_t h, int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }

// One device for every (defined) tensor, and kernels for it.
Device check_device(const char* op, std::initializer_list<const Tensor*> ts) {
  Device dev;
  bool first = true;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (first) {
      dev = t->device();
      first = false;
    } else {
      MG_CHECK(t->device() == dev, DeviceError, op, ": tensors on different devices ", dev, " and ", t->device());
    }
  }
  MG_CHECK(MG_NN_HAS_CUDA || !dev.is_cuda(), DeviceError, op, ": CUDA path not available yet (tensor on ", dev,
           "); move the tensors to the CPU with .cpu()");
  return dev;
}

void check_defined(const char* op, const Tensor& t, const char* what) {
  MG_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

void check_floating(const char* op, const Tensor& t, const char* what) {
  MG_CHECK(is_floating(t.dtype()), DTypeError, op, ": ", what, " must be floating (f32 or f64), got ", t.dtype());
}

void check_same_dtype(const char* op, const Tensor& t, const char* what, const Tensor& x) {
  if (!t.defined()) return;
  MG_CHECK(t.dtype() == x.dtype(), DTypeError, op, ": ", what, " dtype ", t.dtype(), " differs from the input's ",
           x.dtype());
}

void check_4d(const char* op, const Shape& s, const char* what) {
  MG_CHECK(s.size() == 4, ShapeError, op, ": expected a 4-D ", what, " [N, C, H, W], got shape ", shape_str(s));
}

// The dtype the backend computes in: CPU kernels are f32/f64, half types go through f32.
DType compute_dtype(Device dev, DType t) { return dev.is_cpu() && (t == DType::f16 || t == DType::bf16) ? DType::f32 : t; }

// Contiguous (NCHW for channels-last inputs) in the compute dtype; undefined stays undefined.
Tensor prep(const Tensor& t, DType ct) {
  if (!t.defined()) return t;
  Tensor c = t.dtype() == ct ? t : raw::to_dtype(t, ct);
  return c.is_contiguous() ? c : raw::contiguous(c);
}
// prep() for a convolution operand: on CUDA a channels-last (NHWC-strided) tensor is
// passed through, the CUDA kernel reads it in place.
Tensor prep_conv(const Tensor& t, DType ct, Device dev) {
  if (dev.is_cuda() && t.defined() && t.dtype() == ct && t.dim() == 4 && !t.is_contiguous()) {
    const Shape& s = t.sizes();
    const int64_t want[4] = {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
    bool nhwc = true;
    for (int d = 0; d < 4; ++d) nhwc &= s[d] == 1 || t.stride(d) == want[d];
    if (nhwc) return t;
  }
  return prep(t, ct);
}
Tensor finish(const Tensor& t, DType want) { return t.dtype() == want ? t : raw::to_dtype(t, want); }

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
  MG_CHECK(C == w[1] * G, ShapeError, op, ": input has ", C, " channels but weight expects ", w[1] * G,
           " (groups=", G, "); input ", shape_str(x), ", weight ", shape_str(w));
  MG_CHECK(w[2] >= 1 && w[3] >= 1 && O >= 1, ShapeError, op, ": weight ", shape_str(w), " has an empty dimension");
  const int64_t Ho = conv_output_size(x[2], w[2], a.stride.h, a.padding.h, a.dilation.h);
  const int64_t Wo = conv_output_size(x[3], w[3], a.stride.w, a.padding.w, a.dilation.w);
  MG_CHECK(Ho >= 1 && Wo >= 1, ShapeError, op, ": kernel ", hw(w[2], w[3]), " (dilation ", str(a.dilation),
           ", effective ", hw(a.dilation.h * (w[2] - 1) + 1, a.dilation.w * (w[3] - 1) + 1),
           ") is larger than the padded input ", hw(x[2] + 2 * a.padding.h, x[3] + 2 * a.padding.w), " (input ",
           hw(x[2], x[3]), ", padding ", str(a.padding), ")");
  return {x[0], O, Ho, Wo};
}

void check_grad_shape(const char* op, const Tensor& grad, const Shape& want) {
  MG_CHECK(grad.sizes() == want, ShapeError, op, ": grad_output shape ", shape_str(grad.sizes()), " should be ",
           shape_str(want));
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
  const Device dev = check_device(op, {&x, &w, &bias});
  check_floating(op, x, "input");
  check_same_dtype(op, w, "weight", x);
  check_same_dtype(op, bias, "bias", x);
  const Shape os = conv_out_shape(op, x.sizes(), w.sizes(), args);
  if (bias.defined())
    MG_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), ShapeError, op, ": bias shape ", shape_str(bias.sizes()),
             " should be [", w.size(0), "]");
  const DType ct = compute_dtype(dev, x.dtype());
  Tensor out = empty(os, {ct, dev});
  MG_NN_KERNEL(dev, conv2d_forward, prep_conv(x, ct, dev), prep_conv(w, ct, dev), prep(bias, ct), args, out);
  return finish(out, x.dtype());
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Shape& x_shape, const Conv2dArgs& args) {
  const char* op = "conv2d_backward_input";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, w, "weight");
  const Device dev = check_device(op, {&grad_out, &w});
  check_floating(op, w, "weight");
  check_grad_shape(op, grad_out, conv_out_shape(op, x_shape, w.sizes(), args));
  const DType ct = compute_dtype(dev, w.dtype());
  Tensor gx = empty(x_shape, {ct, dev});
  MG_NN_KERNEL(dev, conv2d_backward_input, prep_conv(grad_out, ct, dev), prep_conv(w, ct, dev), args, gx);
  return finish(gx, w.dtype());
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& w_shape, const Conv2dArgs& args) {
  const char* op = "conv2d_backward_weight";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, x, "input");
  const Device dev = check_device(op, {&grad_out, &x});
  check_floating(op, x, "input");
  check_grad_shape(op, grad_out, conv_out_shape(op, x.sizes(), w_shape, args));
  const DType ct = compute_dtype(dev, x.dtype());
  Tensor gw = empty(w_shape, {ct, dev});
  MG_NN_KERNEL(dev, conv2d_backward_weight, prep_conv(grad_out, ct, dev), prep_conv(x, ct, dev), args, gw);
  return finish(gw, x.dtype());
}

Tensor conv2d_backward_bias(const Tensor& grad_out) {
  check_defined("conv2d_backward_bias", grad_out, "grad_output");
  check_4d("conv2d_backward_bias", grad_out.sizes(), "grad_output");
  return sum(grad_out, {0, 2, 3});
}

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
           hw(x[2] + 2 * a.padding.h, x[3] + 2 * a.padding.w), " (input ", shape_str(x), ", padding ",
           str(a.padding), ")");
  return {x[0], x[1], Ho, Wo};
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dArgs& args, bool return_indices) {
  const char* op = "max_pool2d";
  check_defined(op, x, "input");
  const Device dev = check_device(op, {&x});
  check_floating(op, x, "input");
  const Shape os = pool_out_shape(op, x.sizes(), args, true);
  const DType ct = compute_dtype(dev, x.dtype());
  Tensor out = empty(os, {ct, dev}), idx = return_indices ? empty(os, {DType::i64, dev}) : Tensor();
  MG_NN_KERNEL(dev, max_pool2d, prep(x, ct), args, out, idx);
  return {finish(out, x.dtype()), idx};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& x_shape) {
  const char* op = "max_pool2d_backward";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, indices, "indices");
  const Device dev = check_device(op, {&grad_out, &indices});
  check_floating(op, grad_out, "grad_output");
  MG_CHECK(indices.dtype() == DType::i64, DTypeError, op, ": indices must be i64, got ", indices.dtype());
  check_4d(op, x_shape, "input");
  check_4d(op, grad_out.sizes(), "grad_output");
  MG_CHECK(indices.sizes() == grad_out.sizes(), ShapeError, op, ": indices shape ", shape_str(indices.sizes()),
           " differs from grad_output's ", shape_str(grad_out.sizes()));
  MG_CHECK(grad_out.size(0) == x_shape[0] && grad_out.size(1) == x_shape[1], ShapeError, op, ": grad_output ",
           shape_str(grad_out.sizes()), " does not match input ", shape_str(x_shape), " in N, C");
  const DType ct = compute_dtype(dev, grad_out.dtype());
  Tensor gx = empty(x_shape, {ct, dev});
  MG_NN_KERNEL(dev, max_pool2d_backward, prep(grad_out, ct), prep(indices, DType::i64), gx);
  return finish(gx, grad_out.dtype());
}

Tensor avg_pool2d(const Tensor& x, const Pool2dArgs& args) {
  const char* op = "avg_pool2d";
  check_defined(op, x, "input");
  const Device dev = check_device(op, {&x});
  check_floating(op, x, "input");
  const Shape os = pool_out_shape(op, x.sizes(), args, false);
  const DType ct = compute_dtype(dev, x.dtype());
  Tensor out = empty(os, {ct, dev});
  MG_NN_KERNEL(dev, avg_pool2d, prep(x, ct), args, out);
  return finish(out, x.dtype());
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, const Pool2dArgs& args) {
  const char* op = "avg_pool2d_backward";
  check_defined(op, grad_out, "grad_output");
  const Device dev = check_device(op, {&grad_out});
  check_floating(op, grad_out, "grad_output");
  check_grad_shape(op, grad_out, pool_out_shape(op, x_shape, args, false));
  const DType ct = compute_dtype(dev, grad_out.dtype());
  Tensor gx = empty(x_shape, {ct, dev});
  MG_NN_KERNEL(dev, avg_pool2d_backward, prep(grad_out, ct), args, gx);
  return finish(gx, grad_out.dtype());
}

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_defined(op, x, "input");
  const Device dev = check_device(op, {&x});
  check_floating(op, x, "input");
  check_4d(op, x.sizes(), "input");
  MG_CHECK(output_size.h >= 1 && output_size.w >= 1, ValueError, op, ": output_size must be positive, got ",
           str(output_size));
  MG_CHECK(x.size(2) >= 1 && x.size(3) >= 1, ShapeError, op, ": input ", shape_str(x.sizes()),
           " has an empty spatial dimension");
  const DType ct = compute_dtype(dev, x.dtype());
  Tensor out = empty({x.size(0), x.size(1), output_size.h, output_size.w}, {ct, dev});
  MG_NN_KERNEL(dev, adaptive_avg_pool2d, prep(x, ct), out);
  return finish(out, x.dtype());
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape) {
  const char* op = "adaptive_avg_pool2d_backward";
  check_defined(op, grad_out, "grad_output");
  const Device dev = check_device(op, {&grad_out});
  check_floating(op, grad_out, "grad_output");
  check_4d(op, x_shape, "input");
  check_4d(op, grad_out.sizes(), "grad_output");
  MG_CHECK(grad_out.size(0) == x_shape[0] && grad_out.size(1) == x_shape[1], ShapeError, op, ": grad_output ",
           shape_str(grad_out.sizes()), " does not match input ", shape_str(x_shape), " in N, C");
  const DType ct = compute_dtype(dev, grad_out.dtype());
  Tensor gx = empty(x_shape, {ct, dev});
  MG_NN_KERNEL(dev, adaptive_avg_pool2d_backward, prep(grad_out, ct), gx);
  return finish(gx, grad_out.dtype());
}

// ---------------------------------------------------------------- batch norm

namespace {

// x [N, C, *] floating f32/f64; every defined per-channel tensor [C] of x's dtype.
int64_t check_batch_norm(const char* op, const Tensor& x, std::initializer_list<std::pair<const Tensor*, const char*>> cs) {
  check_defined(op, x, "input");
  check_floating(op, x, "input");
  MG_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64 || x.is_cuda(), DTypeError, op,
           ": the CPU kernel supports f32 and f64 inputs, got ", x.dtype());
  MG_CHECK(x.dim() >= 2, ShapeError, op, ": expected an input of shape [N, C, *] (at least 2-D), got ",
           shape_str(x.sizes()));
  const int64_t C = x.size(1);
  for (auto& [t, what] : cs) {
    if (!t->defined()) continue;
    check_same_dtype(op, *t, what, x);
    MG_CHECK(t->dim() == 1 && t->size(0) == C, ShapeError, op, ": ", what, " shape ", shape_str(t->sizes()),
             " should be [", C, "] (the input ", shape_str(x.sizes()), " has ", C, " channels)");
  }
  return C;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> batch_norm_forward_training(const Tensor& x, const Tensor& weight,
                                                               const Tensor& bias, const Tensor& running_mean,
                                                               const Tensor& running_var, double momentum,
                                                               double eps) {
  const char* op = "batch_norm";
  const Device dev = check_device(op, {&x, &weight, &bias, &running_mean, &running_var});
  const int64_t C = check_batch_norm(op, x, {{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"},
                                             {&running_var, "running_var"}});
  MG_CHECK(running_mean.defined() == running_var.defined(), ValueError, op,
           ": running_mean and running_var must be both given or both undefined");
  MG_CHECK(std::isfinite(momentum) && eps >= 0 && std::isfinite(eps), ValueError, op,
           ": momentum must be finite and eps non-negative, got momentum ", momentum, ", eps ", eps);
  MG_CHECK(x.numel() / std::max<int64_t>(C, 1) > 1, ValueError, op,
           ": expected more than 1 value per channel when training, got input of shape ", shape_str(x.sizes()));
  Tensor out = empty(x.sizes(), {x.dtype(), dev});
  Tensor mean = empty({C}, {x.dtype(), dev}), invstd = empty({C}, {x.dtype(), dev});
  // Running statistics are written in place; a strided one goes through a contiguous copy.
  Tensor rm = prep(running_mean, x.dtype()), rv = prep(running_var, x.dtype());
  MG_NN_KERNEL(dev, batch_norm_forward_training, prep(x, x.dtype()), prep(weight, x.dtype()), prep(bias, x.dtype()),
               rm, rv, momentum, eps, out, mean, invstd);
  if (running_mean.defined()) {
    if (!rm.is_same(running_mean)) raw::copy_(running_mean, rm);
    if (!rv.is_same(running_var)) raw::copy_(running_var, rv);
    running_mean.bump_version();
    running_var.bump_version();
  }
  return {out, mean, invstd};
}

Tensor batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double eps) {
  const char* op = "batch_norm";
  const Device dev = check_device(op, {&x, &weight, &bias, &running_mean, &running_var});
  check_batch_norm(op, x, {{&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"},
                           {&running_var, "running_var"}});
  MG_CHECK(running_mean.defined() && running_var.defined(), ValueError, op,
           ": running_mean and running_var are required when not training (eval mode)");
  MG_CHECK(eps >= 0 && std::isfinite(eps), ValueError, op, ": eps must be non-negative, got ", eps);
  Tensor out = empty(x.sizes(), {x.dtype(), dev});
  MG_NN_KERNEL(dev, batch_norm_forward_eval, prep(x, x.dtype()), prep(weight, x.dtype()), prep(bias, x.dtype()),
               prep(running_mean, x.dtype()), prep(running_var, x.dtype()), eps, out);
  return out;
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean, const Tensor& invstd, bool training) {
  const char* op = "batch_norm_backward";
  check_defined(op, grad_out, "grad_output");
  check_defined(op, mean, "mean");
  check_defined(op, invstd, "invstd");
  const Device dev = check_device(op, {&grad_out, &x, &weight, &mean, &invstd});
  const int64_t C = check_batch_norm(op, x, {{&weight, "weight"}, {&mean, "mean"}, {&invstd, "invstd"}});
  MG_CHECK(grad_out.sizes() == x.sizes(), ShapeError, op, ": grad_output shape ", shape_str(grad_out.sizes()),
           " should be the input's ", shape_str(x.sizes()));
  Tensor gx = empty(x.sizes(), {x.dtype(), dev});
  Tensor gw = empty({C}, {x.dtype(), dev}), gb = empty({C}, {x.dtype(), dev});
  MG_NN_KERNEL(dev, batch_norm_backward, prep(grad_out, x.dtype()), prep(x, x.dtype()), prep(weight, x.dtype()),
               prep(mean, x.dtype()), prep(invstd, x.dtype()), training, gx, gw, gb);
  return {gx, gw, gb};
}

}  // namespace mg::kernels
