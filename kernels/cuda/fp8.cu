// FP8 kernels: quantize with the hardware's conversion (cvt.rn.satfinite through cuda_fp8.h,
// what the FP8 GEMM's producers use), dequantize, and amax with the scale rule on the device.
// tests/kernels/cuda/fp8_parity_test.cc holds them to the CPU reference (cpu/fp8.cc) bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/fp8_math.h"
#include "kernels/optim_math.h"

namespace mg::kernels {
using namespace cuda;      // NOLINT: the launch helpers of kernels/cuda/common.cuh
using namespace fp8_tile;  // NOLINT: the tile casts' pieces shared with the layer norm's
namespace {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__global__ void quantize_kernel(const T* x, const float* scale, __nv_fp8_interpretation_t kind, uint8_t* q, int64_t n) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    q[i] = __nv_cvt_float_to_fp8(to_f(x[i]) * s, __NV_SATFINITE, kind);
}

template <class T>
__device__ __forceinline__ void store(T* p, float v);
template <>
__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}
template <>
__device__ __forceinline__ void store(__half* p, float v) {
  *p = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

template <class T>
__global__ void dequantize_kernel(const uint8_t* q, const float* scale, __nv_fp8_interpretation_t kind, T* out,
                                  int64_t n) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // fp8 -> f16 is exact for both formats (f16 has more exponent and mantissa than each).
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], kind)));
    store(out + i, __fdiv_rn(v, s));
  }
}

// Eight consecutive elements as floats, from one 16-byte load (f16, bf16) or two (f32).
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_f(e[j]);
  } else {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// The block's maximum of each thread's m (abs_bits), returned to thread 0 (the others get their
// warp's). Every thread of a kBlock-thread block calls it.
__device__ __forceinline__ unsigned block_max(unsigned m) {
  __shared__ unsigned warp_max[kBlock / 32];
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_down_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kBlock / 32; ++w) m = max(m, warp_max[w]);
  return m;
}
__device__ __forceinline__ void block_max_to(unsigned m, unsigned* out) {
  m = block_max(m);
  if (threadIdx.x == 0) *out = m;
}

// gelu_tanh(x) rounded to T, as unary(GeluTanh) rounds it (gelu.cuh): what a gelu cast casts.
template <class T>
__device__ __forceinline__ float gelu_rounded(float x) {
  return to_f(store_m<T>(gelu_tanh<T>(x)));
}

// Each block's max |x| (of gelu_rounded(x) with `gelu`) into partial[blockIdx.x], as abs_bits: no
// atomics and no zeroed result, scale_kernel reduces the partials. With `vec` (x aligned to 16
// bytes) the elements are read 8 a load and the last n % 8 one at a time; otherwise all one at a
// time. Launched dependent: x is mostly the kernel ahead's output.
template <class T>
__global__ void amax_partial_kernel(const T* x, bool gelu, int64_t n, bool vec, unsigned* partial) {
  wait_for_previous();
  allow_dependents();  // scale_kernel may be scheduled; it waits for this kernel
  unsigned m = 0;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t groups = vec ? n / 8 : 0;
  for (int64_t i = first; i < groups; i += stride) {
    float v[8];
    load8(x + 8 * i, v);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = max(m, abs_bits(gelu ? gelu_rounded<T>(v[j]) : v[j]));
  }
  for (int64_t i = 8 * groups + first; i < n; i += stride) {
    const float v = to_f(x[i]);
    m = max(m, abs_bits(gelu ? gelu_rounded<T>(v) : v));
  }
  block_max_to(m, partial + blockIdx.x);
}

