// Layer norm on CUDA, llm.c style: x viewed as [M, N] rows, statistics in f32 (f64 for f64).
//
// Forward, two kernels with one contract (out, mean, rstd):
//   - the obvious one, a thread per row (llm.c's layernorm_forward_kernel1), kept as the
//     reference the fused kernel is tested against;
//   - the one used, a warp per row: mean, then variance from the deviations (two passes
//     over a row that sits in L1 after the first), then the normalized row, all in f32.
// Backward: a warp per row writes dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat));
// dweight = sum over rows of g * xhat and dbias = sum of g are column sums, taken without
// atomics in two steps (a grid of row chunks writes f32 partial sums, one more kernel adds
// the chunks in a fixed order), so results are deterministic.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/reference.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each

template <class T>
__device__ __forceinline__ math_t<T> opt(const T* p, int64_t j, math_t<T> dflt) {
  return p ? load_m(p[j]) : dflt;
}

// ---------------------------------------------------------------- forward

template <class T>
__global__ void ln_fwd_reference_kernel(const T* x, const T* w, const T* b, T* out, math_t<T>* mean, math_t<T>* rstd,
                                        int64_t rows, int64_t n, double eps) {
  using A = math_t<T>;
  MG_GRID_STRIDE(i, rows) {
    const T* xr = x + i * n;
    A s = 0;
    for (int64_t j = 0; j < n; ++j) s += load_m(xr[j]);
    const A m = s / static_cast<A>(n);
    A v = 0;
    for (int64_t j = 0; j < n; ++j) {
      const A d = load_m(xr[j]) - m;
      v += d * d;
    }
    const A r = A(1) / m_sqrt(v / static_cast<A>(n) + static_cast<A>(eps));
    mean[i] = m;
    rstd[i] = r;
    for (int64_t j = 0; j < n; ++j)
      out[i * n + j] = store_m<T>((load_m(xr[j]) - m) * r * opt(w, j, A(1)) + opt(b, j, A(0)));
  }
}

template <class T>
__global__ void ln_fwd_kernel(const T* x, const T* w, const T* b, T* out, math_t<T>* mean, math_t<T>* rstd,
                              int64_t rows, int64_t n, double eps) {
  using A = math_t<T>;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.y;
  if (i >= rows) return;  // whole warps only: no block-wide sync below
  const int lane = threadIdx.x;
  const T* xr = x + i * n;
  A s = 0;
  for (int64_t j = lane; j < n; j += 32) s += load_m(xr[j]);
  const A m = warp_sum(s) / static_cast<A>(n);
  A v = 0;
  for (int64_t j = lane; j < n; j += 32) {
    const A d = load_m(xr[j]) - m;
    v += d * d;
  }
  const A r = A(1) / m_sqrt(warp_sum(v) / static_cast<A>(n) + static_cast<A>(eps));
  if (lane == 0) {
    mean[i] = m;
    rstd[i] = r;
  }
  T* yr = out + i * n;
  for (int64_t j = lane; j < n; j += 32)
    yr[j] = store_m<T>((load_m(xr[j]) - m) * r * opt(w, j, A(1)) + opt(b, j, A(0)));
}

// The same row held in registers and moved 16 bytes at a time, for rows of up to 32 * V * NV
// elements (V per 16-byte vector, NV vectors a lane) whose length is a multiple of V, with
// 16-byte aligned x, out, weight and bias: one read of x instead of three (the scalar kernel ran
// at 0.6 of a copy's bandwidth over GPT-2's 768 in f16/bf16).
template <class T, int NV>
__global__ void ln_fwd_regs_kernel(const T* x, const T* w, const T* b, T* out, math_t<T>* mean, math_t<T>* rstd,
                                   int64_t rows, int64_t n, double eps) {
  using A = math_t<T>;
  constexpr int V = kVec16<T>;
  using Vec = AlignedVec<T, V>;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.y;
  if (i >= rows) return;  // whole warps only
  const int lane = threadIdx.x, nv = static_cast<int>(n / V);
  Vec row[NV];
  load_warp_row<V, NV>(x + i * n, nv, lane, row);
  A s = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if (lane + 32 * j < nv)
#pragma unroll
      for (int k = 0; k < V; ++k) s += unpack_m(row[j], k);
  const A m = warp_sum(s) / static_cast<A>(n);
  A var = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if (lane + 32 * j < nv)
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A d = unpack_m(row[j], k) - m;
        var += d * d;
      }
  const A r = A(1) / m_sqrt(warp_sum(var) / static_cast<A>(n) + static_cast<A>(eps));
  if (lane == 0) {
    mean[i] = m;
    rstd[i] = r;
  }
  Vec* yv = reinterpret_cast<Vec*>(out + i * n);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = lane + 32 * j;
    if (c < nv) {
      Vec o, wv, bv;
      if (w) wv = reinterpret_cast<const Vec*>(w)[c];
      if (b) bv = reinterpret_cast<const Vec*>(b)[c];
#pragma unroll
      for (int k = 0; k < V; ++k)
        o.v[k] =
            store_m<T>((unpack_m(row[j], k) - m) * r * (w ? unpack_m(wv, k) : A(1)) + (b ? unpack_m(bv, k) : A(0)));
      yv[c] = o;
    }
  }
}

