// Memory-efficient ("flash") attention on CUDA, llm.c style: the obvious tiled kernels, f32
// accumulation on CUDA cores, and never a T x T matrix in device memory.
//
// Layout: q [B, H, L, D], k and v [B, H, S, D], out [B, H, L, D], one element type (f32, f16,
// bf16), each a strided view with a unit-stride head dim (a TcLayout: heads and rows may sit
// anywhere, so q/k/v can be read straight out of a packed [B, T, 3C] projection); lse [BH, L]
// contiguous f32: the natural-log logsumexp of each row of the scaled, masked scores. Causal
// masks key j for query i when j > i (top-left, as sdpa_composed).
//
// All three kernels have one shape: a block of 4 warps owns 16 "rows" of one side (4 per
// warp) and walks the other side in tiles of 32, one entry per lane.
//   forward  rows = queries, tiles of keys. Lane j scores s_ij = scale * q_i . k_j for the
//            warp's 4 rows; the online softmax keeps a running max m and sum l per row and
//            rescales the accumulator when m grows; then the lanes switch to head-dim
//            columns (d = lane + 32 c) and add p_ij v_j, p_ij handed around by shuffles.
//   backward delta_i = rowsum(dout_i * out_i) first, then two passes that recompute
//            p_ij = exp(s_ij - lse_i) tile by tile, with ds_ij = p_ij (dout_i . v_j - delta_i):
//            dkdv: rows = keys, tiles of queries: dv_j += p_ij dout_i, dk_j += scale ds_ij q_i;
//            dq:   rows = queries, tiles of keys: dq_i += scale ds_ij k_j.
//            Two passes instead of atomics: every gradient element is written once, with no
//            f32 scratch for dq, and the result is deterministic. The price is computing
//            q . k and dout . v twice.
// Tiles sit in shared memory as f32 (converted once on load, zero past L, S and D). A tile
// read one row per lane is padded to D + 1 floats a row, so the 32 lanes hit 32 banks; the
// rows a whole warp reads together are broadcast and read 16 bytes at a time. Head dims are
// bucketed to 32, 64 or 128 at compile time; the padding is zero, so any D <= 128 works.
//
// Speed, honestly: FMA on CUDA cores, no tensor cores (no mma/wgmma), so this runs well below
// cuDNN / FlashAttention-2. What it guarantees is memory: O(BH * T * D), never O(T^2).
// f16/bf16 at head dims 64 and 128 therefore go to the tensor-core kernels (attention_tc.cu),
// and f32 there too (in TF32 when kernels::set_allow_tf32, otherwise as TF32 pairs at f32's
// accuracy); these stay the reference and the fallback (other head dims, MG_ATTENTION_KERNEL=simt).
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cudnn_attention.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 4;                    // rows per warp
constexpr int kBlockRows = kWarps * kRows;  // rows per block
constexpr int kTile = 32;                   // entries of the other side per tile, one per lane
constexpr unsigned kFull = 0xffffffffu;

// dst[r * ld + d] = src row (r0 + r) (rows sp elements apart), column d, as f32, for r < n,
// d < kD; zero past len and D.
template <class T, int kD>
__device__ __forceinline__ void load_tile(float* dst, int ld, const T* src, int64_t sp, int64_t r0, int n, int64_t len,
                                          int D) {
  for (int e = threadIdx.x; e < n * kD; e += kThreads) {
    const int r = e / kD, d = e % kD;
    const int64_t i = r0 + r;
    dst[r * ld + d] = (i < len && d < D) ? load_m(src[i * sp + d]) : 0.f;
  }
}

// s[r] = a . b[r] over kD. `a` is this lane's own row (padded layout, one float at a time);
// the kRows rows b[r] = b + r * kD are the same for the whole warp (broadcast, float4).
template <int kD>
__device__ __forceinline__ void dot_rows(const float* a, const float* b, float (&s)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = 0.f;
#pragma unroll 4
  for (int d = 0; d < kD; d += 4) {
    const float a0 = a[d], a1 = a[d + 1], a2 = a[d + 2], a3 = a[d + 3];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 bv = *reinterpret_cast<const float4*>(b + r * kD + d);
      s[r] += a0 * bv.x + a1 * bv.y + a2 * bv.z + a3 * bv.w;
    }
  }
}