// The FP8 MLP backward's pass over the gradient reaching GELU's input: g = g * gelu_tanh'(pre),
// rounded to T as binary(GeluTanhBackward) rounds it (gelu.cuh), and each block's max |g| of the
// rounded values into partial[blockIdx.x], as amax_partial_kernel's. `vec`: g and pre aligned to
// 16 bytes (8 elements a load for f16/bf16, two loads for f32).
template <class T>
__device__ __forceinline__ T gelu_backward_rounded(float g, float pre) {
  return store_m<T>(gelu_tanh_backward<T>(g, pre));
}
template <class T>
__global__ void gelu_backward_amax_kernel(T* g, const T* pre, int64_t n, bool vec, unsigned* partial) {
  wait_for_previous();  // launched dependent: g is the GEMM's output, mostly
  allow_dependents();
  unsigned m = 0;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t groups = vec ? n / 8 : 0;
  for (int64_t i = first; i < groups; i += stride) {
    float gv[8], pv[8];
    load8(g + 8 * i, gv);
    load8(pre + 8 * i, pv);
    AlignedVec<T, 4> r[2];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      r[j / 4].v[j % 4] = gelu_backward_rounded<T>(gv[j], pv[j]);
      m = max(m, abs_bits(to_f(r[j / 4].v[j % 4])));
    }
    reinterpret_cast<AlignedVec<T, 4>*>(g + 8 * i)[0] = r[0];
    reinterpret_cast<AlignedVec<T, 4>*>(g + 8 * i)[1] = r[1];
  }
  for (int64_t i = 8 * groups + first; i < n; i += stride) {
    const T r = gelu_backward_rounded<T>(to_f(g[i]), to_f(pre[i]));
    g[i] = r;
    m = max(m, abs_bits(to_f(r)));
  }
  block_max_to(m, partial + blockIdx.x);
}

// One block: the max of `count` partial amax bits, written as the f32 amax, and the scale rule.
__global__ void scale_kernel(const unsigned* partial, int count, fp8_math::Format f, int margin, float* amax_out,
                             float* scale, float* scale_inv) {
  wait_for_previous();  // launched dependent on the kernel that wrote `partial`
  allow_dependents();   // the quantize may be scheduled; it waits for this kernel
  unsigned m = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) m = max(m, partial[i]);
  m = block_max(m);
  if (threadIdx.x != 0) return;
  const float amax = __uint_as_float(m);
  const float s = fp8_math::scale_for(amax, f, margin);
  *amax_out = amax;
  *scale = s;
  if (scale_inv) *scale_inv = __frcp_rn(s);
}

// The block's column sums, a row of partial sums for each kTile rows of its tile (whatever the
// kernel, so the sums are added in one order: a thread's rows, then the tile's threads, then the
// rows of partials). Thread (x, y) of a TX x TY block holds V columns' sums (columns V * x ...) of
// rows y % kTileRows + kTileRows * k of the tile's (y / kTileRows)-th kTile rows; they are added
// over those kTileRows threads in order into col_partial[(row of partials) * cols + c0 + ...],
// for the rows of partials that hold rows of x. Every thread calls it.
template <int V, int TX, int TY>
__device__ __forceinline__ void tile_column_sums(const float (&acc)[V], float* col_partial, int64_t c0, int64_t cols,
                                                 int64_t rows) {
  constexpr int kParts = TY / kTileRows;  // rows of partials a tile writes
  __shared__ float sums[TY][TX * V];
#pragma unroll
  for (int j = 0; j < V; ++j) sums[threadIdx.y][V * threadIdx.x + j] = acc[j];
  __syncthreads();
  for (int t = tile_thread(); t < kParts * TX * V; t += TX * TY) {
    const int part = t / (TX * V), cc = t % (TX * V);
    const int64_t prow = static_cast<int64_t>(blockIdx.y) * kParts + part;
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < kTileRows; ++y) s += sums[kTileRows * part + y][cc];
    if (c0 + cc < cols && prow * kTile < rows) col_partial[prow * cols + c0 + cc] = s;
  }
}