// ---------------------------------------------------------------- residual add fused in
// The pre-LN block's `h = x + branch; y = ln(h)` over an f32 residual stream: one pass reads
// x and the (half-precision) branch output, writes h and y already in the consumer's dtype.
// Same per-row math as ln_fwd_kernel; h is re-read from the row this thread just wrote.

// A weight / bias chunk, or `dflt` when the tensor is absent.
template <int kV>
__device__ __forceinline__ void load_or(const float* p, int64_t j, float dflt, float (&out)[kV]) {
  if (p) {
    load_v<kV>(p + j, out);
  } else {
#pragma unroll
    for (int k = 0; k < kV; ++k) out[k] = dflt;
  }
}

// The residual-stream norm's per-element arithmetic, each rounding spelled out, so that the
// kernels below that compute it (add_ln_fwd_kernel, add_ln_fp8_kernel) agree bit for bit whatever
// the compiler would contract: acc + (v - m)^2, and (v - m) * r * w + b.
__device__ __forceinline__ float deviation_sq(float v, float m, float acc) {
  const float d = __fsub_rn(v, m);
  return __fmaf_rn(d, d, acc);
}
__device__ __forceinline__ float normalized(float v, float m, float r, float w, float b) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(v, m), r), w, b);
}

// Lane l handles elements [kV (l + 32 t), kV (l + 32 t) + kV) of its row: kV = 4 when n % 4 == 0
// and every tensor is aligned to 4 elements (the launcher checks), 1 otherwise. rb (the
// branch's bias, or null) is added after the branch: h = (x + res) + rb.
template <int kV, class R, class O>
__global__ void add_ln_fwd_kernel(const float* x, const R* res, const float* rb, const float* w, const float* b,
                                  float* sum, O* out, float* mean, float* rstd, int64_t rows, int64_t n, double eps) {
  wait_for_previous();  // launched dependent: the branch is mostly the GEMM ahead's output
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.y;
  if (i >= rows) return;  // whole warps only: no block-wide sync below
  const int64_t step = 32 * kV, j0 = threadIdx.x * kV;
  const float* xr = x + i * n;
  float* hr = res ? sum + i * n : nullptr;
  float s = 0;
  for (int64_t j = j0; j < n; j += step) {
    float v[kV];
    load_v<kV>(xr + j, v);
    if (res) {
      float r[kV];
      load_v<kV>(res + i * n + j, r);
#pragma unroll
      for (int k = 0; k < kV; ++k) v[k] += r[k];
      if (rb) {
        load_v<kV>(rb + j, r);
#pragma unroll
        for (int k = 0; k < kV; ++k) v[k] += r[k];
      }
      store_v<kV>(hr + j, v);
    }
#pragma unroll
    for (int k = 0; k < kV; ++k) s += v[k];
  }
  const float* h = res ? hr : xr;
  const float m = warp_sum(s) / static_cast<float>(n);
  float var = 0;
  for (int64_t j = j0; j < n; j += step) {
    float v[kV];
    load_v<kV>(h + j, v);
#pragma unroll
    for (int k = 0; k < kV; ++k) var = deviation_sq(v[k], m, var);
  }
  const float r = 1.0f / m_sqrt(warp_sum(var) / static_cast<float>(n) + static_cast<float>(eps));
  if (threadIdx.x == 0) {
    mean[i] = m;
    rstd[i] = r;
  }
  O* yr = out + i * n;
  for (int64_t j = j0; j < n; j += step) {
    float v[kV], wv[kV], bv[kV];
    load_v<kV>(h + j, v);
    load_or<kV>(w, j, 1.0f, wv);
    load_or<kV>(b, j, 0.0f, bv);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = normalized(v[k], m, r, wv[k], bv[k]);
    store_v<kV>(yr + j, v);
  }
}

// add_ln_fwd_kernel<4, R, O>'s rows cast for the FP8 linear that reads them, as
// fp8_quantize_transpose_delayed casts the rows it writes: each normalized value rounded to O, its
// code written into q [rows, n] and qt [n, rows] (either may be null) with the history's scale,
// its |value| into the history's slot; the rows are never written in O. A block of 8 warps takes
// kNormRows rows, a warp a row at a time held in registers (kIters * 128 >= n elements, 4 a lane
// as add_ln_fwd_kernel<4> reads them, so the sums add in its order), and keeps their codes in
// shared memory ([kNormRows][n + 4] bytes) for the transpose, where each column's kNormRows codes
// are 32 consecutive bytes of qt, written 4 rows a word.
constexpr int kNormRows = 32;
static_assert(32 * kRowsPerBlock == fp8_tile::kTile * fp8_tile::kTileRows,
              "fp8_tile::tile_amax_to_history reduces over a tile kernel's block");
