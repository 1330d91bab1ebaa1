// Differentiable convolution, pooling and batch normalization (PyTorch's F.conv2d,
// F.max_pool2d, ...): autograd/conv_ops.cc, pool_ops.cc and norm_ops.cc (batch norm).
#pragma once

#include <optional>
#include <utility>

#include "core/tensor.h"
#include "kernels/ops.h"  // mg::Int2

namespace mg {

// Inputs are NCHW [N, C, H, W] or unbatched [C, H, W]; a channels-last (NHWC-permuted)
// tensor is accepted and copied to contiguous NCHW first. Outputs are contiguous NCHW.

// weight [O, C/groups, kH, kW], bias [O] or undefined. groups == C (and O a multiple of C)
// is a depthwise convolution.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Int2 stride = 1, Int2 padding = 0,
              Int2 dilation = 1, int64_t groups = 1);

// stride defaults to kernel_size. Padding must be at most half the (dilated) kernel.
Tensor max_pool2d(const Tensor& x, Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                  Int2 dilation = 1, bool ceil_mode = false);
// Also returns the i64 argmax of each window as a flat index into its H*W plane.
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, Int2 kernel_size,
                                                  std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                                                  Int2 dilation = 1, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                  bool ceil_mode = false, bool count_include_pad = true);
// Output [N, C, output_size.h, output_size.w]; windows may overlap when sizes don't divide.
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);

// x [N, C, *]. training: normalize with the batch's statistics (biased variance) and, when
// running_mean/var are given, update them in place with `momentum` (unbiased variance);
// otherwise normalize with running_mean/var. weight/bias [C] may be undefined.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(...)) as one op: on CUDA with a channels-last input the ReLU runs inside the
// normalization pass and its gradient inside batch norm's backward passes (two fewer passes
// over the activation each way); elsewhere it runs as its own pass. Saves the output (the
// next layer's input, kept anyway) for the ReLU's gradient.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                       double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(x, ...) + residual) as one op, a residual block's output: on CUDA with
// channels-last inputs of one dtype the add and the ReLU run inside the normalization pass
// (rounded once); elsewhere as the ops one by one. The residual's gradient is the output's
// gradient masked by output > 0.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                           bool training = false, double momentum = 0.1, double eps = 1e-5);

}  // namespace mg
