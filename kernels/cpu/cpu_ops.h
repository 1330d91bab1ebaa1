// CPU kernels behind kernels/ops.h. ops.cc has already validated shapes, dtypes and
// devices and allocated the outputs; these only compute (into `out`).
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"

namespace mg::kernels::cpu {

// ---- elementwise (elementwise.cc) ----
// `a` and `out` have the same shape and dtype.
void unary(Unary op, const Tensor& a, const Tensor& out);
// `a`, `b` already broadcast (expanded views) to out's shape and cast to one dtype;
// out has that dtype, or b8 for comparisons. `out` may alias `a` (in-place ops).
void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& out);
void clamp(const Tensor& a, double lo, double hi, const Tensor& out);
// x has grad's dtype and shape.
void clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi, const Tensor& out);
// out = a*alpha + b*beta; a, b broadcast to out's shape with out's dtype (out may alias a).
void axpby(const Tensor& a, double alpha, const Tensor& b, double beta, const Tensor& out);
// cond is b8; cond, a, b broadcast to out's shape; a, b have out's dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);

// ---- reductions (reduce.cc) ----
// `out` has a's rank with size 1 on the reduced dims (keepdim shape).
void sum(const Tensor& a, const Tensor& out);  // out dtype: a's (floating) or i64
void mean(const Tensor& a, const Tensor& out);  // floating only
void var(const Tensor& a, int64_t correction, const Tensor& out);  // floating only
// values/indices have a's rank with size 1 at `dim`; a.size(dim) > 0.
void max_min(const Tensor& a, int64_t dim, bool is_max, const Tensor& values, const Tensor& indices);
void sum_squares(const Tensor& a, const Tensor& out);  // out: 0-dim f32 or f64
bool has_nonfinite(const Tensor& a);

// ---- linear algebra (linalg.cc); f64, f32, f16, bf16 ----
// out = alpha * op(a) @ op(b) + beta * out for 2-D tensors of one dtype (any strides).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha, double beta);
// [B, n, k] @ [B, k, m] -> out [B, n, m] (out contiguous).
void bmm(const Tensor& a, const Tensor& b, const Tensor& out);
// out [M, N] (contiguous) = x [M, K] @ w[N, K]^T + bias [N] (bias may be undefined).
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);

// ---- softmax family (softmax.cc); floating only, same dtype in and out ----
void softmax(const Tensor& a, int64_t dim, bool log, const Tensor& out);
void softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const Tensor& out);

// ---- indexing (index.cc); index tensors are i64 or i32 and are bounds-checked here ----
void one_hot(const Tensor& indices, int64_t num_classes, const Tensor& out);
void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out);
void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add);
void index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out);
void index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// out has target's shape; class dim of log_probs is 1 (0 for 1-D input).
void nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, const Tensor& out);

// ---- convolution, pooling, batch norm (conv.cc, pool.cc, norm.cc) ----
// Threads these kernels use: $MG_NUM_THREADS if set, else the hardware's (defined in conv.cc).
int nn_num_threads();
// Runs f(begin, end) over contiguous slices of [0, n) on up to nn_num_threads() threads,
// giving each at least `grain` items (one slice on the calling thread when n < 2 * grain).
void nn_parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f);
// nn_ops.cc has validated the arguments and made inputs contiguous NCHW, f32 or f64; outputs
// are allocated contiguous and fully overwritten.
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args, const Tensor& out);
void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Conv2dArgs& args, const Tensor& grad_x);
void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dArgs& args, const Tensor& grad_w);
void max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out, const Tensor& indices);  // indices may be undefined
void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x);
void avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out);
void avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x);
void adaptive_avg_pool2d(const Tensor& x, const Tensor& out);
void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x);
// x [N, C, S] viewed; weight/bias/running stats [C] of x's dtype (weight/bias/running may be
// undefined); save_mean/save_invstd [C] of x's dtype.
void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, double momentum, double eps, const Tensor& out,
                                 const Tensor& save_mean, const Tensor& save_invstd);
void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, double eps, const Tensor& out);
void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& invstd, bool training, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias);

}  // namespace mg::kernels::cpu
