// The pieces of the FP8 tile casts (fp8.cu) that another pass casting its output takes too (the
// layer norm's for the linear after it, layer_norm.cu): the amax as bits, delayed scaling's
// scale from the history and its amax into the history, in one order whatever the kernel, so
// that each writes what fp8_quantize_transpose_delayed would, bit for bit.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "core/tensor.h"
#include "kernels/fp8_math.h"
#include "kernels/types.h"

namespace mg::kernels::fp8_tile {

// |v| as the bits of a non-negative float (their order is the floats' order), a NaN as 0x7fc00000,
// larger than every finite and infinite magnitude's bits.
__device__ __forceinline__ unsigned abs_bits(float v) {
  const float a = fabsf(v);
  return isnan(a) ? 0x7fc00000u : __float_as_uint(a);
}

inline __nv_fp8_interpretation_t kind_of(Fp8Format f) { return f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2; }

// A tile kernel's block: kTile * kTileRows threads.
constexpr int kTile = 32, kTileRows = 8;

// A tile kernel's thread index in its block of kTile * kTileRows threads (any 2-D shape): a warp is
// 32 consecutive indices.
__device__ __forceinline__ int tile_thread() { return threadIdx.y * blockDim.x + threadIdx.x; }

// Delayed scaling's arguments (Backend::fp8_quantize_transpose_delayed); hist null: the scale is
// *scale (current scaling, set by the kernels ahead).
struct Delayed {
  unsigned* hist = nullptr;  // the history's amax bits (fp8_math::history_max_bits)
  int slots = 0, slot = 0;
  fp8_math::Format f{};
  int margin = 0;
  float* scale_inv = nullptr;  // 1 / the scale used, written by block (0, 0)
  float* scale = nullptr;      // the scale used (or null), written by block (0, 0)
};
// A delayed cast's arguments: the history (f32 slots on the device, read as amax bits), the slot it
// takes, the scale rule, and where the scale used (or null) and its inverse go.
Delayed delayed_args(const Tensor& history, int slot, Fp8Format format, int margin, const Tensor& scale,
                     const Tensor& scale_inv);

// The scale a tile kernel casts with: *scale, or under delayed scaling the history's (each warp
// reads it with one load a lane and one reduction).
__device__ __forceinline__ float tile_scale(const float* scale, const Delayed& d) {
  if (!d.hist) return *scale;
  const int next = fp8_math::history_next(d.slot, d.slots);
  unsigned m = 0;
  for (int i = tile_thread() % 32; i < d.slots; i += 32)
    if (fp8_math::history_counts(d.hist[i], i, d.slot, next)) m = max(m, d.hist[i]);
  m = __reduce_max_sync(0xffffffffu, m);  // fp8_math::history_max_bits, a lane a slot
  const float s = fp8_math::scale_for(__uint_as_float(m), d.f, d.margin);
  if (blockIdx.x == 0 && blockIdx.y == 0 && tile_thread() == 0) {
    *d.scale_inv = __frcp_rn(s);
    if (d.scale) *d.scale = s;
    d.hist[next] = 0;  // no block reads that slot
  }
  return s;
}
// The tile's max |x| (abs_bits of each thread's m) into the history's slot. Every thread of the
// kTile * kTileRows threads calls it.
__device__ __forceinline__ void tile_amax_to_history(unsigned m, const Delayed& d) {
  constexpr int kWarps = kTile * kTileRows / 32;
  __shared__ unsigned warp_max[kWarps];
  const int t = tile_thread();
  m = __reduce_max_sync(0xffffffffu, m);
  if (t % 32 == 0) warp_max[t / 32] = m;
  __syncthreads();
  if (t != 0) return;
  for (int w = 1; w < kWarps; ++w) m = max(m, warp_max[w]);
  atomicMax(d.hist + d.slot, m);
}

}  // namespace mg::kernels::fp8_tile
