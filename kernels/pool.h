// Raw 2-D pooling: max (with indices), average and adaptive average, forward and backward.
#pragma once

#include <utility>

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- pooling ----
// Layout: on CUDA a channels-last input gives a channels-last output (NHWC kernels, no
// transpose); each backward makes grad_input in `x_format`, the forward input's layout
// (suggest_memory_format; ignored on the CPU, whose kernels are NCHW).
// Max over each window -> (values [N, C, Ho, Wo], i64 indices into each H*W plane, like
// PyTorch's). NaN wins. Padding must be at most half the (dilated) kernel. Without
// return_indices the indices stay undefined (inference: no i64 tensor twice the output's size).
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dArgs& args, bool return_indices = true);
// Scatters grad_out back to the argmax positions (overlapping windows accumulate).
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& x_shape,
                           MemoryFormat x_format = MemoryFormat::Contiguous);
// Mean over each window; the divisor counts padding when count_include_pad (PyTorch rule).
Tensor avg_pool2d(const Tensor& x, const Pool2dArgs& args);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, const Pool2dArgs& args,
                           MemoryFormat x_format = MemoryFormat::Contiguous);
// Output [N, C, oh, ow]; window i spans [floor(i*H/oh), ceil((i+1)*H/oh)).
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape,
                                    MemoryFormat x_format = MemoryFormat::Contiguous);

}  // namespace mg::kernels