// One 32 x 32 tile of x [rows, cols] through shared memory: its codes written row by row into q
// and column by column into qt (qt [cols, rows]), each warp writing 32 consecutive bytes. With
// col_partial ([gridDim.y, cols] f32), the tile's column sums of x go to row blockIdx.y of it.
template <class T>
__global__ void quantize_transpose_kernel(const T* x, bool gelu, const T* pre, const float* scale,
                                          __nv_fp8_interpretation_t kind, uint8_t* q, uint8_t* qt, int64_t rows,
                                          int64_t cols, float* col_partial, Delayed d) {
  __shared__ float tile[kTile][kTile + 1];
  wait_for_previous();  // launched dependent: the scale is the kernel ahead's output
  const float s = tile_scale(scale, d);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[1] = {0.0f};
  unsigned m = 0;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      float x_f = to_f(x[r * cols + c]);
      if (gelu) x_f = gelu_rounded<T>(x_f);
      if (pre) x_f = to_f(gelu_backward_rounded<T>(x_f, to_f(pre[r * cols + c])));
      acc[0] += x_f;
      m = max(m, abs_bits(x_f));
      const float v = x_f * s;
      tile[i][threadIdx.x] = v;
      if (q) q[r * cols + c] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind);
    }
  }
  if (d.hist) tile_amax_to_history(m, d);
  if (col_partial) tile_column_sums<1, kTile, kTileRows>(acc, col_partial, c0, cols, rows);
  if (!qt) return;
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) qt[c * rows + r] = __nv_cvt_float_to_fp8(tile[threadIdx.x][i], __NV_SATFINITE, kind);
  }
}

template <class F>
void dispatch_half_or_f32(DType d, F f) {
  if (d == DType::f32)
    f(float{});
  else if (d == DType::f16)
    f(__half{});
  else
    f(__nv_bfloat16{});
}

}  // namespace

namespace fp8_tile {
Delayed delayed_args(const Tensor& history, int slot, Fp8Format format, int margin, const Tensor& scale,
                     const Tensor& scale_inv) {
  Delayed d;
  d.hist = static_cast<unsigned*>(history.raw_data());
  d.slots = static_cast<int>(history.numel());
  d.slot = slot;
  d.f = format == Fp8Format::E4M3 ? fp8_math::kE4M3 : fp8_math::kE5M2;
  d.margin = margin;
  d.scale_inv = data_as<float>(scale_inv);
  d.scale = scale.defined() ? data_as<float>(scale) : nullptr;
  return d;
}
}  // namespace fp8_tile

template <>
void CudaBackend::fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  dispatch_half_or_f32(x.dtype(), [&](auto t) {
    using T = decltype(t);
    quantize_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(static_cast<const T*>(x.raw_data()),
                                                         data_as<const float>(scale), kind_of(format),
                                                         static_cast<uint8_t*>(out.raw_data()), n);
  });
  MG_CUDA_CHECK_LAUNCH("fp8_quantize");
}

template <>
void CudaBackend::fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& out) {
  const int64_t n = q.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(q.device());
  cudaStream_t st = stream_of(q);
  dispatch_half_or_f32(out.dtype(), [&](auto t) {
    using T = decltype(t);
    dequantize_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(static_cast<const uint8_t*>(q.raw_data()),
                                                           data_as<const float>(scale), kind_of(format),
                                                           static_cast<T*>(out.raw_data()), n);
  });
  MG_CUDA_CHECK_LAUNCH("fp8_dequantize");
}

