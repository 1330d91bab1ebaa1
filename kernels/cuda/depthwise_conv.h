// Depthwise convolution over channels-last (NHWC) operands, memgrad's own kernels: cuDNN 9's
// fast NHWC depthwise kernels take f16 only, and not a strided input gradient; bf16 and f32 it
// runs through slow generic kernels (kernels/cuda/conv.cc's run_depthwise picks per call).
#pragma once

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels::cuda {

// Which operand a call writes: y (forward), x (the input's gradient, from y = grad_out) or w
// (the weight's gradient, from x and y = grad_out).
enum class DepthwiseDir { Fwd, BwdData, BwdFilter };

// Runs `dir` when the call is a depthwise convolution these kernels take: groups = C_in = C_out
// (one filter per channel), a 3x3 filter (any stride, padding, dilation), x and y channels-last
// and dense, w contiguous [C, 1, 3, 3], one dtype among f32, f16 and bf16. Accumulates in f32; the
// weight gradient's sums are deterministic (per-chunk partials added in a fixed order). False,
// having done nothing, otherwise (the caller runs cuDNN).
bool depthwise_conv_nhwc(DepthwiseDir dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dArgs& a);

}  // namespace mg::kernels::cuda
