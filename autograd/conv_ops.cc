// conv2d, pooling and batch_norm: each forward calls kernels/nn_ops.h and records a node
// whose backward calls the matching *_backward kernel. Unbatched [C, H, W] inputs get a
// batch dim of 1 on the way in and lose it on the way out (both differentiable views).
#include "autograd/autocast_policy.h"
#include "autograd/conv_functions.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "kernels/ops.h"
#include "kernels/ops.h"

namespace mg {

using autograd::any_requires_grad;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;
using Grads = std::vector<Tensor>;

namespace {

SavedTensor save_if(bool cond, const Tensor& t, const char* op) { return cond ? SavedTensor(t, op) : SavedTensor(); }

// Runs `f` on a 4-D view of x: [C, H, W] is lifted to [1, C, H, W] and the result dropped back.
template <class F>
Tensor batched(const Tensor& x, const char* op, F f) {
  MG_CHECK(x.defined(), ValueError, op, ": input is an undefined tensor");
  MG_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, op, ": expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got ",
           shape_str(x.sizes()));
  if (x.dim() == 4) return f(x);
  return f(x.unsqueeze(0)).squeeze(0);
}

kernels::Pool2dArgs pool_args(Int2 kernel, std::optional<Int2> stride, Int2 padding, Int2 dilation, bool ceil_mode,
                              bool count_include_pad) {
  kernels::Pool2dArgs a;
  a.kernel = kernel;
  a.stride = stride.value_or(kernel);
  a.padding = padding;
  a.dilation = dilation;
  a.ceil_mode = ceil_mode;
  a.count_include_pad = count_include_pad;
  return a;
}

}  // namespace

// ---------------- convolution ----------------

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Int2 stride, Int2 padding, Int2 dilation,
              int64_t groups) {
  if (autocast::lower_needed({&x, &weight, &bias}))
    return conv2d(autocast::lower(x), autocast::lower(weight), autocast::lower(bias), stride, padding, dilation,
                  groups);
  const kernels::Conv2dArgs args{stride, padding, dilation, groups};
  return batched(x, "conv2d", [&](const Tensor& x4) {
    Tensor out = kernels::conv2d_forward(x4, weight, bias, args);
    if (!any_requires_grad({x4, weight, bias})) return out;
    const bool need_x = needs_grad(x4), need_w = needs_grad(weight), need_b = needs_grad(bias);
    // d/dx needs only the weight and d/dw only the input: save just what will be used.
    record("conv2d", {x4, weight, bias}, out,
           [need_x, need_w, need_b, args, sx = save_if(need_w, x4, "conv2d"), sw = save_if(need_x, weight, "conv2d"),
            xs = x4.sizes(), ws = weight.sizes()](const Grads& g) {
             Tensor gx, gw, gb;
             if (need_x) gx = kernels::conv2d_backward_input(g[0], sw.unpack(), xs, args);
             if (need_w) gw = kernels::conv2d_backward_weight(g[0], sx.unpack(), ws, args);
             if (need_b) gb = kernels::conv2d_backward_bias(g[0]);
             return Grads{gx, gw, gb};
           });
    return out;
  });
}

// ---------------- pooling ----------------

namespace {
std::pair<Tensor, Tensor> max_pool2d_impl(const Tensor& x, const kernels::Pool2dArgs& args, bool want_indices) {
  Tensor indices;
  Tensor out = batched(x, "max_pool2d", [&](const Tensor& x4) {
    const bool grad = any_requires_grad({x4});
    // Inference skips the indices altogether.
    auto [y, idx] = kernels::max_pool2d(x4, args, grad || want_indices);
    if (want_indices) indices = x.dim() == 3 ? raw::squeeze(idx, 0) : idx;
    if (grad)
      // The indices are the op's own (never handed out before this), so no version check.
      record("max_pool2d", {x4}, y, [idx = idx, xs = x4.sizes()](const Grads& g) {
        return Grads{kernels::max_pool2d_backward(g[0], idx, xs)};
      });
    return y;
  });
  return {out, indices};
}
}  // namespace

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, Int2 kernel_size, std::optional<Int2> stride,
                                                  Int2 padding, Int2 dilation, bool ceil_mode) {
  return max_pool2d_impl(x, pool_args(kernel_size, stride, padding, dilation, ceil_mode, true), true);
}

Tensor max_pool2d(const Tensor& x, Int2 kernel_size, std::optional<Int2> stride, Int2 padding, Int2 dilation,
                  bool ceil_mode) {
  return max_pool2d_impl(x, pool_args(kernel_size, stride, padding, dilation, ceil_mode, true), false).first;
}

