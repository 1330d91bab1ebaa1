// Raw 2-D convolution forward and backward (input, weight, bias): checks, then im2col + GEMM on
// the CPU or cuDNN on CUDA.
#pragma once

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// Layout: every kernel here works on NCHW. A channels-last (NHWC-permuted) or otherwise
// strided input is accepted and made contiguous NCHW first; outputs are contiguous NCHW.
// CPU dtypes: f32 and f64 (f16/bf16 are computed in f32 and rounded back).

// ---- convolution ----
// x [N, C, H, W], w [O, C/groups, kH, kW], bias [O] or undefined -> [N, O, Ho, Wo] with
// Ho = (H + 2*pad - dil*(kH-1) - 1) / stride + 1.
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args);
// d loss / d x for grad_out [N, O, Ho, Wo]; x_shape is the forward input's shape.
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Shape& x_shape, const Conv2dArgs& args);
// d loss / d w for grad_out [N, O, Ho, Wo]; w_shape is the forward weight's shape.
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& w_shape, const Conv2dArgs& args);
// d loss / d bias: grad_out summed over N, H, W.
Tensor conv2d_backward_bias(const Tensor& grad_out);
// Output spatial size of a conv (or pool) along one dim, or -1 when the dilated kernel
// does not fit in the padded input.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                         bool ceil_mode = false);

}  // namespace mg::kernels
