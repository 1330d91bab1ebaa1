// Tensor-core flash attention (FlashAttention-2 style) for f16/bf16 at head dims 64 and 128, on
// raw device pointers: the fast path that flash_attention_* in attention.cu dispatch to.
//
// Plain CUDA only (no memgrad headers), so a standalone harness can compile attention_tc.cu with
// nvcc alone (tools/attention_check.cu). The layout and lse contract are attention.cu's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mg::kernels::cuda {

enum class TcElem { f16, bf16 };

// q [BH, L, D], k and v [BH, S, D], out [BH, L, D] contiguous, 16-byte aligned, one element type;
// lse [BH, L] f32 (natural log). Causal masks key j for query i when j > i (top-left).
struct TcForwardArgs {
  TcElem elem;
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  int64_t BH, L, S;
  int D;
  float scale;
  bool causal;
};

// delta [BH, L] f32 = rowsum(dout * out), computed by the caller. dq, dk, dv are fully written
// (dk = dv = 0 for keys no query sees).
struct TcBackwardArgs {
  TcElem elem;
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;
  const float* delta;
  void* dq;
  void* dk;
  void* dv;
  int64_t BH, L, S;
  int D;
  float scale;
  bool causal;
};

// True for the head dims the tensor-core kernels are compiled for (64, 128).
bool attention_tc_head_dim_ok(int64_t D);

// Launch on `stream`; return the launch error (cudaSuccess when all launched). L, S >= 1.
cudaError_t attention_tc_forward(const TcForwardArgs& a, cudaStream_t stream);
cudaError_t attention_tc_backward(const TcBackwardArgs& a, cudaStream_t stream);

}  // namespace mg::kernels::cuda