template <int kIters, class R, class O>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    add_ln_fp8_kernel(const float* x, const R* res, const float* rb, const float* w, const float* b, float* sum,
                      float* mean, float* rstd, int64_t rows, int64_t n, double eps, __nv_fp8_interpretation_t kind,
                      uint8_t* q, uint8_t* qt, fp8_tile::Delayed d) {
  extern __shared__ __align__(16) uint8_t codes[];
  const int64_t pitch = n + 4;  // 4-byte aligned rows (n % 16 == 0): a word at a time
  wait_for_previous();          // launched dependent: the branch is mostly the GEMM ahead's output
  const float s = fp8_tile::tile_scale(nullptr, d);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kNormRows;
  unsigned amax = 0;
  for (int rr = threadIdx.y; rr < kNormRows && r0 + rr < rows; rr += kRowsPerBlock) {
    const int64_t i = r0 + rr;
    float v[kIters][4];
    float sm = 0;
#pragma unroll
    for (int t = 0; t < kIters; ++t) {
      const int64_t j = 4 * (threadIdx.x + 32 * t);
      if (j < n) {
        load_v<4>(x + i * n + j, v[t]);
        if (res) {
          float r[4];
          load_v<4>(res + i * n + j, r);
#pragma unroll
          for (int k = 0; k < 4; ++k) v[t][k] += r[k];
          if (rb) {
            load_v<4>(rb + j, r);
#pragma unroll
            for (int k = 0; k < 4; ++k) v[t][k] += r[k];
          }
          store_v<4>(sum + i * n + j, v[t]);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) sm += v[t][k];
      }
    }
    const float m = warp_sum(sm) / static_cast<float>(n);
    float var = 0;
#pragma unroll
    for (int t = 0; t < kIters; ++t)
      if (4 * (threadIdx.x + 32 * t) < n) {
#pragma unroll
        for (int k = 0; k < 4; ++k) var = deviation_sq(v[t][k], m, var);
      }
    const float r = 1.0f / m_sqrt(warp_sum(var) / static_cast<float>(n) + static_cast<float>(eps));
    if (threadIdx.x == 0) {
      mean[i] = m;
      rstd[i] = r;
    }
#pragma unroll
    for (int t = 0; t < kIters; ++t) {
      const int64_t j = 4 * (threadIdx.x + 32 * t);
      if (j < n) {
        float wv[4], bv[4];
        load_or<4>(w, j, 1.0f, wv);
        load_or<4>(b, j, 0.0f, bv);
        uint32_t word = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float y = load_m(store_m<O>(normalized(v[t][k], m, r, wv[k], bv[k])));  // as O holds it
          amax = max(amax, fp8_tile::abs_bits(y));
          word |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(y * s, __NV_SATFINITE, kind)) << (8 * k);
        }
        if (q) *reinterpret_cast<uint32_t*>(q + i * n + j) = word;
        *reinterpret_cast<uint32_t*>(codes + rr * pitch + j) = word;
      }
    }
  }
  fp8_tile::tile_amax_to_history(amax, d);
  if (!qt) return;
  __syncthreads();
  const int64_t here = rows - r0 < kNormRows ? rows - r0 : kNormRows;  // a multiple of 4 (the launcher checks)
  constexpr int kGroups = kNormRows / 4;
  for (int64_t item = fp8_tile::tile_thread(); item < n * kGroups; item += 32 * kRowsPerBlock) {
    const int64_t c = item / kGroups;
    const int g = static_cast<int>(item % kGroups);
    if (4 * g < here) {
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) word |= static_cast<uint32_t>(codes[(4 * g + k) * pitch + c]) << (8 * k);
      *reinterpret_cast<uint32_t*>(qt + c * rows + r0 + 4 * g) = word;
    }
  }
}

// One lane's kV elements of a row's two backward sums: sg += g*w, sgx += g*w * xhat.
template <int kV, class G>
__device__ __forceinline__ void add_row_sums(const G* gr, const float* hr, const float* w, int64_t j, float m, float r,
                                             float& sg, float& sgx) {
  float gv[kV], hv[kV], wv[kV];
  load_v<kV>(gr + j, gv);
  load_v<kV>(hr + j, hv);
  load_or<kV>(w, j, 1.0f, wv);
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    const float gw = gv[k] * wv[k];
    sg += gw;
    sgx += gw * (hv[k] - m) * r;
  }
}

// One lane's kV elements of dh = grad_sum + rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)),
// stored in f32 (dx) and the branch's dtype (dx_low) where given; g, xhat and dh are handed
// back for the callers that also sum the parameters' gradients.
template <int kV, class G, class L>
__device__ __forceinline__ void store_row_dh(const G* gr, const float* hr, const float* w, const float* gsum_r,
                                             float* dx_r, L* dx_low_r, int64_t j, float m, float r, float mean_g,
                                             float mean_gx, float (&gv)[kV], float (&xhat)[kV], float (&d)[kV]) {
  float hv[kV], wv[kV];
  load_v<kV>(gr + j, gv);
  load_v<kV>(hr + j, hv);
  load_or<kV>(w, j, 1.0f, wv);
  if (gsum_r) {
    load_v<kV>(gsum_r + j, d);
  } else {
#pragma unroll
    for (int k = 0; k < kV; ++k) d[k] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    xhat[k] = (hv[k] - m) * r;
    d[k] += r * (gv[k] * wv[k] - mean_g - xhat[k] * mean_gx);
  }
  if (dx_r) store_v<kV>(dx_r + j, d);
  if (dx_low_r) store_v<kV>(dx_low_r + j, d);
}

// dh written in f32 (dx) and, for the half-precision branch, in its dtype (dx_low): the
// residual add's backward and the cast of the branch's gradient in the same pass.
template <int kV, class G, class L>
__global__ void add_ln_bwd_dx_kernel(const G* g, const float* gsum, const float* h, const float* mean,
                                     const float* rstd, const float* w, float* dx, L* dx_low, int64_t rows, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.y;
  if (i >= rows) return;
  const int64_t step = 32 * kV, j0 = threadIdx.x * kV;
  const G* gr = g + i * n;
  const float* hr = h + i * n;
  const float m = mean[i], r = rstd[i];
  float sg = 0, sgx = 0;
  for (int64_t j = j0; j < n; j += step) add_row_sums<kV>(gr, hr, w, j, m, r, sg, sgx);
  const float mean_g = warp_sum(sg) / static_cast<float>(n), mean_gx = warp_sum(sgx) / static_cast<float>(n);
  for (int64_t j = j0; j < n; j += step) {
    float gv[kV], xhat[kV], d[kV];
    store_row_dh<kV>(gr, hr, w, gsum ? gsum + i * n : nullptr, dx ? dx + i * n : nullptr,
                     dx_low ? dx_low + i * n : nullptr, j, m, r, mean_g, mean_gx, gv, xhat, d);
  }
}