// quantize_transpose_kernel for rows and cols multiples of V (4 or 8) and rows starting
// V-element aligned: a tile of WideTile<V>::kRows rows by 128 columns, each thread converting V
// consecutive elements of 4 rows, read with one load each (8 bytes for 4 bf16, 16 for 8; all 4
// in flight before the scale is known: under delayed scaling block (0, 0) writes to global memory
// on the way to the scale, which later loads could not be moved above), and storing their V codes
// as one word; the transpose reads the tile's codes from shared memory and writes V rows' codes of
// one column as one word. V = 8 moves twice the bytes a load and a thread as V = 4: the casts of
// the FP8 recipe's shapes all take it.
constexpr int kWideCols = 128;
constexpr int kRowsPerThread = 4;
static_assert(kRowsPerThread * kTileRows == kTile, "a thread row's elements are kTile rows' worth of thread rows");
template <int V>
struct WideTile {
  static constexpr int kThreadsX = kWideCols / V;                  // 32 or 16
  static constexpr int kThreadsY = kTile * kTileRows / kThreadsX;  // 8 or 16
  static constexpr int kRows = kThreadsY * kRowsPerThread;         // 32 or 64
  using Word = std::conditional_t<V == 4, uint32_t, uint2>;        // V codes
  // The tile's row of thread row threadIdx.y's k-th element: kTile rows for each kTileRows thread
  // rows, a row kTileRows apart (the column sums' order, tile_column_sums).
  static __device__ __forceinline__ int row(int k) {
    return kTile * (threadIdx.y / kTileRows) + threadIdx.y % kTileRows + kTileRows * k;
  }
};
// V codes, the first in the lowest byte, as one word.
template <int V>
__device__ __forceinline__ typename WideTile<V>::Word pack_codes(const uint32_t (&c)[V]) {
  uint32_t w[V / 4];
#pragma unroll
  for (int h = 0; h < V / 4; ++h) w[h] = c[4 * h] | (c[4 * h + 1] << 8) | (c[4 * h + 2] << 16) | (c[4 * h + 3] << 24);
  if constexpr (V == 4)
    return w[0];
  else
    return uint2{w[0], w[1]};
}
// A vec tile kernel's codes: thread (x, y) casts its kRowsPerThread rows' V values v (row
// Tile::row(k), columns c ...) with scale s, writes them to q row by row (where q is given) and to
// the tile's shared memory for the transpose, and adds them into acc (the column sums) and their
// abs_bits into m (the amax).
template <int V>
__device__ __forceinline__ void codes_to_tile(const float (&v)[kRowsPerThread][V], float s,
                                              __nv_fp8_interpretation_t kind, uint8_t (*tile)[kWideCols + 4],
                                              uint8_t* q, int64_t r0, int64_t c, int64_t rows, int64_t cols,
                                              float (&acc)[V], unsigned& m) {
  using Tile = WideTile<V>;
  using Word = typename Tile::Word;
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int i = Tile::row(k);
    const int64_t r = r0 + i;
    if (r < rows && c < cols) {
      uint32_t codes[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        acc[j] += v[k][j];
        m = max(m, abs_bits(v[k][j]));
        codes[j] = __nv_cvt_float_to_fp8(v[k][j] * s, __NV_SATFINITE, kind);
      }
      const Word packed = pack_codes<V>(codes);
      // Shared memory's rows are 4-byte aligned (kWideCols + 4 bytes apart): a word at a time.
#pragma unroll
      for (int h = 0; h < V / 4; ++h)
        *reinterpret_cast<uint32_t*>(&tile[i][V * threadIdx.x + 4 * h]) = reinterpret_cast<const uint32_t*>(&packed)[h];
      if (q) *reinterpret_cast<Word*>(q + r * cols + c) = packed;
    }
  }
}
// The tile's codes (codes_to_tile's, after a __syncthreads) written transposed into qt [cols, rows]:
// V rows' codes of one column as one word.
template <int V>
__device__ __forceinline__ void tile_to_transposed(const uint8_t (*tile)[kWideCols + 4], uint8_t* qt, int64_t r0,
                                                   int64_t c0, int64_t rows, int64_t cols) {
  using Tile = WideTile<V>;
  constexpr int kGroups = Tile::kRows / V;  // a column's groups of V rows
  for (int item = tile_thread(); item < kWideCols * kGroups; item += kTile * kTileRows) {
    const int cc = item / kGroups, g = item % kGroups;  // the tile's column, its V-row group
    const int64_t col = c0 + cc, r = r0 + V * g;
    if (col < cols && r < rows) {
      uint32_t codes[V];
#pragma unroll
      for (int j = 0; j < V; ++j) codes[j] = tile[V * g + j][cc];
      *reinterpret_cast<typename Tile::Word*>(qt + col * rows + r) = pack_codes<V>(codes);
    }
  }
}