// acc[r] += sum over the tile's kTile rows jj of w[r] (lane jj's value) times row jj of
// `tile` (row stride kLd); each lane holds dims c * 32 + lane. P . V in the forward, dS . K
// for the backward's dq.
template <int kD, int kLd>
__device__ __forceinline__ void accumulate_rows(float (&acc)[kRows][kD / 32], const float (&w)[kRows],
                                                const float* tile) {
  constexpr int kC = kD / 32;
  const int lane = threadIdx.x & 31;
  for (int jj = 0; jj < kTile; ++jj) {
    float tv[kC];
#pragma unroll
    for (int c = 0; c < kC; ++c) tv[c] = tile[jj * kLd + c * 32 + lane];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float wj = __shfl_sync(kFull, w[r], jj);
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[r][c] += wj * tv[c];
    }
  }
}

// dst[(r0 + r) * sp + d] = acc[r][c] * mul for the warp's rows r0 + r < n and dims
// d = c * 32 + lane < D: the backward's dq, dk and dv.
template <class T, int kD>
__device__ __forceinline__ void store_rows(T* dst, int64_t sp, int64_t r0, int64_t n, int D,
                                           const float (&acc)[kRows][kD / 32], float mul) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = r0 + r;
    if (i >= n) continue;
#pragma unroll
    for (int c = 0; c < kD / 32; ++c) {
      const int d = c * 32 + lane;
      if (d < D) dst[i * sp + d] = store_m<T>(acc[r][c] * mul);
    }
  }
}

// ---------------------------------------------------------------- forward

template <int kD>
constexpr size_t fwd_smem_bytes() {
  return sizeof(float) * (kBlockRows * kD + kTile * (kD + 1) + kTile * kD);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                     float* __restrict__ lse, TcLayout lq, TcLayout lk, TcLayout lv, TcLayout lo, int64_t b0, int64_t L,
                     int64_t S, int D, float scale, bool causal) {
  constexpr int kC = kD / 32, kPad = kD + 1;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [kBlockRows][kD], broadcast
  float* Ks = Qs + kBlockRows * kD;             // [kTile][kPad], one row per lane
  float* Vs = Ks + kTile * kPad;                // [kTile][kD], lanes across d
  const int64_t bh = b0 + blockIdx.y;
  q += lq.head(bh), out += lo.head(bh), lse += bh * L;
  k += lk.head(bh), v += lv.head(bh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;  // the block's first query
  const int64_t iw = i0 + warp * kRows;                              // the warp's first query
  load_tile<T, kD>(Qs, kD, q, lq.sp, i0, kBlockRows, L, D);

  float m[kRows], l[kRows], acc[kRows][kC];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[r][c] = 0.f;
  }
  // Causal: no query of this block sees a key past its last query.
  const int64_t s_end = causal ? (S < i0 + kBlockRows ? S : i0 + kBlockRows) : S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and Qs is written before the first)
    load_tile<T, kD>(Ks, kPad, k, lk.sp, j0, kTile, S, D);
    load_tile<T, kD>(Vs, kD, v, lv.sp, j0, kTile, S, D);
    __syncthreads();
    float p[kRows];
    dot_rows<kD>(Ks + lane * kPad, Qs + warp * kRows * kD, p);
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool ok = j < S && (!causal || j <= iw + r);
      const float s = ok ? p[r] * scale : -INFINITY;
      // Key 0 is in the first tile and every query sees it, so m is finite from then on
      // and m - mn below is never (-inf) - (-inf).
      const float mn = fmaxf(m[r], warp_max(s));
      const float corr = expf(m[r] - mn);  // 0 on the first tile
      p[r] = expf(s - mn);
      l[r] = l[r] * corr + warp_sum(p[r]);
      m[r] = mn;
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[r][c] *= corr;
    }
    accumulate_rows<kD, kD>(acc, p, Vs);  // += P . V
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = iw + r;
    if (i >= L) continue;
    const float inv = 1.f / l[r];
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = c * 32 + lane;
      if (d < D) out[i * lo.sp + d] = store_m<T>(acc[r][c] * inv);
    }
    if (lane == 0) lse[i] = m[r] + logf(l[r]);
  }
}

// ---------------------------------------------------------------- backward

// delta[i] = sum_d out[i, d] * dout[i, d] for the rows i = bh * L + r, a warp per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                           TcLayout lo, TcLayout ldo, int64_t L, int64_t rows, int D) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (i >= rows) return;  // whole warps only
  const int lane = threadIdx.x & 31;
  const int64_t bh = i / L, r = i % L;
  out += lo.head(bh) + r * lo.sp, dout += ldo.head(bh) + r * ldo.sp;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s += load_m(out[d]) * load_m(dout[d]);
  s = warp_sum(s);
  if (lane == 0) delta[i] = s;
}