// add_ln_bwd_dx_kernel with the weight and bias gradients in the same pass, for rows of n =
// 128 kG elements (kV = 4 a lane, kG groups): each warp walks rows i = warp, warp + warps, ...
// of the grid, adds g * xhat and g for its 4 kG columns in registers, the block adds its 8
// warps' sums in shared memory in a fixed order and writes one chunk of the partials
// (partial[0][block][j] dweight, partial[1][block][j] dbias) for ln_bwd_params_final_kernel.
// It saves the separate partial-sum pass's second read of g and h (0.37 ms of a GPT-2 124M
// step at B=8, 25 calls). Deterministic: rows go to warps and sums are added in a fixed order.
// With `branch_bias` the column sums of dh (the gradient of the branch's bias, which the
// forward added here) are partial[2]: each warp adds its rows' dh into its own row of the
// shared buffer as it goes (registers would cost the kernel a block an SM), so the bias no
// longer needs a column reduction of the branch's gradient of its own.
template <int kG, class G, class L>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    add_ln_bwd_fused_kernel(const G* g, const float* gsum, const float* h, const float* mean, const float* rstd,
                            const float* w, float* dx, L* dx_low, float* partial, bool branch_bias, int64_t rows) {
  constexpr int kV = 4;
  constexpr int64_t n = 128 * kG;
  __shared__ __align__(16) float red[kRowsPerBlock][n];
  const int lane = threadIdx.x, warp = threadIdx.y;
  // A lane's kV columns of its warp's row of red, as one 16-byte vector.
  const auto red_at = [&](int t) -> float4& { return *reinterpret_cast<float4*>(&red[warp][(lane + 32 * t) * kV]); };
  if (branch_bias)
#pragma unroll
    for (int t = 0; t < kG; ++t) red_at(t) = make_float4(0.f, 0.f, 0.f, 0.f);
  float dw[kG][kV] = {}, db[kG][kV] = {};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + warp; i < rows;
       i += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const G* gr = g + i * n;
    const float* hr = h + i * n;
    const float m = mean[i], r = rstd[i];
    float sg = 0, sgx = 0;
#pragma unroll
    for (int t = 0; t < kG; ++t) add_row_sums<kV>(gr, hr, w, (lane + 32 * t) * kV, m, r, sg, sgx);
    const float mean_g = warp_sum(sg) / static_cast<float>(n), mean_gx = warp_sum(sgx) / static_cast<float>(n);
#pragma unroll
    for (int t = 0; t < kG; ++t) {
      float gv[kV], xhat[kV], d[kV];
      store_row_dh<kV>(gr, hr, w, gsum ? gsum + i * n : nullptr, dx ? dx + i * n : nullptr,
                       dx_low ? dx_low + i * n : nullptr, (lane + 32 * t) * kV, m, r, mean_g, mean_gx, gv, xhat, d);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        dw[t][k] += gv[k] * xhat[k];
        db[t][k] += gv[k];
      }
      if (branch_bias) {  // a lane's own columns of its warp's row: no other thread touches them
        float4& acc = red_at(t);
        acc.x += d[0], acc.y += d[1], acc.z += d[2], acc.w += d[3];
      }
    }
  }
  allow_dependents();  // the parameters' finalize may be scheduled; it waits for this kernel
  if (!partial) return;
  // The 8 warps' sums through one buffer, the branch bias's (already there) first, then
  // dweight and dbias: thread (x, y) adds column x + 32 c for c = y, y + 8, ... over the warps
  // in order.
  float* out = partial + static_cast<int64_t>(blockIdx.x) * n;
  constexpr int kOrder[3] = {2, 0, 1};