template <class T, int V>
__global__ void quantize_transpose_vec_kernel(const T* __restrict__ x, bool gelu, const T* __restrict__ pre,
                                              const float* scale, __nv_fp8_interpretation_t kind, uint8_t* q,
                                              uint8_t* qt, int64_t rows, int64_t cols, float* col_partial, Delayed d) {
  using Tile = WideTile<V>;
  __shared__ __align__(4) uint8_t tile[Tile::kRows][kWideCols + 4];
  wait_for_previous();  // launched dependent: x (and the scale) are the kernels ahead's output
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * Tile::kRows, c0 = static_cast<int64_t>(blockIdx.x) * kWideCols;
  const int64_t c = c0 + V * threadIdx.x;
  float v[kRowsPerThread][V];
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int64_t r = r0 + Tile::row(k);
    if (r < rows && c < cols) {
      load_v<V>(x + r * cols + c, v[k]);
      if (gelu) {  // the MLP's hidden activation, rounded as unary(GeluTanh) rounds it
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = gelu_rounded<T>(v[k][j]);
      }
      if (pre) {  // the gradient reaching GELU's input, rounded as binary(GeluTanhBackward) rounds it
        float pv[V];
        load_v<V>(pre + r * cols + c, pv);
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = to_f(gelu_backward_rounded<T>(v[k][j], pv[j]));
      }
    }
  }
  const float s = tile_scale(scale, d);
  float acc[V] = {};
  unsigned m = 0;
  codes_to_tile<V>(v, s, kind, tile, q, r0, c, rows, cols, acc, m);
  if (d.hist) tile_amax_to_history(m, d);
  if (col_partial) tile_column_sums<V, Tile::kThreadsX, Tile::kThreadsY>(acc, col_partial, c0, cols, rows);
  if (!qt) return;
  __syncthreads();
  tile_to_transposed<V>(tile, qt, r0, c0, rows, cols);
}

// One f32 parameter [rows, cols]'s Adam update and the FP8 recipe's cast of its new values in one
// pass (AdamTensors::fp8_casts): each thread updates its 4 consecutive elements of kRowsPerThread
// rows of a WideTile<4> with the fused update's rule (optim_math::adam_element), stores them and
// the moments, and the tile is cast as quantize_transpose_vec_kernel casts it under delayed
// scaling. A nonzero *found_inf (a GradScaler's skipped step) leaves the parameter and moments
// as they are, and casts the parameter.
__global__ void adam_fp8_cast_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ ea,
                                     float* __restrict__ eas, optim_math::AdamScalars<float> s, float step_size,
                                     float bc2_sqrt, const float* found_inf, __nv_fp8_interpretation_t kind, uint8_t* q,
                                     uint8_t* qt, int64_t rows, int64_t cols, Delayed d) {
  constexpr int V = 4;
  using Tile = WideTile<V>;
  __shared__ __align__(4) uint8_t tile[Tile::kRows][kWideCols + 4];
  const bool skip = found_inf && *found_inf != 0.0f;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * Tile::kRows, c0 = static_cast<int64_t>(blockIdx.x) * kWideCols;
  const int64_t c = c0 + V * threadIdx.x;
  float v[kRowsPerThread][V];
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int64_t r = r0 + Tile::row(k), at = r * cols + c;
    if (r < rows && c < cols) {
      float4 pv = *reinterpret_cast<const float4*>(p + at);
      if (!skip) {
        const float4 gv = *reinterpret_cast<const float4*>(g + at);
        float4 mv = *reinterpret_cast<const float4*>(ea + at), vv = *reinterpret_cast<const float4*>(eas + at);
        optim_math::adam_element<float>(pv.x, gv.x, mv.x, vv.x, nullptr, s, step_size, bc2_sqrt);
        optim_math::adam_element<float>(pv.y, gv.y, mv.y, vv.y, nullptr, s, step_size, bc2_sqrt);
        optim_math::adam_element<float>(pv.z, gv.z, mv.z, vv.z, nullptr, s, step_size, bc2_sqrt);
        optim_math::adam_element<float>(pv.w, gv.w, mv.w, vv.w, nullptr, s, step_size, bc2_sqrt);
        *reinterpret_cast<float4*>(p + at) = pv;
        *reinterpret_cast<float4*>(ea + at) = mv;
        *reinterpret_cast<float4*>(eas + at) = vv;
      }
      v[k][0] = pv.x, v[k][1] = pv.y, v[k][2] = pv.z, v[k][3] = pv.w;
    }
  }
  const float sc = tile_scale(nullptr, d);
  float acc[V] = {};
  unsigned m = 0;
  codes_to_tile<V>(v, sc, kind, tile, q, r0, c, rows, cols, acc, m);
  tile_amax_to_history(m, d);
  __syncthreads();
  tile_to_transposed<V>(tile, qt, r0, c0, rows, cols);
}

