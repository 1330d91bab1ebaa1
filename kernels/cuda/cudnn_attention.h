// cuDNN's fused flash attention (cuDNN 9's SDPA engines: wgmma kernels on sm_90) for f16 and
// bf16, through the cuDNN graph API: the attention expressed as cuDNN's matmul, pointwise and
// reduction operations, which cuDNN's heuristics match to one fused engine. The operands and the
// logsumexp contract are attention.cu's (flash_attention_forward / backward), so a forward here
// and a backward by our tensor-core kernels (or the reverse) fit together.
//
// Each configuration (dtype, shapes, strides, causal) is built once per thread and device, and
// its execution plan cached; a configuration cuDNN has no engine for is remembered as such and
// the functions return false, having done nothing, so the caller runs its own kernels.
#pragma once

#include <string>

#include "core/tensor.h"

namespace mg::kernels::cuda {

// Whether cuDNN is asked at all for these sizes: f16/bf16, head dim a multiple of 8 up to 128,
// and L and S multiples of 64. The last keeps the plan cache small when lengths vary call to
// call (sampling a growing sequence builds one plan per length, each tens of milliseconds).
bool cudnn_attention_eligible(DType dt, int64_t L, int64_t S, int64_t D);

// q [B, H, L, D], k and v [B, H, S, D], out [B, H, L, D] (any strides with a unit-stride head
// dim and 16-byte aligned rows), lse [B * H, L] f32 contiguous (natural log). True when run.
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                             const Tensor& out, const Tensor& lse);

// The gradients of the forward above, from dout and the forward's out and lse; dq, dk, dv are
// fully written. dq is summed over key blocks in f32 by atomics (a run-dependent order), so a
// caller that wants determinism does not come here. True when run.
bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, bool causal, float scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv);

// How many forward and backward calls cuDNN has run in this process (tests check that a
// configuration really took this path rather than the fallback).
int64_t cudnn_attention_runs();

// The plans built so far in this process and the wall time spent building them (cuDNN compiles
// its attention kernels at run time: the first call of each configuration pays for it).
struct CudnnAttentionPlanStats {
  int64_t built = 0, declined = 0;
  double build_seconds = 0;
};
CudnnAttentionPlanStats cudnn_attention_plan_stats();

// Why cuDNN declined the last configuration it declined on this thread ("" if none has been):
// the graph call that failed and cuDNN's status and message.
std::string cudnn_attention_last_decline();

}  // namespace mg::kernels::cuda