#pragma unroll
  for (int o = 0; o < 3; ++o) {
    const int part = kOrder[o];
    if (part == 2 && !branch_bias) continue;
    if (part != 2) {
#pragma unroll
      for (int t = 0; t < kG; ++t)
#pragma unroll
        for (int k = 0; k < kV; ++k) red[warp][(lane + 32 * t) * kV + k] = part == 0 ? dw[t][k] : db[t][k];
    }
    __syncthreads();
    for (int64_t c = warp; c < n / 32; c += kRowsPerBlock) {
      const int64_t j = lane + 32 * c;
      float s = 0;
#pragma unroll
      for (int y = 0; y < kRowsPerBlock; ++y) s += red[y][j];
      out[static_cast<int64_t>(part) * gridDim.x * n + j] = s;
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------- backward

template <class T>
__global__ void ln_bwd_dx_kernel(const T* g, const T* x, const math_t<T>* mean, const math_t<T>* rstd, const T* w,
                                 T* dx, int64_t rows, int64_t n) {
  using A = math_t<T>;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.y;
  if (i >= rows) return;
  const int lane = threadIdx.x;
  const T* gr = g + i * n;
  const T* xr = x + i * n;
  const A m = mean[i], r = rstd[i];
  A sg = 0, sgx = 0;
  for (int64_t j = lane; j < n; j += 32) {
    const A gw = load_m(gr[j]) * opt(w, j, A(1));
    sg += gw;
    sgx += gw * (load_m(xr[j]) - m) * r;
  }
  const A mean_g = warp_sum(sg) / static_cast<A>(n), mean_gx = warp_sum(sgx) / static_cast<A>(n);
  T* dr = dx + i * n;
  for (int64_t j = lane; j < n; j += 32) {
    const A gw = load_m(gr[j]) * opt(w, j, A(1));
    const A xhat = (load_m(xr[j]) - m) * r;
    dr[j] = store_m<T>(r * (gw - mean_g - xhat * mean_gx));
  }
}

// Block (32, 8) sums a strip of 32 kV columns over the rows of its chunk (chunk = blockIdx.y,
// rows chunk, chunk + chunks, ... in steps of 8 per thread row), writing partial[0][chunk][j]
// (dweight) and partial[1][chunk][j] (dbias). Thread x owns kV adjacent columns: kV = 4 (one
// 16-byte f32 load of x and a 4-element load of g a row) when the launcher found n % 4 == 0 and
// the rows aligned, so a warp reads 512 bytes of x a row instead of 128.
template <class T, class G = T, int kV = 1>
__global__ void ln_bwd_params_partial_kernel(const G* g, const T* x, const math_t<T>* mean, const math_t<T>* rstd,
                                             math_t<T>* partial, int64_t rows, int64_t n) {
  using A = math_t<T>;
  __shared__ A sw[kRowsPerBlock][32 * kV + 1], sb[kRowsPerBlock][32 * kV + 1];
  const int64_t j = (blockIdx.x * 32 + threadIdx.x) * kV;
  const int64_t chunks = gridDim.y;
  A dw[kV] = {}, db[kV] = {};
  if (j < n)
    for (int64_t i = blockIdx.y * kRowsPerBlock + threadIdx.y; i < rows; i += chunks * kRowsPerBlock) {
      const A m = mean[i], r = rstd[i];
      if constexpr (kV == 1) {
        const A gv = load_m(g[i * n + j]);
        dw[0] += gv * (load_m(x[i * n + j]) - m) * r;
        db[0] += gv;
      } else {
        const AlignedVec<G, kV> gv = *reinterpret_cast<const AlignedVec<G, kV>*>(g + i * n + j);
        const AlignedVec<T, kV> xv = *reinterpret_cast<const AlignedVec<T, kV>*>(x + i * n + j);
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          const A gk = load_m(gv.v[k]);
          dw[k] += gk * (load_m(xv.v[k]) - m) * r;
          db[k] += gk;
        }
      }
    }
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    sw[threadIdx.y][threadIdx.x * kV + k] = dw[k];
    sb[threadIdx.y][threadIdx.x * kV + k] = db[k];
  }
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      A w_sum = dw[k], b_sum = db[k];
      for (int y = 1; y < kRowsPerBlock; ++y)
        w_sum += sw[y][threadIdx.x * kV + k], b_sum += sb[y][threadIdx.x * kV + k];
      partial[blockIdx.y * n + j + k] = w_sum;
      partial[(chunks + blockIdx.y) * n + j + k] = b_sum;
    }
  }
}

// Adds the chunks' partials of a 32-column strip: thread (x, y) sums chunks y, y + kFinalY, ...
// of column x (kFinalY loads in flight per column, where one thread per column made ~90
// dependent-latency loads), then the kFinalY sums are added in order (deterministic). The
// parts: partial[0] -> dw, partial[1] -> db and, when drb is given, partial[2] -> drb (the
// branch bias of add_ln_bwd_fused_kernel).
constexpr int kFinalY = 16;
// The chunks' partials are added in f64 (hundreds of them: in f32 this level's roundings made
// most of dweight's error), rounded once at the end.
template <class T>
__global__ void ln_bwd_params_final_kernel(const math_t<T>* partial, T* dw, T* db, T* drb, int64_t chunks, int64_t n) {
  using A = math_t<T>;
  using S = double;
  __shared__ S sw[kFinalY][33], sb[kFinalY][33], sr[kFinalY][33];
  wait_for_previous();  // launched dependent on the kernel that wrote `partial`
  const int64_t j = blockIdx.x * 32 + threadIdx.x;
  S w = 0, b = 0, rb = 0;
  if (j < n)
    for (int64_t c = threadIdx.y; c < chunks; c += kFinalY) {
      w += partial[c * n + j], b += partial[(chunks + c) * n + j];
      if (drb) rb += partial[(2 * chunks + c) * n + j];
    }
  sw[threadIdx.y][threadIdx.x] = w;
  sb[threadIdx.y][threadIdx.x] = b;
  sr[threadIdx.y][threadIdx.x] = rb;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    for (int y = 1; y < kFinalY; ++y) w += sw[y][threadIdx.x], b += sb[y][threadIdx.x], rb += sr[y][threadIdx.x];
    if (dw) dw[j] = store_m<T>(static_cast<A>(w));
    if (db) db[j] = store_m<T>(static_cast<A>(b));
    if (drb) drb[j] = store_m<T>(static_cast<A>(rb));
  }
}