namespace {
bool aligned_to(const void* p, size_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

namespace {
// The casts' launch. With col_sums asked it returns the column sums of each kTile rows, [rows / kTile
// rounded up, cols] f32, for finish_column_sums to add; undefined otherwise, and where x has no elements.
Tensor quantize_transpose(const Tensor& x, bool gelu, const Tensor& pre, const float* scale, const Delayed& d,
                          Fp8Format format, const Tensor& out, const Tensor& out_t, const Tensor& col_sums) {
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return Tensor();
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  auto* q = out.defined() ? static_cast<uint8_t*>(out.raw_data()) : nullptr;
  auto* qt = out_t.defined() ? static_cast<uint8_t*>(out_t.raw_data()) : nullptr;
  const void* pre_data = pre.defined() ? pre.raw_data() : nullptr;
  // The widest vector kernel the shape and the pointers allow (V elements a load, V codes a
  // store), else the one-element kernel.
  const size_t es = dtype_size(x.dtype());
  auto fits = [&](int v, size_t x_align) {
    return rows % v == 0 && cols % v == 0 && aligned_to(x.raw_data(), x_align) && aligned_to(pre_data, x_align) &&
           aligned_to(q, v) && aligned_to(qt, v);
  };
  const int vec = fits(8, 8 * es) ? 8 : fits(4, 4 * es) ? 4 : 1;
  const int64_t tile_rows = vec == 8 ? WideTile<8>::kRows : kTile;
  const int64_t col_blocks = vec > 1 ? (cols + kWideCols - 1) / kWideCols : (cols + kTile - 1) / kTile;
  const int64_t grid_y = (rows + tile_rows - 1) / tile_rows;
  MG_CHECK(grid_y <= 65535, ShapeError, "fp8_quantize_transpose: ", rows, " rows is more than this kernel's ",
           65535LL * tile_rows);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(grid_y));
  // The column sums: one row of partial sums for each kTile rows.
  Tensor partial;
  if (col_sums.defined()) partial = empty({(rows + kTile - 1) / kTile, cols}, TensorOptions(DType::f32, x.device()));
  float* part = partial.defined() ? data_as<float>(partial) : nullptr;
  dispatch_half_or_f32(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const auto* xp = static_cast<const T*>(x.raw_data());
    const auto* pp = static_cast<const T*>(pre_data);
    if (vec == 8)
      launch_dependent(quantize_transpose_vec_kernel<T, 8>, grid, dim3(WideTile<8>::kThreadsX, WideTile<8>::kThreadsY),
                       0, st, xp, gelu, pp, scale, kind_of(format), q, qt, rows, cols, part, d);
    else if (vec == 4)
      launch_dependent(quantize_transpose_vec_kernel<T, 4>, grid, dim3(WideTile<4>::kThreadsX, WideTile<4>::kThreadsY),
                       0, st, xp, gelu, pp, scale, kind_of(format), q, qt, rows, cols, part, d);
    else
      launch_dependent(quantize_transpose_kernel<T>, grid, dim3(kTile, kTileRows), 0, st, xp, gelu, pp, scale,
                       kind_of(format), q, qt, rows, cols, part, d);
  });
  MG_CUDA_CHECK_LAUNCH("fp8_quantize_transpose");
  return partial;
}

// col_sums[c] = the sum of partial[:, c] ([P, C] f32, P = rows / kTile rounded up: 256 for
// GPT-2's 8192 rows): thread (x, y) of a 32 x kTileRows block adds rows y, y + kTileRows, ... of
// column 32 * blockIdx.x + x, then the block adds its kTileRows sums in order. One launch a cast
// where the backend's general column sum makes two (a split and its finalize) for so few rows.
__global__ void column_partials_sum_kernel(const float* __restrict__ partial, int64_t parts, int64_t cols,
                                           float* __restrict__ out) {
  __shared__ float sums[kTileRows][kTile];
  wait_for_previous();  // launched dependent: the partials are the cast's output
  allow_dependents();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
#pragma unroll 8
    for (int64_t p = threadIdx.y; p < parts; p += kTileRows) s += partial[p * cols + c];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float t = sums[0][threadIdx.x];
#pragma unroll
  for (int y = 1; y < kTileRows; ++y) t += sums[y][threadIdx.x];
  out[c] = t;
}

// col_sums = the tiles' partial sums added up (zero without rows).
void finish_column_sums(const Tensor& partial, const Tensor& col_sums) {
  if (!col_sums.defined() || col_sums.numel() == 0) return;
  mg::cuda::DeviceGuard guard(col_sums.device());
  cudaStream_t st = stream_of(col_sums);
  const int64_t cols = col_sums.numel();
  if (partial.defined()) {
    launch_dependent(column_partials_sum_kernel, dim3(static_cast<unsigned>((cols + kTile - 1) / kTile)),
                     dim3(kTile, kTileRows), 0, st, data_as<const float>(partial), partial.size(0), cols,
                     data_as<float>(col_sums));
    MG_CUDA_CHECK_LAUNCH("fp8_cast column sums");
  } else {
    MG_CUDA_CHECK(cudaMemsetAsync(col_sums.raw_data(), 0, static_cast<size_t>(cols) * sizeof(float), st));
  }
}
}  // namespace