// The same with 16-byte loads, for 16-byte aligned rows whose D is a multiple of kV: G lanes
// per row (D / kV rounded up to a power of two, at most 32), 32 / G rows per warp. A warp per
// row moved 2 * 32 elements a load: GPT-2's head dim of 64 in bf16 ran at a quarter of the
// card's bandwidth.
template <class T>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_delta_vec_kernel(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                               TcLayout lo, TcLayout ldo, int64_t L, int64_t rows, int D, int G) {
  constexpr int kV = 16 / sizeof(T);
  const int lane = threadIdx.x & 31, g = lane % G;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * (32 / G) + lane / G;
  float s = 0.f;
  if (i < rows) {
    const int64_t bh = i / L, r = i % L;
    const T* o = out + lo.head(bh) + r * lo.sp;
    const T* d = dout + ldo.head(bh) + r * ldo.sp;
    for (int e = g * kV; e < D; e += G * kV) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + e), b = *reinterpret_cast<const uint4*>(d + e);
      const T* ae = reinterpret_cast<const T*>(&a);
      const T* be = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int k = 0; k < kV; ++k) s += load_m(ae[k]) * load_m(be[k]);
    }
  }
  for (int off = G / 2; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);  // within the row's group
  if (i < rows && g == 0) delta[i] = s;
}

template <int kD>
constexpr size_t bwd_smem_bytes() {  // two broadcast row blocks + two padded tiles (both passes)
  return sizeof(float) * (2 * kBlockRows * kD + 2 * kTile * (kD + 1));
}

// Rows = keys [j0, j0 + 16), tiles of queries; writes dk and dv of the block's keys.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                          T* __restrict__ dk, T* __restrict__ dv, TcLayout lq, TcLayout lk, TcLayout lv, TcLayout ldo,
                          TcLayout ldk, TcLayout ldv, int64_t b0, int64_t L, int64_t S, int D, float scale,
                          bool causal) {
  constexpr int kC = kD / 32, kPad = kD + 1;
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [kBlockRows][kD], broadcast
  float* Vs = Ks + kBlockRows * kD;             // [kBlockRows][kD], broadcast
  float* Qs = Vs + kBlockRows * kD;             // [kTile][kPad], one row per lane, then lanes across d
  float* Os = Qs + kTile * kPad;                // [kTile][kPad], dout likewise
  const int64_t bh = b0 + blockIdx.y;
  q += lq.head(bh), dout += ldo.head(bh), lse += bh * L, delta += bh * L;
  k += lk.head(bh), v += lv.head(bh), dk += ldk.head(bh), dv += ldv.head(bh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;  // the block's first key
  const int64_t jw = j0 + warp * kRows;                              // the warp's first key
  load_tile<T, kD>(Ks, kD, k, lk.sp, j0, kBlockRows, S, D);
  load_tile<T, kD>(Vs, kD, v, lv.sp, j0, kBlockRows, S, D);

  float gk[kRows][kC], gv[kRows][kC];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kC; ++c) gk[r][c] = gv[r][c] = 0.f;
  // Causal: queries before j0 see none of the block's keys.
  const int64_t i_begin = causal ? j0 / kTile * kTile : 0;
  for (int64_t i0 = i_begin; i0 < L; i0 += kTile) {
    __syncthreads();
    load_tile<T, kD>(Qs, kPad, q, lq.sp, i0, kTile, L, D);
    load_tile<T, kD>(Os, kPad, dout, ldo.sp, i0, kTile, L, D);
    __syncthreads();
    const int64_t i = i0 + lane;  // this lane's query
    const bool row_ok = i < L;
    const float lse_i = row_ok ? lse[i] : 0.f, delta_i = row_ok ? delta[i] : 0.f;
    float p[kRows], ds[kRows];
    dot_rows<kD>(Qs + lane * kPad, Ks + warp * kRows * kD, p);   // q_i . k_j
    dot_rows<kD>(Os + lane * kPad, Vs + warp * kRows * kD, ds);  // dout_i . v_j
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t j = jw + r;
      const bool ok = row_ok && j < S && (!causal || j <= i);
      p[r] = ok ? expf(p[r] * scale - lse_i) : 0.f;
      ds[r] = p[r] * (ds[r] - delta_i);
    }
    for (int ii = 0; ii < kTile; ++ii) {
      float qv[kC], ov[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) qv[c] = Qs[ii * kPad + c * 32 + lane], ov[c] = Os[ii * kPad + c * 32 + lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float pi = __shfl_sync(kFull, p[r], ii), dsi = __shfl_sync(kFull, ds[r], ii);
#pragma unroll
        for (int c = 0; c < kC; ++c) gv[r][c] += pi * ov[c], gk[r][c] += dsi * qv[c];
      }
    }
  }
  store_rows<T, kD>(dk, ldk.sp, jw, S, D, gk, scale);
  store_rows<T, kD>(dv, ldv.sp, jw, S, D, gv, 1.f);
}

