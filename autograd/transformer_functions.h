// Differentiable transformer ops (PyTorch's F.layer_norm, F.embedding,
// F.scaled_dot_product_attention): forward and backward side by side in autograd/norm_ops.cc, index_ops.cc and
// attention_ops.cc.
#pragma once

#include <optional>
#include <utility>

#include "core/tensor.h"

namespace mg {

// Normalizes over the trailing dims `normalized_shape` (they must equal x's last dims), then
// scales by weight and shifts by bias (each of normalized_shape, or undefined). Saves only
// x, weight and the per-row mean/rstd for backward (not the normalized activations).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// The pre-LN block's residual step: returns (h, y) with h = x + residual (in x's dtype; with
// residual undefined h is x) and y = layer_norm(h) in out_dtype (x's dtype when unset). Under
// autocast a half-precision x is widened first, like layer_norm. A GPT-2 block hands y to a
// linear, so it asks for the autocast dtype: on CUDA one kernel then reads x and the branch
// output and writes h and the half-precision y, and backward is one kernel that also sums the
// residual stream's gradient in and writes the branch's gradient in its dtype (no separate
// add, casts or gradient accumulation). Same values as add + layer_norm + cast, which it runs
// as under a selective-recompute policy (so layer_norm stays recomputable) and on the CPU.
// residual_bias (normalized_shape; needs a residual) is added with the residual, h = (x +
// residual) + residual_bias: the bias of the Linear that made residual, left out of that
// Linear's GEMM, so that its gradient (the column sums of h's gradient) comes out of this op's
// backward kernel instead of a column reduction of its own (a GPT-2 block's c_proj biases).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                         const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                                         std::optional<DType> out_dtype = std::nullopt,
                                         const Tensor& residual_bias = Tensor());

// The transformer MLP: linear(gelu_tanh(linear(x, w_fc, b_fc)), w_proj, b_proj) as one node
// (biases may be undefined). On CUDA in f16/bf16 the GELU runs inside the first GEMM
// (cuBLASLt's epilogue, which keeps its argument for backward) and its derivative inside the
// GEMM of the gradient reaching it: no GELU kernel either way; each bias gradient is taken
// inside its layer's weight-gradient GEMM.
// Saves what the two linears and the GELU would (x, the GELU's argument and its output).
// Follows autocast like linear; under a selective-recompute policy it runs as the three ops.
Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj);
// Whether gelu_mlp(x, w_fc, ..., w_proj, ...) runs under the FP8 recipe: both its linears do
// (fp8_takes_linear) and the shapes chain. Its c_proj bias then stays in the GEMM, as a linear's.
bool fp8_takes_gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& w_proj);

// Rows of weight [num_embeddings, dim] picked by integer indices (i64 or i32, any shape) ->
// [*indices.shape, dim]. The gradient is dense: grad rows are index_add-ed into a zero
// [num_embeddings, dim] tensor, so a repeated index accumulates. An index outside
// [0, num_embeddings) is an mg::IndexError naming it and num_embeddings.
Tensor embedding(const Tensor& weight, const Tensor& indices);

// softmax(q @ k^T * scale + mask) @ v for q [..., L, E], k [..., S, E], v [..., S, Ev] (same
// leading dims, one floating dtype) -> [..., L, Ev]. scale defaults to 1 / sqrt(E). causal
// masks key j for query i when j > i (PyTorch's top-left alignment when L != S). dropout_p
// drops attention weights whenever it is > 0 (pass 0 in eval, like PyTorch's functional).
// kernels::attention_kernel picks the path: the flash kernels (CUDA, no dropout, head dim within
// kernels::kFlashAttentionMaxHeadDim) or sdpa_composed for everything else.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, std::optional<double> scale = std::nullopt);

// Causal (or full) self-attention straight from a packed projection: qkv [B, T, 3C] holds q, k
// and v side by side (each [B, T, C], C = num_heads * D), the result y is [B, T, C] with the heads
// side by side: what a GPT block does with c_attn's output, without the head split / merge
// copies. On CUDA (dropout 0, head dim <= 128) the flash kernels read q/k/v as strided views of
// qkv, write y in place, and backward writes the three gradients into one [B, T, 3C] buffer; the
// node saves qkv, y and the logsumexp only. Everything else (CPU, f64, dropout, MG_ATTENTION_KERNEL=composed)
// runs the composed narrow / transpose / scaled_dot_product_attention path: same meaning.
// Follows autocast like scaled_dot_product_attention (runs in the region's low precision).
Tensor attention_packed_qkv(const Tensor& qkv, int64_t num_heads, bool causal = false, double dropout_p = 0.0,
                            std::optional<double> scale = std::nullopt);

// The composed path, matmul / where / softmax / dropout / matmul: it materializes the [L, S]
// score and probability matrices (and keeps them for backward). The CPU, dropout and f64 run it;
// the flash paths are tested against it.
Tensor sdpa_composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false, double dropout_p = 0.0,
                     std::optional<double> scale = std::nullopt);

}  // namespace mg
