// CUDA kernels behind kernels/nn_ops.h (convolution via cuDNN, pooling, batch norm) and
// kernels/transformer_ops.h (layer norm): the signatures of their cpu:: twins, called after
// the checks there. Dtypes: f32, f16, bf16 (accumulating in f32) and f64.
#pragma once

#include "core/tensor.h"
#include "kernels/nn_ops.h"

namespace mg::kernels::cuda {

// ---- convolution (conv.cc, cuDNN) ----
// Operands are contiguous NCHW or channels-last (NHWC-strided); outputs are allocated by
// the caller, any of the two layouts, and fully overwritten. One call runs in one layout:
// NHWC when its data input (x, or grad_out for backward_input) is channels-last, else NCHW;
// operands in the other layout are copied. f32 runs without TF32 unless
// kernels::set_allow_tf32(true).
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dArgs& args, const Tensor& out);
void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Conv2dArgs& args, const Tensor& grad_x);
void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Conv2dArgs& args, const Tensor& grad_w);

// ---- pooling (pool.cu); contiguous NCHW in and out ----
void max_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out, const Tensor& indices);  // indices may be undefined
void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_x);
void avg_pool2d(const Tensor& x, const Pool2dArgs& args, const Tensor& out);
void avg_pool2d_backward(const Tensor& grad_out, const Pool2dArgs& args, const Tensor& grad_x);
void adaptive_avg_pool2d(const Tensor& x, const Tensor& out);
void adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& grad_x);

// ---- batch norm (norm.cu); x [N, C, *] contiguous, per-channel tensors [C] of x's dtype ----
void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, double momentum, double eps, const Tensor& out,
                                 const Tensor& save_mean, const Tensor& save_invstd);
void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, double eps, const Tensor& out);
void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& invstd, bool training, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias);

// ---- layer norm (layer_norm.cu); the contract of cpu::layer_norm_* in transformer_ops.h ----
// x [M, N] contiguous; weight/bias [N] of x's dtype or undefined; out [M, N] of x's dtype,
// mean/rstd [M] in f32 (f64 for f64).
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                        const Tensor& mean, const Tensor& rstd);
// Each defined output (grad_x [M, N], grad_weight/grad_bias [N]) is fully overwritten.
void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias);
// The plain one-thread-per-row kernels, kept as the reference the fused ones are tested against.
void layer_norm_forward_reference(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& out, const Tensor& mean, const Tensor& rstd);

// ---- memory-efficient attention (attention.cu); the contract of flash_attention_* in
// transformer_ops.h after its checks ----
// q [B, H, L, D], k and v [B, H, S, D] (S >= 1, D <= kFlashMaxHeadDim), one dtype of
// f32/f16/bf16, any strides but a unit-stride head dim (16-byte aligned rows for the tensor-core
// kernels, else they fall back to SIMT); B * H heads flattened b-major, each tensor with its own
// strides. out [B, H, L, D] (strided likewise) of q's dtype and lse [BH, L] contiguous f32 are
// fully overwritten.
constexpr int64_t kFlashMaxHeadDim = 128;
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                             const Tensor& out, const Tensor& lse);
// grad_out and out [B, H, L, D] of q's dtype, lse [BH, L] f32 from the forward; grad_q
// [B, H, L, D], grad_k and grad_v [B, H, S, D] of q's dtype (all strided as above) are fully
// overwritten.
void flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, bool causal, double scale, const Tensor& grad_q,
                              const Tensor& grad_k, const Tensor& grad_v);
// Which kernels flash_attention_* run for this dtype and head dim: "tc" (tensor cores,
// attention_tc.cu: f16/bf16 at D = 64 or 128, inputs 16-byte aligned) or "simt" (everything
// else). MG_ATTENTION_KERNEL=simt forces "simt"; values other than auto/tc/simt raise ValueError.
const char* flash_attention_kernel(DType dt, int64_t D);

}  // namespace mg::kernels::cuda