Tensor avg_pool2d(const Tensor& x, Int2 kernel_size, std::optional<Int2> stride, Int2 padding, bool ceil_mode,
                  bool count_include_pad) {
  const kernels::Pool2dArgs args = pool_args(kernel_size, stride, padding, 1, ceil_mode, count_include_pad);
  return batched(x, "avg_pool2d", [&](const Tensor& x4) {
    Tensor y = kernels::avg_pool2d(x4, args);
    if (any_requires_grad({x4}))
      record("avg_pool2d", {x4}, y,
             [args, xs = x4.sizes()](const Grads& g) { return Grads{kernels::avg_pool2d_backward(g[0], xs, args)}; });
    return y;
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  return batched(x, "adaptive_avg_pool2d", [&](const Tensor& x4) {
    Tensor y = kernels::adaptive_avg_pool2d(x4, output_size);
    if (any_requires_grad({x4}))
      record("adaptive_avg_pool2d", {x4}, y,
             [xs = x4.sizes()](const Grads& g) { return Grads{kernels::adaptive_avg_pool2d_backward(g[0], xs)}; });
    return y;
  });
}

// ---------------- batch norm ----------------

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  // Autocast: a half-precision activation keeps its dtype on CUDA (the kernel accumulates the
  // statistics in f32; casting it up would store f32 activations); the CPU kernel is f32-only.
  const bool autocast_half =
      x.defined() && is_autocast_enabled(x.device().type) && (x.dtype() == DType::f16 || x.dtype() == DType::bf16);
  if (autocast_half && !x.is_cuda())
    return batch_norm(autocast::widen(x), running_mean, running_var, weight, bias, training, momentum, eps);
  if (autocast_half &&
      ((weight.defined() && weight.dtype() != x.dtype()) || (bias.defined() && bias.dtype() != x.dtype())))
    return batch_norm(x, running_mean, running_var, autocast::cached_cast(weight, x.dtype()),
                      autocast::cached_cast(bias, x.dtype()), training, momentum, eps);
  if (autocast_half && !training && running_mean.defined() && running_mean.dtype() != x.dtype())
    return batch_norm(x, kernels::cast(running_mean, x.dtype()), kernels::cast(running_var, x.dtype()), weight, bias,
                      false, momentum, eps);
  // Training under autocast: f32 running statistics, updated from the kernel's batch statistics.
  const bool wide_stats = autocast_half && running_mean.defined() && running_mean.dtype() != x.dtype();
  const bool grad = any_requires_grad({x, weight, bias});
  const bool need_x = needs_grad(x), need_w = needs_grad(weight), need_b = needs_grad(bias);
  if (training) {
    Tensor rm = running_mean.defined() ? running_mean.detach() : running_mean;
    Tensor rv = running_var.defined() ? running_var.detach() : running_var;
    auto [out, mean, invstd] = kernels::batch_norm_forward_training(x, weight, bias, wide_stats ? Tensor() : rm,
                                                                    wide_stats ? Tensor() : rv, momentum, eps);
    if (wide_stats) autocast::update_running_stats(rm, rv, mean, invstd, x.numel() / x.size(1), momentum, eps);
    if (grad)
      // mean/invstd are this op's own tensors: captured plainly, no version check needed.
      record("batch_norm", {x, weight, bias}, out,
             [need_x, need_w, need_b, sx = SavedTensor(x, "batch_norm"), sw = SavedTensor(weight, "batch_norm"),
              mean = mean, invstd = invstd](const Grads& g) {
               auto [gx, gw, gb] = kernels::batch_norm_backward(g[0], sx.unpack(), sw.unpack(), mean, invstd, true);
               return Grads{need_x ? gx : Tensor(), need_w ? gw : Tensor(), need_b ? gb : Tensor()};
             });
    return out;
  }
  Tensor out = kernels::batch_norm_forward_eval(x, weight, bias, running_mean, running_var, eps);
  if (grad)
    // Eval mode: the running statistics are constants of the function; saved with a version
    // check, since a training step before this backward would change them.
    record(
        "batch_norm", {x, weight, bias}, out,
        [need_x, need_w, need_b, eps, sx = SavedTensor(x, "batch_norm"), sw = SavedTensor(weight, "batch_norm"),
         srm = SavedTensor(running_mean, "batch_norm"), srv = SavedTensor(running_var, "batch_norm")](const Grads& g) {
          Tensor invstd = kernels::unary(kernels::Unary::Rsqrt, kernels::add_scalar(srv.unpack(), eps));
          auto [gx, gw, gb] = kernels::batch_norm_backward(g[0], sx.unpack(), sw.unpack(), srm.unpack(), invstd, false);
          return Grads{need_x ? gx : Tensor(), need_w ? gw : Tensor(), need_b ? gb : Tensor()};
        });
  return out;
}

}  // namespace mg