// Rows = queries [i0, i0 + 16), tiles of keys; writes dq of the block's queries.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                        T* __restrict__ dq, TcLayout lq, TcLayout lk, TcLayout lv, TcLayout ldo, TcLayout ldq,
                        int64_t b0, int64_t L, int64_t S, int D, float scale, bool causal) {
  constexpr int kC = kD / 32, kPad = kD + 1;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [kBlockRows][kD], broadcast
  float* Os = Qs + kBlockRows * kD;             // [kBlockRows][kD], dout, broadcast
  float* Ks = Os + kBlockRows * kD;             // [kTile][kPad], one row per lane, then lanes across d
  float* Vs = Ks + kTile * kPad;                // [kTile][kPad], one row per lane
  const int64_t bh = b0 + blockIdx.y;
  q += lq.head(bh), dout += ldo.head(bh), dq += ldq.head(bh), lse += bh * L, delta += bh * L;
  k += lk.head(bh), v += lv.head(bh);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t iw = i0 + warp * kRows;
  load_tile<T, kD>(Qs, kD, q, lq.sp, i0, kBlockRows, L, D);
  load_tile<T, kD>(Os, kD, dout, ldo.sp, i0, kBlockRows, L, D);

  float lse_r[kRows], delta_r[kRows], acc[kRows][kC];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = iw + r;
    lse_r[r] = i < L ? lse[i] : 0.f, delta_r[r] = i < L ? delta[i] : 0.f;
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[r][c] = 0.f;
  }
  const int64_t s_end = causal ? (S < i0 + kBlockRows ? S : i0 + kBlockRows) : S;
  for (int64_t j0 = 0; j0 < s_end; j0 += kTile) {
    __syncthreads();
    load_tile<T, kD>(Ks, kPad, k, lk.sp, j0, kTile, S, D);
    load_tile<T, kD>(Vs, kPad, v, lv.sp, j0, kTile, S, D);
    __syncthreads();
    const int64_t j = j0 + lane;  // this lane's key
    float p[kRows], ds[kRows];
    dot_rows<kD>(Ks + lane * kPad, Qs + warp * kRows * kD, p);   // q_i . k_j
    dot_rows<kD>(Vs + lane * kPad, Os + warp * kRows * kD, ds);  // dout_i . v_j
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = iw + r;
      const bool ok = i < L && j < S && (!causal || j <= i);
      p[r] = ok ? expf(p[r] * scale - lse_r[r]) : 0.f;
      ds[r] = p[r] * (ds[r] - delta_r[r]);
    }
    accumulate_rows<kD, kPad>(acc, ds, Ks);  // += dS . K
  }
  store_rows<T, kD>(dq, ldq.sp, iw, L, D, acc, scale);
}

// ---------------------------------------------------------------- host side

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}, std::integral_constant<int, kD>{}) for the element type and the
// head-dim bucket (32, 64, 128): the only instantiations there are.
template <class F>
void dispatch(DType dt, int64_t D, const char* op, F&& f) {
  MG_CHECK(D >= 1 && D <= kFlashAttentionMaxHeadDim, ShapeError, op, ": head dim must be in [1, ",
           kFlashAttentionMaxHeadDim, "], got ", D);
  auto by_dim = [&](auto tag) {
    if (D <= 32)
      f(tag, std::integral_constant<int, 32>{});
    else if (D <= 64)
      f(tag, std::integral_constant<int, 64>{});
    else
      f(tag, std::integral_constant<int, 128>{});
  };
  switch (dt) {
    case DType::f32:
      by_dim(TypeTag<float>{});
      break;
    case DType::f16:
      by_dim(TypeTag<__half>{});
      break;
    case DType::bf16:
      by_dim(TypeTag<__nv_bfloat16>{});
      break;
    default:
      MG_THROW(DTypeError, op, ": expected f32, f16 or bf16, got ", dt);
  }
}