unsigned row_blocks(int64_t rows, const char* op) {
  const int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  MG_CHECK(b <= 0x7fffffff, ShapeError, op, ": too many rows (", rows, ")");
  return static_cast<unsigned>(b);
}

// f(R{}) for the dtypes the fused kernels take beside the f32 residual stream; false for others.
template <class F>
bool with_stream_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return true;
    case DType::f16:
      f(__half{});
      return true;
    case DType::bf16:
      f(__nv_bfloat16{});
      return true;
    default:
      return false;
  }
}
bool stream_dtype(DType t) {
  return with_stream_dtype(t, [](auto) {});
}
bool f32_or_none(const Tensor& t) { return !t.defined() || t.dtype() == DType::f32; }
// Rows of n elements can be read 4 at a time: n % 4 == 0 and every defined tensor's data
// aligned to 4 of its elements (rows then start aligned too).
bool vec4_rows(int64_t n, std::initializer_list<const Tensor*> ts) {
  if (n % 4 != 0) return false;
  for (const Tensor* t : ts)
    if (t->defined() && reinterpret_cast<uintptr_t>(t->raw_data()) % (4 * dtype_size(t->dtype())) != 0) return false;
  return true;
}

// grad_weight / grad_bias (either may be undefined) from g (G) and x (T), deterministic.
template <class T, class G>
void param_grads(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                 const Tensor& grad_weight, const Tensor& grad_bias, cudaStream_t st) {
  using A = math_t<T>;
  const int64_t rows = x.size(0), n = x.size(1);
  if (!grad_weight.defined() && !grad_bias.defined()) return;
  // 4 columns a thread for f32 statistics' inputs when the rows allow (see the kernel).
  const bool vec = std::is_same_v<T, float> && vec4_rows(n, {&grad_out, &x});
  // Enough row chunks to fill the GPU with column strips, each chunk at least 64 rows.
  const int64_t strip = vec ? 128 : 32, strips = (n + strip - 1) / strip;
  const int64_t chunks = std::clamp<int64_t>(std::min((rows + 63) / 64, (4 * 132 + strips - 1) / strips), 1, 1024);
  Tensor partial = empty({2, chunks, n}, {dtype_of<A>, x.device()});
  MG_CHECK(strips <= 0x7fffffff, ShapeError, "layer_norm_backward: normalized size ", n, " is too large");
  auto launch = [&](auto kernel) {
    kernel<<<dim3(static_cast<unsigned>(strips), static_cast<unsigned>(chunks)), dim3(32, kRowsPerBlock), 0, st>>>(
        data_as<const G>(grad_out), data_as<const T>(x), data_as<const A>(mean), data_as<const A>(rstd),
        data_as<A>(partial), rows, n);
  };
  vec ? launch(ln_bwd_params_partial_kernel<T, G, 4>) : launch(ln_bwd_params_partial_kernel<T, G, 1>);
  MG_CUDA_CHECK_LAUNCH("layer_norm_backward");
  launch_dependent(ln_bwd_params_final_kernel<T>, dim3(static_cast<unsigned>((n + 31) / 32)), dim3(32, kFinalY), 0, st,
                   data_as<const A>(partial), data_as<T>(grad_weight), data_as<T>(grad_bias), static_cast<T*>(nullptr),
                   chunks, n);
  MG_CUDA_CHECK_LAUNCH("layer_norm_backward");
}

template <bool kReference>
void forward_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                  const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0 || n == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    if constexpr (kReference)
      ln_fwd_reference_kernel<T>
          <<<blocks_for(rows, 128), 128, 0, st>>>(data_as<const T>(x), data_as<const T>(weight), data_as<const T>(bias),
                                                  data_as<T>(out), data_as<A>(mean), data_as<A>(rstd), rows, n, eps);
    else {
      constexpr int V = kVec16<T>, kMax = kWarpRowVecs<T>;
      const T *px = data_as<const T>(x), *pw = data_as<const T>(weight), *pb = data_as<const T>(bias);
      T* po = data_as<T>(out);
      auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
      const int64_t nv = n / V;
      const dim3 grid(row_blocks(rows, "layer_norm")), block(32, kRowsPerBlock);
      if (n % V == 0 && nv <= 32 * kMax && al(px) && al(po) && al(pw) && al(pb)) {
        // The smallest power-of-two count of vectors a lane that covers the row.
        if (nv <= 32)
          ln_fwd_regs_kernel<T, 1>
              <<<grid, block, 0, st>>>(px, pw, pb, po, data_as<A>(mean), data_as<A>(rstd), rows, n, eps);
        else if (nv <= 64)
          ln_fwd_regs_kernel<T, 2>
              <<<grid, block, 0, st>>>(px, pw, pb, po, data_as<A>(mean), data_as<A>(rstd), rows, n, eps);
        else if (nv <= 128)
          ln_fwd_regs_kernel<T, (kMax < 4 ? kMax : 4)>
              <<<grid, block, 0, st>>>(px, pw, pb, po, data_as<A>(mean), data_as<A>(rstd), rows, n, eps);
        else
          ln_fwd_regs_kernel<T, kMax>
              <<<grid, block, 0, st>>>(px, pw, pb, po, data_as<A>(mean), data_as<A>(rstd), rows, n, eps);
      } else {
        ln_fwd_kernel<T><<<grid, block, 0, st>>>(px, pw, pb, po, data_as<A>(mean), data_as<A>(rstd), rows, n, eps);
      }
    }
    MG_CUDA_CHECK_LAUNCH("layer_norm");
  });
}

}  // namespace

