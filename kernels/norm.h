// Raw normalization layers: layer norm over trailing dims and batch norm per channel, forward
// and backward, with the statistics in f32 (f64 for f64 inputs).
#pragma once

#include <array>
#include <tuple>

#include "core/tensor.h"
#include "kernels/fp8.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- layer normalization ----
// Statistics dtype: f64 for f64 input, f32 otherwise (f16/bf16 accumulate in f32).
DType layer_norm_stats_dtype(DType x);

// Normalizes x over its trailing dims `normalized_shape` (which must match x's last dims):
// out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps), biased variance.
// weight/bias have normalized_shape or are undefined. Returns (out [x's shape, x's dtype],
// mean, rstd) with mean/rstd shaped x.shape[:-k] + [1] * k (PyTorch's shape) in
// layer_norm_stats_dtype.
std::tuple<Tensor, Tensor, Tensor> layer_norm_forward(const Tensor& x, const Shape& normalized_shape,
                                                      const Tensor& weight, const Tensor& bias, double eps);

// Returns (grad_x, grad_weight, grad_bias), all in x's dtype; an entry is undefined when its
// mask bit is false. mean/rstd are layer_norm_forward's; weight may be undefined (no affine).
//   xhat = (x - mean) * rstd,  g = grad_out * weight
//   grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))   (means over the normalized dims)
//   grad_weight = sum over rows of grad_out * xhat,  grad_bias = sum over rows of grad_out
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad_out, const Tensor& x,
                                                       const Shape& normalized_shape, const Tensor& mean,
                                                       const Tensor& rstd, const Tensor& weight,
                                                       std::array<bool, 3> mask = {true, true, true});

// ---- residual add + layer norm (pre-LN transformer blocks) ----
// sum = (x + residual) + residual_bias and out = layer_norm(sum) written in out_dtype, so that
// the residual stream's add, the branch's bias, the norm and the cast to a half-precision
// consumer are one pass over the rows on CUDA (f32 x, weight, bias and residual_bias; f32/f16/
// bf16 residual and out); elsewhere the same is composed from add, layer_norm_forward and cast.
// residual may be undefined (sum is x then); residual_bias (normalized_shape, the bias of the
// Linear whose output is residual, left out of that Linear) needs a residual. sum has x's dtype
// and shape; returns (sum, out, mean, rstd).
std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_forward(const Tensor& x, const Tensor& residual,
                                                                  const Shape& normalized_shape, const Tensor& weight,
                                                                  const Tensor& bias, double eps, DType out_dtype,
                                                                  const Tensor& residual_bias = Tensor());
// add_layer_norm_forward for a norm whose output only the FP8 linear after it reads (the FP8
// recipe's pre-norm linears): out is not returned but cast for that linear's GEMM under delayed
// scaling, fp8_cast_delayed(out as [rows, n], format, outputs, history, margin) of out's values
// in out_dtype, the same codes, scales and history bit for bit. Where the backend fuses the two
// (CUDA: f32 x, weight, bias and residual_bias, a 1-D normalized_shape, a history past its first
// cast on x's device) the normalized rows are never written in out_dtype: the cast's read of
// them and the norm's write go. Returns (sum, mean, rstd) as add_layer_norm_forward does, and the
// cast. Errors as the two calls'.
struct Fp8NormCast {
  Tensor sum, mean, rstd;
  Fp8Matrix out;
};
Fp8NormCast add_layer_norm_fp8_delayed(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                       const Tensor& weight, const Tensor& bias, double eps, DType out_dtype,
                                       const Tensor& residual_bias, Fp8Format format, Fp8CastOutputs outputs,
                                       Fp8History& history, int margin = 0);

// Its backward. grad_out has out's dtype; grad_sum (sum's dtype, or undefined) is the gradient
// reaching sum from later ops. grad of sum = grad_sum + layer norm backward of grad_out; returns
// (grad_x = that, in sum's dtype; grad_residual = that again, in residual_dtype; grad_weight;
// grad_bias; grad_residual_bias = its column sums, in residual_bias_dtype), an entry undefined
// when its mask bit is false. On CUDA the column sums are taken in the kernel's pass from the
// f32 gradient, before its rounding to residual_dtype.
struct AddLayerNormGrads {
  Tensor x, residual, weight, bias, residual_bias;
};
AddLayerNormGrads add_layer_norm_backward(const Tensor& grad_out, const Tensor& grad_sum, const Tensor& sum,
                                          const Shape& normalized_shape, const Tensor& mean, const Tensor& rstd,
                                          const Tensor& weight, DType residual_dtype, DType residual_bias_dtype,
                                          std::array<bool, 5> mask);

// ---- batch normalization (per channel = dim 1 of [N, C, *]; statistics in f64) ----
// Returns (out, save_mean [C], save_invstd [C]). When defined, running_mean/var [C] are
// updated in place: r = (1 - momentum) * r + momentum * batch_stat, with the unbiased
// variance (like PyTorch). weight/bias [C] may be undefined (no affine). relu: out is
// max(0, normalized) (in the same passes for a channels-last input on CUDA, a second pass
// elsewhere); its backward is batch_norm_backward with relu_out = out. residual (relu only;
// x's shape and dtype): out is max(0, normalized + residual), a ResNet block's output, the add
// inside the normalizing pass where the ReLU is; its gradient is grad_out masked by out > 0.
std::tuple<Tensor, Tensor, Tensor> batch_norm_forward_training(const Tensor& x, const Tensor& weight,
                                                               const Tensor& bias, const Tensor& running_mean,
                                                               const Tensor& running_var, double momentum, double eps,
                                                               bool relu = false, const Tensor& residual = Tensor());
// Normalizes with the running statistics.
Tensor batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double eps);
// Returns (grad_x, grad_weight, grad_bias). training: mean/invstd are the batch's (save_*),
// and grad_x includes the statistics' dependence on x; eval: they are the running
// statistics' mean and 1/sqrt(var + eps), constants. relu_out (training only): the output of
// a forward with relu; grad_out then counts only where it is positive.
std::tuple<Tensor, Tensor, Tensor> batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean, const Tensor& invstd, bool training,
                                                       const Tensor& relu_out = Tensor());

}  // namespace mg::kernels