// Runs launch(first_bh, count) over chunks of at most 65535 heads (the grid's y limit).
template <class F>
void for_head_chunks(int64_t BH, F&& launch) {
  constexpr int64_t kMaxY = 65535;
  for (int64_t b0 = 0; b0 < BH; b0 += kMaxY) launch(b0, static_cast<unsigned>(BH - b0 < kMaxY ? BH - b0 : kMaxY));
}

unsigned row_blocks(int64_t rows, int per_block, const char* op) {
  const int64_t b = (rows + per_block - 1) / per_block;
  MG_CHECK(b <= 0x7fffffff, ShapeError, op, ": sequence too long (", rows, ")");
  return static_cast<unsigned>(b);
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// t [B, H, n, D] with a unit-stride head dim, as the kernels' row layout.
TcLayout layout_of(const Tensor& t) { return TcLayout{t.size(1), t.stride(0), t.stride(1), t.stride(2)}; }

// The tensor-core element type: f32 in TF32 when allowed, otherwise as TF32 pairs (three
// products, f32's accuracy class).
TcElem tc_elem(DType dt) {
  if (dt == DType::f32) return allow_tf32() ? TcElem::tf32 : TcElem::f32x3;
  return dt == DType::bf16 ? TcElem::bf16 : TcElem::f16;
}

// The tensor-core kernels copy rows 16 bytes at a time (tc_layout_aligned).
bool aligned16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!tc_layout_aligned(t->raw_data(), layout_of(*t))) return false;
  return true;
}

// Where cuDNN declines a configuration: the tensor-core kernels at their head dims, SIMT otherwise.
AttentionKernel tc_fallback(int64_t D) {
  return attention_tc_head_dim_ok(D) ? AttentionKernel::FlashTensorCore : AttentionKernel::FlashSimt;
}

}  // namespace

template <>
void CudaBackend::flash_attention_forward(AttentionKernel kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                                          bool causal, double scale, const Tensor& out, const Tensor& lse) {
  const char* op = "flash_attention_forward";
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), S = k.size(2), D = q.size(3);
  if (BH == 0 || L == 0) return;
  MG_CHECK(S >= 1, ShapeError, op, ": needs at least one key");
  mg::cuda::DeviceGuard guard(q.device());
  cudaStream_t st = stream_of(q);
  // kernels/attention.cc chose the kernel and aligned the views; a misaligned one still runs SIMT.
  if (kernel == AttentionKernel::FlashCudnn) {
    if (aligned16({&q, &k, &v, &out}) && cudnn_attention_forward(q, k, v, causal, static_cast<float>(scale), out, lse))
      return;
    kernel = tc_fallback(D);
  }
  if (kernel == AttentionKernel::FlashTensorCore && aligned16({&q, &k, &v, &out})) {
    const TcForwardArgs a{tc_elem(q.dtype()),
                          q.raw_data(),
                          k.raw_data(),
                          v.raw_data(),
                          out.raw_data(),
                          ptr<float>(lse),
                          BH,
                          L,
                          S,
                          static_cast<int>(D),
                          static_cast<float>(scale),
                          causal,
                          layout_of(q),
                          layout_of(k),
                          layout_of(v),
                          layout_of(out)};
    MG_CUDA_CHECK(attention_tc_forward(a, st));
    return;
  }
  dispatch(q.dtype(), D, op, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int kD = decltype(dim)::value;
    constexpr size_t smem = fwd_smem_bytes<kD>();
    allow_smem(flash_fwd_kernel<T, kD>, smem);
    const unsigned gx = row_blocks(L, kBlockRows, op);
    for_head_chunks(BH, [&](int64_t b0, unsigned nb) {
      flash_fwd_kernel<T, kD><<<dim3(gx, nb), kThreads, smem, st>>>(
          ptr<const T>(q), ptr<const T>(k), ptr<const T>(v), ptr<T>(out), ptr<float>(lse), layout_of(q), layout_of(k),
          layout_of(v), layout_of(out), b0, L, S, static_cast<int>(D), static_cast<float>(scale), causal);
      MG_CUDA_CHECK_LAUNCH(op);
    });
  });
}

