// Raw (no autograd) transformer kernels: layer norm forward and backward, and memory-efficient
// (flash) attention on CUDA. Each checks its inputs (naming the op and the values), then runs.
#pragma once

#include <array>
#include <optional>
#include <tuple>

#include "core/tensor.h"

namespace mg::kernels {

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

// The same two functions composed of generic kernels (mean, mul, rsqrt, ...): the plain
// reference the loop kernel is tested against, and the path CUDA tensors take until a fused
// CUDA layer norm lands.
std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_composed(const Tensor& x, const Shape& normalized_shape,
                                                               const Tensor& weight, const Tensor& bias, double eps);
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_composed(const Tensor& grad_out, const Tensor& x,
                                                                const Shape& normalized_shape, const Tensor& mean,
                                                                const Tensor& rstd, const Tensor& weight,
                                                                std::array<bool, 3> mask = {true, true, true});

// ---- memory-efficient ("flash") attention, CUDA only (kernels/cuda/attention.cu) ----
// softmax(scale * q k^T, masked) v without ever storing the [L, S] matrix: tiles with an
// online softmax forward, probabilities recomputed tile by tile backward. q [..., L, E], k and
// v [..., S, E] (same leading dims, S >= 1, E <= kFlashAttentionMaxHeadDim), one dtype of
// f32/f16/bf16 (f32 accumulation), on one CUDA device. Strided views are read in place when the
// head dim is unit-stride and the leading dims fold into (batch, head) strides (a transposed,
// narrowed slice of a packed [B, T, 3C] projection does); for the tensor-core kernels also
// 16-byte aligned rows. Anything else is copied to a contiguous tensor first.
// causal masks key j for query i when j > i; scale defaults to 1 / sqrt(E). CPU tensors (and
// a build without CUDA kernels) raise mg::DeviceError: the CPU path is mg::sdpa_reference.
constexpr int64_t kFlashAttentionMaxHeadDim = 128;

// True when flash_attention_forward would accept q, k, v (device, dtype, shapes, build).
bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v);

// Returns (out [..., L, E] in q's dtype, logsumexp [..., L] f32): the natural-log logsumexp of
// each row of the scaled, masked scores, all that backward needs besides q, k, v and out.
std::tuple<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> scale = std::nullopt);

// Returns (grad_q, grad_k, grad_v) in q's dtype, from grad_out (cast to q's dtype if needed)
// and the forward's out and logsumexp; causal and scale must be the forward's.
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out,
                                                            const Tensor& logsumexp, bool causal,
                                                            std::optional<double> scale = std::nullopt);

// The same two with caller-provided outputs, written in place whatever their strides (a
// [B, H, T, D] view of a [B, T, C] tensor, or of one third of a [B, T, 3C] gradient): no
// head-merge or concatenation copies. Each output has its shape above and q's dtype; one the
// kernels can't address directly is computed into a scratch tensor and copied. Forward returns
// the logsumexp [..., L] f32.
Tensor flash_attention_forward_out(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, bool causal,
                                   std::optional<double> scale = std::nullopt);
void flash_attention_backward_out(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& logsumexp, bool causal,
                                  std::optional<double> scale, const Tensor& grad_q, const Tensor& grad_k,
                                  const Tensor& grad_v);

// Declared here rather than in cpu/cpu_ops.h so the transformer kernels stay in their own files.
namespace cpu {
// x [M, N] contiguous; weight/bias [N] contiguous of x's dtype or undefined; out [M, N] of x's
// dtype, mean/rstd [M] of the stats dtype, all contiguous and fully overwritten.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                        const Tensor& mean, const Tensor& rstd);
// grad_out, x [M, N] contiguous of one dtype; mean/rstd [M]; weight [N] or undefined. Each
// output (grad_x [M, N], grad_weight/grad_bias [N]) is written when defined.
void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias);
}  // namespace cpu

}  // namespace mg::kernels
