// Tensor-core flash attention (FlashAttention-2 style) for f16/bf16/f32 at head dims 64 and 128, on
// raw device pointers: the fast path that flash_attention_* in attention.cu dispatch to.
//
// Plain CUDA only (no memgrad headers), so a standalone harness can compile attention_tc.cu with
// nvcc alone (tools/attention_check.cu). The layout and lse contract are attention.cu's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mg::kernels::cuda {

// The element type of every operand and output. tf32: f32 tensors, multiplied on the tensor
// cores in TF32 (inputs rounded to 10 mantissa bits, f32 accumulation): the caller's choice
// under kernels::allow_tf32(). f32x3: f32 tensors, each operand split into a TF32 pair and
// multiplied in three TF32 products (about 2^-21 relative, f32's class): f32 without TF32.
enum class TcElem { f16, bf16, tf32, f32x3 };

// Where the rows of a [B, H, n, D] view lie, in elements (the head dim is unit-stride): row r
// of head bh = b * H + h starts at b * sb + h * sh + r * sp. Strided views let the attention
// read q/k/v straight out of a packed [B, T, 3C] projection and write [B, T, C] outputs, with no
// head-split copies. sp == 0 (the default) means contiguous [BH, n, D]: the layout the kernels
// had before strides, which the standalone harness still passes.
#if defined(__CUDACC__)
#define MG_TC_HD __host__ __device__
#else
#define MG_TC_HD
#endif
struct TcLayout {
  int64_t H = 1, sb = 0, sh = 0, sp = 0;
  // Element offset of head bh's first row.
  MG_TC_HD int64_t head(int64_t bh) const { return (bh / H) * sb + (bh % H) * sh; }
};
#undef MG_TC_HD

// The layout itself, or the contiguous one for n rows of D when l.sp == 0.
inline TcLayout tc_resolve(TcLayout l, int64_t n, int D) { return l.sp == 0 ? TcLayout{1, n * D, 0, D} : l; }

// cp.async and ldmatrix move 16 bytes (8 elements) at a time: the base pointer and every row
// start must be 16-byte aligned, so each stride must be a multiple of 8 elements.
inline bool tc_layout_aligned(const void* p, TcLayout l) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && l.H >= 1 && l.sb % 8 == 0 && l.sh % 8 == 0 && l.sp % 8 == 0;
}

// q [BH, L, D], k and v [BH, S, D], out [BH, L, D], one element type, laid out as the TcLayouts
// say (tc_layout_aligned); lse [BH, L] f32 contiguous (natural log). Causal masks key j for query
// i when j > i (top-left).
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
  TcLayout lq{}, lk{}, lv{}, lo{};
};

// delta [BH, L] f32 = rowsum(dout * out), computed by the caller. dq, dk, dv are fully written
// (dk = dv = 0 for keys no query sees). dq_acc: null for the two-pass backward (dq by a pass of
// its own: deterministic); else f32 scratch of BH * L * D elements, 16-byte aligned, for the one
// pass (dq summed over the key blocks by f32 atomics, in a run-dependent order), which
// attention_tc_backward zeroes itself (ignored where attention_tc_one_pass_pays is false).
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
  TcLayout lq{}, lk{}, lv{}, ldout{}, ldq{}, ldk{}, ldv{};
  float* dq_acc = nullptr;
};

// True for the head dims the tensor-core kernels are compiled for (64, 128), every TcElem.
bool attention_tc_head_dim_ok(int64_t D);

// Whether the one-pass backward (TcBackwardArgs::dq_acc) beats two passes for this element type
// and head dim on the H200 (docs/attention.md): everywhere but TF32 pairs at D = 128, where the
// one-pass kernel needs more than 255 registers and spills (B8 H8 T1024 forward + backward:
// 4.26 / 6.19 ms causal / full against 4.15 / 5.73 in two passes).
bool attention_tc_one_pass_pays(TcElem elem, int D);

// Launch on `stream`; return the launch error (cudaSuccess when all launched). L, S >= 1.
cudaError_t attention_tc_forward(const TcForwardArgs& a, cudaStream_t stream);
cudaError_t attention_tc_backward(const TcBackwardArgs& a, cudaStream_t stream);

}  // namespace mg::kernels::cuda