template <>
void CudaBackend::flash_attention_backward(AttentionKernel kernel, const Tensor& grad_out, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                           bool causal, double scale, const Tensor& grad_q, const Tensor& grad_k,
                                           const Tensor& grad_v, bool one_pass) {
  const char* op = "flash_attention_backward";
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), S = k.size(2), D = q.size(3);
  if (BH == 0 || S == 0) return;
  mg::cuda::DeviceGuard guard(q.device());
  if (kernel == AttentionKernel::FlashCudnn) {
    if (L > 0 && aligned16({&grad_out, &q, &k, &v, &out, &grad_q, &grad_k, &grad_v}) &&
        cudnn_attention_backward(grad_out, q, k, v, out, lse, causal, static_cast<float>(scale), grad_q, grad_k,
                                 grad_v))
      return;
    kernel = tc_fallback(D);
  }
  cudaStream_t st = stream_of(q);
  Tensor delta = empty({BH, L}, {DType::f32, q.device()});
  dispatch(q.dtype(), D, op, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int kD = decltype(dim)::value;
    const int Di = static_cast<int>(D);
    const float sc = static_cast<float>(scale);
    if (L > 0) {
      constexpr int kV = 16 / sizeof(T);
      if (Di % kV == 0 && aligned16({&out, &grad_out})) {
        int G = 1;
        while (G < 32 && G * kV < Di) G *= 2;
        flash_bwd_delta_vec_kernel<T><<<row_blocks(BH * L, kWarps * (32 / G), op), kThreads, 0, st>>>(
            ptr<const T>(out), ptr<const T>(grad_out), ptr<float>(delta), layout_of(out), layout_of(grad_out), L,
            BH * L, Di, G);
      } else {
        flash_bwd_delta_kernel<T><<<row_blocks(BH * L, kWarps, op), kThreads, 0, st>>>(
            ptr<const T>(out), ptr<const T>(grad_out), ptr<float>(delta), layout_of(out), layout_of(grad_out), L,
            BH * L, Di);
      }
      MG_CUDA_CHECK_LAUNCH(op);
    }
    if (kernel == AttentionKernel::FlashTensorCore && aligned16({&grad_out, &q, &k, &v, &grad_q, &grad_k, &grad_v})) {
      TcBackwardArgs a{tc_elem(q.dtype()),
                       q.raw_data(),
                       k.raw_data(),
                       v.raw_data(),
                       grad_out.raw_data(),
                       ptr<const float>(lse),
                       ptr<const float>(delta),
                       grad_q.raw_data(),
                       grad_k.raw_data(),
                       grad_v.raw_data(),
                       BH,
                       L,
                       S,
                       Di,
                       sc,
                       causal,
                       layout_of(q),
                       layout_of(k),
                       layout_of(v),
                       layout_of(grad_out),
                       layout_of(grad_q),
                       layout_of(grad_k),
                       layout_of(grad_v)};
      Tensor dq_acc;  // the one pass's f32 dq sums (16-byte aligned: the allocator's blocks are 512)
      if (L > 0 && one_pass && attention_tc_one_pass_pays(a.elem, Di)) {
        dq_acc = empty({BH, L, D}, {DType::f32, q.device()});
        a.dq_acc = ptr<float>(dq_acc);
      }
      MG_CUDA_CHECK(attention_tc_backward(a, st));
      return;
    }
    constexpr size_t smem = bwd_smem_bytes<kD>();
    allow_smem(flash_bwd_dkdv_kernel<T, kD>, smem);
    allow_smem(flash_bwd_dq_kernel<T, kD>, smem);
    const TcLayout lq = layout_of(q), lk = layout_of(k), lv = layout_of(v), ldo = layout_of(grad_out);
    for_head_chunks(BH, [&](int64_t b0, unsigned nb) {
      // With L == 0 this still runs and writes dk = dv = 0.
      flash_bwd_dkdv_kernel<T, kD><<<dim3(row_blocks(S, kBlockRows, op), nb), kThreads, smem, st>>>(
          ptr<const T>(q), ptr<const T>(k), ptr<const T>(v), ptr<const T>(grad_out), ptr<const float>(lse),
          ptr<const float>(delta), ptr<T>(grad_k), ptr<T>(grad_v), lq, lk, lv, ldo, layout_of(grad_k),
          layout_of(grad_v), b0, L, S, Di, sc, causal);
      MG_CUDA_CHECK_LAUNCH(op);
      if (L == 0) return;
      flash_bwd_dq_kernel<T, kD><<<dim3(row_blocks(L, kBlockRows, op), nb), kThreads, smem, st>>>(
          ptr<const T>(q), ptr<const T>(k), ptr<const T>(v), ptr<const T>(grad_out), ptr<const float>(lse),
          ptr<const float>(delta), ptr<T>(grad_q), lq, lk, lv, ldo, layout_of(grad_q), b0, L, S, Di, sc, causal);
      MG_CUDA_CHECK_LAUNCH(op);
    });
  });
}

}  // namespace mg::kernels