void cuda::layer_norm_forward_reference(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                        const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  forward_impl<true>(x, weight, bias, eps, out, mean, rstd);
}

template <>
void CudaBackend::layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                     const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  forward_impl<false>(x, weight, bias, eps, out, mean, rstd);
}

template <>
void CudaBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& weight, const Tensor& grad_x, const Tensor& grad_weight,
                                      const Tensor& grad_bias) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    if (grad_x.defined() && rows > 0) {
      ln_bwd_dx_kernel<T><<<row_blocks(rows, "layer_norm_backward"), dim3(32, kRowsPerBlock), 0, st>>>(
          data_as<const T>(grad_out), data_as<const T>(x), data_as<const A>(mean), data_as<const A>(rstd),
          data_as<const T>(weight), data_as<T>(grad_x), rows, n);
      MG_CUDA_CHECK_LAUNCH("layer_norm_backward");
    }
    param_grads<T, T>(grad_out, x, mean, rstd, grad_weight, grad_bias, st);
  });
}

template <>
bool CudaBackend::fused_add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& residual_bias,
                                               const Tensor& weight, const Tensor& bias, double eps, const Tensor& sum,
                                               const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const DType rt = residual.defined() ? residual.dtype() : DType::f32;
  if (x.dtype() != DType::f32 || !f32_or_none(weight) || !f32_or_none(bias) || !f32_or_none(residual_bias) ||
      !stream_dtype(rt) || !stream_dtype(out.dtype()))
    return false;
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0 || n == 0) return false;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  const bool vec = vec4_rows(n, {&x, &residual, &residual_bias, &weight, &bias, &sum, &out});
  return with_stream_dtype(rt, [&](auto r_tag) {
    using R = decltype(r_tag);
    with_stream_dtype(out.dtype(), [&](auto o_tag) {
      using O = decltype(o_tag);
      auto launch = [&](auto kernel) {
        launch_dependent(kernel, dim3(row_blocks(rows, "add_layer_norm")), dim3(32, kRowsPerBlock), 0, st,
                         data_as<const float>(x), data_as<const R>(residual), data_as<const float>(residual_bias),
                         data_as<const float>(weight), data_as<const float>(bias),
                         residual.defined() ? data_as<float>(sum) : nullptr, data_as<O>(out), data_as<float>(mean),
                         data_as<float>(rstd), rows, n, eps);
      };
      vec ? launch(add_ln_fwd_kernel<4, R, O>) : launch(add_ln_fwd_kernel<1, R, O>);
      MG_CUDA_CHECK_LAUNCH("add_layer_norm");
    });
  });
}

template <>
bool CudaBackend::fused_add_layer_norm_backward(const Tensor& grad_out, const Tensor& grad_sum, const Tensor& sum,
                                                const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                                const Tensor& grad_x, const Tensor& grad_x_low,
                                                const Tensor& grad_weight, const Tensor& grad_bias,
                                                const Tensor& grad_residual_bias) {
  if (sum.dtype() != DType::f32 || !f32_or_none(weight) || !f32_or_none(grad_sum) || !f32_or_none(grad_residual_bias) ||
      !stream_dtype(grad_out.dtype()) || (grad_x_low.defined() && !stream_dtype(grad_x_low.dtype())))
    return false;
  const int64_t rows = sum.size(0), n = sum.size(1);
  if (rows == 0 || n == 0) return false;
  mg::cuda::DeviceGuard guard(sum.device());
  cudaStream_t st = stream_of(sum);
  const bool vec = vec4_rows(n, {&grad_out, &grad_sum, &sum, &weight, &grad_x, &grad_x_low});
  // Rows of 256, 512, 768 or 1024 elements: one kernel for dx and the parameters' partial sums.
  const int kg = vec && n % 128 == 0 ? static_cast<int>(n / 128) : 0;
  const bool fused = (kg == 2 || kg == 4 || kg == 6 || kg == 8) && (grad_x.defined() || grad_x_low.defined());
  const bool branch_bias = grad_residual_bias.defined();
  const bool params = grad_weight.defined() || grad_bias.defined() || branch_bias;
  const bool done =
      fused && with_stream_dtype(grad_out.dtype(), [&](auto g_tag) {
        using G = decltype(g_tag);
        with_stream_dtype(grad_x_low.defined() ? grad_x_low.dtype() : DType::f32, [&](auto l_tag) {
          using L = decltype(l_tag);
          // Three blocks an SM (32 KiB of shared memory and about 80 registers a thread allow more;
          // three keep the partials small), never more than the rows need.
          const int64_t chunks =
              std::min<int64_t>(row_blocks(rows, "add_layer_norm_backward"), 3 * sm_count(sum.device()));
          Tensor partial;
          if (params) partial = empty({branch_bias ? 3 : 2, chunks, n}, {DType::f32, sum.device()});
          auto launch = [&](auto kernel) {
            kernel<<<static_cast<unsigned>(chunks), dim3(32, kRowsPerBlock), 0, st>>>(
                data_as<const G>(grad_out), data_as<const float>(grad_sum), data_as<const float>(sum),
                data_as<const float>(mean), data_as<const float>(rstd), data_as<const float>(weight),
                data_as<float>(grad_x), data_as<L>(grad_x_low), data_as<float>(partial), branch_bias, rows);
          };
          switch (kg) {
            case 2:
              launch(add_ln_bwd_fused_kernel<2, G, L>);
              break;
            case 4:
              launch(add_ln_bwd_fused_kernel<4, G, L>);
              break;
            case 6:
              launch(add_ln_bwd_fused_kernel<6, G, L>);
              break;
            default:
              launch(add_ln_bwd_fused_kernel<8, G, L>);
              break;
          }
          MG_CUDA_CHECK_LAUNCH("add_layer_norm_backward");
          if (params) {
            launch_dependent(ln_bwd_params_final_kernel<float>, dim3(static_cast<unsigned>((n + 31) / 32)),
                             dim3(32, kFinalY), 0, st, data_as<const float>(partial), data_as<float>(grad_weight),
                             data_as<float>(grad_bias), data_as<float>(grad_residual_bias), chunks, n);
            MG_CUDA_CHECK_LAUNCH("add_layer_norm_backward");
          }
        });
      });
  if (done) return true;
  // Other widths: the dx kernel, and the residual bias's gradient as dx's column sums (into an f32
  // dx made here when the caller asked only for the branch's copy).
  const Tensor dx = branch_bias && !grad_x.defined() ? empty({rows, n}, {DType::f32, sum.device()}) : grad_x;
  with_stream_dtype(grad_out.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    if (dx.defined() || grad_x_low.defined())
      with_stream_dtype(grad_x_low.defined() ? grad_x_low.dtype() : DType::f32, [&](auto l_tag) {
        using L = decltype(l_tag);
        auto launch = [&](auto kernel) {
          kernel<<<row_blocks(rows, "add_layer_norm_backward"), dim3(32, kRowsPerBlock), 0, st>>>(
              data_as<const G>(grad_out), data_as<const float>(grad_sum), data_as<const float>(sum),
              data_as<const float>(mean), data_as<const float>(rstd), data_as<const float>(weight), data_as<float>(dx),
              data_as<L>(grad_x_low), rows, n);
        };
        vec ? launch(add_ln_bwd_dx_kernel<4, G, L>) : launch(add_ln_bwd_dx_kernel<1, G, L>);
        MG_CUDA_CHECK_LAUNCH("add_layer_norm_backward");
      });
    param_grads<float, G>(grad_out, sum, mean, rstd, grad_weight, grad_bias, st);
  });
  if (branch_bias) this->sum(dx, raw::view(grad_residual_bias, {1, n}));
  return true;
}

