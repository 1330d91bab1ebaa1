// Raw memory-efficient ("flash") attention and the one place that picks the attention
// kernel (attention_kernel): composed, SIMT flash or tensor-core flash.
#pragma once

#include <optional>
#include <tuple>

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- memory-efficient ("flash") attention, CUDA only (kernels/cuda/attention.cu) ----
// softmax(scale * q k^T, masked) v without ever storing the [L, S] matrix: tiles with an
// online softmax forward, probabilities recomputed tile by tile backward. q [..., L, E], k and
// v [..., S, E] (same leading dims, S >= 1, E <= kFlashAttentionMaxHeadDim), one dtype of
// f32/f16/bf16 (f32 accumulation), on one CUDA device. Strided views are read in place when the
// head dim is unit-stride and the leading dims fold into (batch, head) strides (a transposed,
// narrowed slice of a packed [B, T, 3C] projection does); for the tensor-core kernels also
// 16-byte aligned rows. Anything else is copied to a contiguous tensor first.
// causal masks key j for query i when j > i; scale defaults to 1 / sqrt(E). CPU tensors (and
// a build without CUDA kernels) raise mg::DeviceError: the CPU path is mg::sdpa_composed.

// True when flash_attention_forward would accept q, k, v (device, dtype, shapes, build).
bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v);

// Returns (out [..., L, E] in q's dtype, logsumexp [..., L] f32): the natural-log logsumexp of
// each row of the scaled, masked scores, all that backward needs besides q, k, v and out.
std::tuple<Tensor, Tensor> flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                                   std::optional<double> scale = std::nullopt);

// Returns (grad_q, grad_k, grad_v) in q's dtype, from grad_out (cast to q's dtype if needed)
// and the forward's out and logsumexp; causal and scale must be the forward's.
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out, const Tensor& logsumexp,
                                                            bool causal, std::optional<double> scale = std::nullopt);

// The same two with caller-provided outputs, written in place whatever their strides (a
// [B, H, T, D] view of a [B, T, C] tensor, or of one third of a [B, T, 3C] gradient): no
// head-merge or concatenation copies. Each output has its shape above and q's dtype; one the
// kernels can't address directly is computed into a scratch tensor and copied. Forward returns
// the logsumexp [..., L] f32.
Tensor flash_attention_forward_out(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, bool causal,
                                   std::optional<double> scale = std::nullopt);
void flash_attention_backward_out(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& logsumexp, bool causal, std::optional<double> scale,
                                  const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v);

// The attention implementation for these operands: FlashCudnn (cuDNN's fused attention,
// kernels/cuda/cudnn_attention.h) for f16/bf16 at head dims that are multiples of 8, unless
// set_deterministic(true); FlashTensorCore for f16/bf16/f32 at head dim 64 or 128 on CUDA (f32 in
// TF32 under set_allow_tf32(true), otherwise as TF32 pairs), FlashSimt for the other CUDA cases
// flash supports, Composed otherwise (CPU, f64, dropout). FlashCudnn hands the lengths cuDNN is
// not asked for (not multiples of 64) to FlashTensorCore, or FlashSimt at other head dims.
// MG_ATTENTION_KERNEL=auto|composed|simt|tc|cudnn overrides it (A/B comparisons); another value,
// or one the operands can't run, raises mg::ValueError.
AttentionKernel attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v, bool dropout = false);
// The flash kernel for a dtype and head dim (the flash half of attention_kernel's rule).
AttentionKernel flash_attention_kernel(DType dt, int64_t head_dim);
const char* attention_kernel_name(AttentionKernel kernel);
// Whether the tensor-core backward (every dtype) runs in one pass (dq added over the key blocks by f32
// atomics into an f32 [B*H, L, D] scratch: fewer products, a run-dependent summation order) or
// in two (dq by its own pass, bit-identical run to run). Two under set_deterministic(true);
// MG_ATTENTION_BWD=auto|onepass|twopass overrides it otherwise (A/B comparisons). One pass is
// then taken where it is the faster (every dtype and head dim but f32 as TF32 pairs at D = 128).
bool flash_backward_one_pass();

}  // namespace mg::kernels
