// conv2d: the forward calls kernels::conv2d_forward (cuDNN on CUDA, im2col on the CPU) and
// records a node whose backward calls kernels::conv2d_backward. Unbatched [C, H, W] inputs
// get a batch dim of 1 on the way in and lose it on the way out (differentiable views).
#include "autograd/conv_functions.h"
#include "autograd/op_support.h"

namespace mg {

namespace {
Tensor conv2d_math(const Tensor& x, const Tensor& weight, const Tensor& bias, Int2 stride, Int2 padding, Int2 dilation,
                   int64_t groups) {
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
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Int2 stride, Int2 padding, Int2 dilation,
              int64_t groups) {
  return around(policy::conv2d, conv2d_math, x, weight, bias, stride, padding, dilation, groups);
}

}  // namespace mg