template <>
bool CudaBackend::fused_add_layer_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& residual_bias,
                                           const Tensor& weight, const Tensor& bias, double eps, DType out_dtype,
                                           const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                           const Tensor& history, int slot, Fp8Format format, int margin,
                                           const Tensor& scale, const Tensor& scale_inv, const Tensor& out,
                                           const Tensor& out_t) {
  const DType rt = residual.defined() ? residual.dtype() : DType::f32;
  const int64_t rows = x.size(0), n = x.size(1);
  // add_ln_fwd_kernel<4>'s case (its sums' order), rows a word of codes apart, and rows of at most
  // 16 * 128 elements (the registers a lane holds them in).
  if (x.dtype() != DType::f32 || !f32_or_none(weight) || !f32_or_none(bias) || !f32_or_none(residual_bias) ||
      !stream_dtype(rt) || (out_dtype != DType::f16 && out_dtype != DType::bf16) || rows == 0 || n % 16 != 0 ||
      rows % 4 != 0 || n > 16 * 128 || !vec4_rows(n, {&x, &residual, &residual_bias, &weight, &bias, &sum}) ||
      !vec4_rows(n, {&out, &out_t}))  // the codes written a word at a time
    return false;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  const fp8_tile::Delayed d = fp8_tile::delayed_args(history, slot, format, margin, scale, scale_inv);
  const int64_t blocks = (rows + kNormRows - 1) / kNormRows;
  MG_CHECK(blocks <= 0x7fffffff, ShapeError, "add_layer_norm_fp8_delayed: too many rows (", rows, ")");
  const size_t smem = static_cast<size_t>(kNormRows) * static_cast<size_t>(n + 4);
  const int iters = static_cast<int>((n + 127) / 128);
  with_stream_dtype(rt, [&](auto r_tag) {
    using R = decltype(r_tag);
    auto launch = [&](auto kernel) {
      MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(32, kRowsPerBlock), smem, st,
                       data_as<const float>(x), data_as<const R>(residual), data_as<const float>(residual_bias),
                       data_as<const float>(weight), data_as<const float>(bias),
                       residual.defined() ? data_as<float>(sum) : nullptr, data_as<float>(mean), data_as<float>(rstd),
                       rows, n, eps, fp8_tile::kind_of(format), data_as<uint8_t>(out), data_as<uint8_t>(out_t), d);
    };
    auto by_width = [&](auto o_tag) {
      using O = decltype(o_tag);
      if (iters <= 4)
        launch(add_ln_fp8_kernel<4, R, O>);
      else if (iters <= 8)
        launch(add_ln_fp8_kernel<8, R, O>);
      else if (iters <= 12)
        launch(add_ln_fp8_kernel<12, R, O>);
      else
        launch(add_ln_fp8_kernel<16, R, O>);
    };
    if (out_dtype == DType::bf16)
      by_width(__nv_bfloat16{});
    else
      by_width(__half{});
    MG_CUDA_CHECK_LAUNCH("add_layer_norm_fp8_delayed");
  });
  return true;
}

}  // namespace mg::kernels