template <>
void CudaBackend::fp8_quantize_transpose(const Tensor& x, bool gelu, const Tensor& scale, Fp8Format format,
                                         const Tensor& out, const Tensor& out_t, const Tensor& col_sums) {
  const Tensor partial =
      quantize_transpose(x, gelu, Tensor(), data_as<const float>(scale), Delayed{}, format, out, out_t, col_sums);
  finish_column_sums(partial, col_sums);
}

template <>
void CudaBackend::fp8_quantize_transpose_delayed(const Tensor& x, bool gelu, const Tensor& gelu_pre,
                                                 const Tensor& history, int slot, Fp8Format format, int margin,
                                                 const Tensor& scale, const Tensor& scale_inv, const Tensor& out,
                                                 const Tensor& out_t, const Tensor& col_sums) {
  const Delayed d = delayed_args(history, slot, format, margin, scale, scale_inv);
  finish_column_sums(quantize_transpose(x, gelu, gelu_pre, nullptr, d, format, out, out_t, col_sums), col_sums);
}

namespace {
// Blocks for a pass that writes one amax partial a block: enough to saturate the memory, few
// enough for scale_kernel's one block to reduce.
unsigned amax_blocks(int64_t n, bool vec, const Device& d) {
  return std::min<unsigned>(blocks_for(vec ? (n + 7) / 8 : n), 8 * static_cast<unsigned>(sm_count(d)));
}
// scale_kernel over `blocks` partials into the amax, scale and (when defined) scale_inv tensors.
void launch_scale(const unsigned* bits, unsigned blocks, Fp8Format format, int margin, const Tensor& amax,
                  const Tensor& scale, const Tensor& scale_inv, cudaStream_t st) {
  launch_dependent(scale_kernel, dim3(1), dim3(kBlock), 0, st, bits, static_cast<int>(blocks),
                   format == Fp8Format::E4M3 ? fp8_math::kE4M3 : fp8_math::kE5M2, margin, data_as<float>(amax),
                   data_as<float>(scale), scale_inv.defined() ? data_as<float>(scale_inv) : nullptr);
}
}  // namespace

