// Raw (no autograd) convolution, pooling and batch-norm kernels: each checks its inputs
// (naming the op and the values), then dispatches to cpu/ (im2col + Eigen GEMM, loops).
#pragma once

#include <cstdint>
#include <tuple>
#include <utility>

#include "core/tensor.h"

namespace mg {

// A (height, width) pair. An integer means the same value for both, like PyTorch's _pair,
// so conv2d(x, w, b, /*stride=*/2) and conv2d(x, w, b, Int2{2, 1}) both read naturally.
struct Int2 {
  int64_t h = 0, w = 0;
  Int2() = default;
  Int2(int64_t v) : h(v), w(v) {}  // NOLINT(runtime/explicit): the int shorthand is the point
  Int2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  bool operator==(const Int2& o) const { return h == o.h && w == o.w; }
};

namespace kernels {

// Layout: every kernel here works on NCHW. A channels-last (NHWC-permuted) or otherwise
// strided input is accepted and made contiguous NCHW first; outputs are contiguous NCHW.
// CPU dtypes: f32 and f64 (f16/bf16 are computed in f32 and rounded back).

// ---- convolution ----
struct Conv2dArgs {
  Int2 stride{1}, padding{0}, dilation{1};
  int64_t groups = 1;
};
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

// ---- pooling ----
struct Pool2dArgs {
  Int2 kernel{1}, stride{1}, padding{0}, dilation{1};  // stride is already resolved (no "= kernel" default here)
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg_pool2d only
};
// Max over each window -> (values [N, C, Ho, Wo], i64 indices into each H*W plane, like
// PyTorch's). NaN wins. Padding must be at most half the (dilated) kernel. Without
// return_indices the indices stay undefined (inference: no i64 tensor twice the output's size).
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dArgs& args, bool return_indices = true);
// Scatters grad_out back to the argmax positions (overlapping windows accumulate).
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& x_shape);
// Mean over each window; the divisor counts padding when count_include_pad (PyTorch rule).
Tensor avg_pool2d(const Tensor& x, const Pool2dArgs& args);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape, const Pool2dArgs& args);
// Output [N, C, oh, ow]; window i spans [floor(i*H/oh), ceil((i+1)*H/oh)).
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& x_shape);

// ---- batch normalization (per channel = dim 1 of [N, C, *]; statistics in f64) ----
// Returns (out, save_mean [C], save_invstd [C]). When defined, running_mean/var [C] are
// updated in place: r = (1 - momentum) * r + momentum * batch_stat, with the unbiased
// variance (like PyTorch). weight/bias [C] may be undefined (no affine).
std::tuple<Tensor, Tensor, Tensor> batch_norm_forward_training(const Tensor& x, const Tensor& weight,
                                                               const Tensor& bias, const Tensor& running_mean,
                                                               const Tensor& running_var, double momentum,
                                                               double eps);
// Normalizes with the running statistics.
Tensor batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double eps);
// Returns (grad_x, grad_weight, grad_bias). training: mean/invstd are the batch's (save_*),
// and grad_x includes the statistics' dependence on x; eval: they are the running
// statistics' mean and 1/sqrt(var + eps), constants.
std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean, const Tensor& invstd, bool training);

}  // namespace kernels
}  // namespace mg
