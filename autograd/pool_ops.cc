// max_pool2d, avg_pool2d, adaptive_avg_pool2d: each forward calls kernels/pool.h and records a
// node whose backward calls the matching *_backward kernel.
#include "autograd/conv_functions.h"
#include "autograd/op_support.h"

namespace mg {

namespace {
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
      record("max_pool2d", {x4}, y, [idx = idx, xs = x4.sizes(), f = suggest_memory_format(x4)](const Grads& g) {
        return Grads{kernels::max_pool2d_backward(g[0], idx, xs, f)};
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
      record("avg_pool2d", {x4}, y, [args, xs = x4.sizes(), f = suggest_memory_format(x4)](const Grads& g) {
        return Grads{kernels::avg_pool2d_backward(g[0], xs, args, f)};
      });
    return y;
  });
}

Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size) {
  return batched(x, "adaptive_avg_pool2d", [&](const Tensor& x4) {
    Tensor y = kernels::adaptive_avg_pool2d(x4, output_size);
    if (any_requires_grad({x4}))
      record("adaptive_avg_pool2d", {x4}, y, [xs = x4.sizes(), f = suggest_memory_format(x4)](const Grads& g) {
        return Grads{kernels::adaptive_avg_pool2d_backward(g[0], xs, f)};
      });
    return y;
  });
}

}  // namespace mg