template <>
void CudaBackend::fp8_amax_scale(const Tensor& x, bool gelu, Fp8Format format, int margin, const Tensor& amax,
                                 const Tensor& scale, const Tensor& scale_inv) {
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  const int64_t n = x.numel();
  const bool vec = aligned_to(x.raw_data(), 16);
  const unsigned blocks = amax_blocks(n, vec, x.device());
  Tensor partial = empty({static_cast<int64_t>(blocks)}, TensorOptions(DType::i32, x.device()));
  auto* bits = static_cast<unsigned*>(partial.raw_data());
  dispatch_half_or_f32(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch_dependent(amax_partial_kernel<T>, dim3(blocks), dim3(kBlock), 0, st, static_cast<const T*>(x.raw_data()),
                     gelu, n, vec, bits);
  });
  launch_scale(bits, blocks, format, margin, amax, scale, scale_inv, st);
  MG_CUDA_CHECK_LAUNCH("fp8_current_scale");
}

template <>
void CudaBackend::fp8_gelu_backward_amax_scale(const Tensor& g, const Tensor& pre, Fp8Format format, int margin,
                                               const Tensor& amax, const Tensor& scale, const Tensor& scale_inv) {
  mg::cuda::DeviceGuard guard(g.device());
  cudaStream_t st = stream_of(g);
  const int64_t n = g.numel();
  const bool vec = aligned_to(g.raw_data(), 16) && aligned_to(pre.raw_data(), 16);
  const unsigned blocks = amax_blocks(n, vec, g.device());
  Tensor partial = empty({static_cast<int64_t>(blocks)}, TensorOptions(DType::i32, g.device()));
  auto* bits = static_cast<unsigned*>(partial.raw_data());
  dispatch_half_or_f32(g.dtype(), [&](auto t) {
    using T = decltype(t);
    launch_dependent(gelu_backward_amax_kernel<T>, dim3(blocks), dim3(kBlock), 0, st, static_cast<T*>(g.raw_data()),
                     static_cast<const T*>(pre.raw_data()), n, vec, bits);
  });
  launch_scale(bits, blocks, format, margin, amax, scale, scale_inv, st);
  MG_CUDA_CHECK_LAUNCH("fp8_cast_gelu_backward");
}

bool adam_fp8_cast(const Tensor& p, const Tensor& g, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                   const optim_math::AdamScalars<float>& s, float step_size, float bc2_sqrt, const float* found_inf,
                   const Fp8WeightCast& c) {
  const int64_t rows = p.size(0), cols = p.size(1);
  const bool fits = rows % 4 == 0 && cols % 4 == 0 && g.dtype() == DType::f32 && !s.amsgrad &&
                    aligned_to(p.raw_data(), 16) && aligned_to(g.raw_data(), 16) &&
                    aligned_to(exp_avg.raw_data(), 16) && aligned_to(exp_avg_sq.raw_data(), 16) &&
                    aligned_to(c.codes.raw_data(), 4) && aligned_to(c.codes_t.raw_data(), 4);
  if (!fits) return false;
  if (rows == 0 || cols == 0) return true;
  const int64_t grid_y = (rows + WideTile<4>::kRows - 1) / WideTile<4>::kRows;
  MG_CHECK(grid_y <= 65535, ShapeError, "adam_multi_tensor_: an FP8 cast of ", rows, " rows is more than ",
           65535LL * WideTile<4>::kRows);
  mg::cuda::DeviceGuard guard(p.device());
  const Delayed d = delayed_args(c.history, c.slot, c.format, c.margin, c.scale, c.scale_inv);
  const dim3 grid(static_cast<unsigned>((cols + kWideCols - 1) / kWideCols), static_cast<unsigned>(grid_y));
  adam_fp8_cast_kernel<<<grid, dim3(WideTile<4>::kThreadsX, WideTile<4>::kThreadsY), 0, stream_of(p)>>>(
      data_as<float>(p), data_as<const float>(g), data_as<float>(exp_avg), data_as<float>(exp_avg_sq), s, step_size,
      bc2_sqrt, found_inf, kind_of(c.format), static_cast<uint8_t*>(c.codes.raw_data()),
      static_cast<uint8_t*>(c.codes_t.raw_data()), rows, cols, d);
  MG_CUDA_CHECK_LAUNCH("adam_multi_tensor_ (FP8 cast)");
  return true;
}

}  // namespace mg::kernels
