// Batch normalization on CUDA over x viewed as [N, C, S] (contiguous). Channel c's M = N*S
// values are split into P chunks and the grid is C x P blocks, so a layer with 64 channels
// still fills the GPU (one block per channel, the first version, ran ResNet-50's batch norms
// at ~20% of memory bandwidth on 132 SMs). Training forward = two launches:
//   bn_stats_kernel     each block: its chunk's mean, then the squared deviations from that
//                       mean (two passes over a chunk small enough to stay in L2), into a
//                       [C, P] (mean, M2) workspace;
//   bn_normalize_kernel each block: combines its channel's P partials (Chan et al.: exact,
//                       no E[x^2] - E[x]^2 cancellation), block (c, 0) writes the saved and
//                       running statistics, then every block normalizes its own chunk.
// Backward is the same shape: partial sum(g) and sum(g * (x - mean)) per chunk, then a
// combine + grad_x pass. Loads are 16-byte vectors when S is a multiple of the vector width
// (the chunk walks vector units u: n = u / (S/V) with a FastDiv); f32 accumulation (f64 for
// f64). Eval mode is one elementwise pass.
//
// Channels-last (NHWC) inputs have their own kernels, below: x is then [M, C] rows with the
// channel innermost, and the per-channel sums run down columns (see "channels-last").
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

constexpr int kNormBlock = 256;

struct NCS {
  int64_t N, C, S;
};

NCS ncs(const Tensor& x) {
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
  return {x.size(0), x.size(1), S};
}

// A per-channel value (weight, bias) in the math type A, or dflt when the tensor is absent.
template <class P, class A>
__device__ __forceinline__ A opt(const P* p, int64_t c, A dflt) {
  return p ? static_cast<A>(load_m(p[c])) : dflt;
}

// How channel c's values are walked: U = M / V vector units of V elements, P chunks of
// `per` units each (the last may be shorter). Unit u of channel c starts at element
// ((n * C + c) * S + (u - n * Sv) * V) with n = u / Sv, Sv = S / V.
struct Walk {
  NCS s;
  int64_t Sv, U, per;
  int P, V;
  mg::cuda::FastDiv div_sv;
  __device__ __forceinline__ int64_t at(int64_t c, int64_t u) const {
    const uint32_t n = div_sv.div(static_cast<uint32_t>(u));
    return (static_cast<int64_t>(n) * s.C + c) * s.S + (u - static_cast<int64_t>(n) * Sv) * V;
  }
  __device__ __forceinline__ int64_t begin(int p) const { return p * per; }
  __device__ __forceinline__ int64_t end(int p) const { return std::min<int64_t>(U, (p + 1) * per); }
};

template <class T, int V>
__device__ __forceinline__ AlignedVec<T, V> load_pack(const T* p, int64_t i) {
  return *reinterpret_cast<const AlignedVec<T, V>*>(p + i);
}

// (mean, M2) of this block's chunk of channel blockIdx.x into ws[(c * P + p) * 2 + {0, 1}].
template <class T, int V>
__global__ void bn_stats_kernel(const T* x, Walk w, math_t<T>* ws) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const int64_t u0 = w.begin(p), u1 = w.end(p);
  if (u0 >= u1) {  // an empty chunk (P rounded up): neutral partial
    if (threadIdx.x == 0) ws[(c * w.P + p) * 2] = A(0), ws[(c * w.P + p) * 2 + 1] = A(0);
    return;
  }
  A sum = 0;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
    const AlignedVec<T, V> v = load_pack<T, V>(x, w.at(c, u));
#pragma unroll
    for (int j = 0; j < V; ++j) sum += load_m(v.v[j]);
  }
  const A mean = block_sum(sum, shm) / static_cast<A>((u1 - u0) * V);
  A sq = 0;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
    const AlignedVec<T, V> v = load_pack<T, V>(x, w.at(c, u));
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A d = load_m(v.v[j]) - mean;
      sq += d * d;
    }
  }
  sq = block_sum(sq, shm);
  if (threadIdx.x == 0) ws[(c * w.P + p) * 2] = mean, ws[(c * w.P + p) * 2 + 1] = sq;
}

// Channel totals from the P partials: count-weighted mean, then M2 = sum(M2_p + n_p * (mean_p - mean)^2).
template <class A>
__device__ __forceinline__ void combine(const A* ws, const Walk& w, int64_t c, int V, A* shm, A* mean, A* m2) {
  A s1 = 0;
  for (int p = threadIdx.x; p < w.P; p += blockDim.x) {
    const int64_t n = std::max<int64_t>(0, w.end(p) - w.begin(p)) * V;
    s1 += static_cast<A>(n) * ws[(c * w.P + p) * 2];
  }
  const A total = static_cast<A>(w.U * V);
  *mean = block_sum(s1, shm) / total;
  A s2 = 0;
  for (int p = threadIdx.x; p < w.P; p += blockDim.x) {
    const int64_t n = std::max<int64_t>(0, w.end(p) - w.begin(p)) * V;
    const A d = ws[(c * w.P + p) * 2] - *mean;
    s2 += ws[(c * w.P + p) * 2 + 1] + static_cast<A>(n) * d * d;
  }
  *m2 = block_sum(s2, shm);
}

// Channel c's saved statistics, and the running ones when there are (unbiased variance into
// running_var, as PyTorch).
template <class T, class A>
__device__ __forceinline__ void write_stats(int64_t c, A mean, A var, A invstd, A M, double momentum, T* smean,
                                            T* sinvstd, T* rmean, T* rvar) {
  smean[c] = store_m<T>(mean);
  sinvstd[c] = store_m<T>(invstd);
  if (rmean) {
    const A mom = static_cast<A>(momentum);
    rmean[c] = store_m<T>((A(1) - mom) * load_m(rmean[c]) + mom * mean);
    rvar[c] = store_m<T>((A(1) - mom) * load_m(rvar[c]) + mom * var * M / (M - A(1)));
  }
}

template <class T, class W, int V>
__global__ void bn_normalize_kernel(const T* x, const W* wt, const W* b, W* rmean, W* rvar, T* out, W* smean,
                                    W* sinvstd, Walk w, const math_t<T>* ws, double momentum, double eps) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  A mean, m2;
  combine(ws, w, c, V, shm, &mean, &m2);
  const A M = static_cast<A>(w.U * V);
  const A var = m2 / M;
  const A invstd = A(1) / m_sqrt(var + static_cast<A>(eps));
  if (p == 0 && threadIdx.x == 0) write_stats(c, mean, var, invstd, M, momentum, smean, sinvstd, rmean, rvar);
  const A scale = opt(wt, c, A(1)) * invstd;
  const A shift = opt(b, c, A(0)) - mean * scale;
  for (int64_t u = w.begin(p) + threadIdx.x; u < w.end(p); u += blockDim.x) {
    const int64_t i = w.at(c, u);
    const AlignedVec<T, V> v = load_pack<T, V>(x, i);
    AlignedVec<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = store_m<T>(load_m(v.v[j]) * scale + shift);
    *reinterpret_cast<AlignedVec<T, V>*>(out + i) = r;
  }
}

template <class T, class W>
__global__ void bn_eval_kernel(const T* x, const W* w, const W* b, const W* rmean, const W* rvar, T* out, NCS s,
                               double eps, bool nhwc) {
  using A = math_t<T>;
  MG_GRID_STRIDE(i, s.N * s.C * s.S) {
    const int64_t c = nhwc ? i % s.C : (i / s.S) % s.C;
    const A invstd = A(1) / m_sqrt(static_cast<A>(load_m(rvar[c])) + static_cast<A>(eps));
    const A scale = opt(w, c, A(1)) * invstd;
    out[i] = store_m<T>(load_m(x[i]) * scale + (opt(b, c, A(0)) - static_cast<A>(load_m(rmean[c])) * scale));
  }
}

// training: dx = w*is * (g - mean(g) - (x - mu) * is^2 * mean(g * (x - mu)));
// eval: the statistics are constants, dx = w*is * g.
// Pass 1: per chunk, sum(g) and sum(g * (x - mu)) into ws[(c * P + p) * 2 + {0, 1}].
template <class T, class W, int V>
__global__ void bn_bwd_sums_kernel(const T* g, const T* x, const W* mean, Walk w, math_t<T>* ws) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const A mu = load_m(mean[c]);
  A sg = 0, sgd = 0;
  for (int64_t u = w.begin(p) + threadIdx.x; u < w.end(p); u += blockDim.x) {
    const int64_t i = w.at(c, u);
    const AlignedVec<T, V> gv = load_pack<T, V>(g, i), xv = load_pack<T, V>(x, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A gj = load_m(gv.v[j]);
      sg += gj;
      sgd += gj * (load_m(xv.v[j]) - mu);
    }
  }
  sg = block_sum(sg, shm);
  sgd = block_sum(sgd, shm);
  if (threadIdx.x == 0) ws[(c * w.P + p) * 2] = sg, ws[(c * w.P + p) * 2 + 1] = sgd;
}

// Pass 2: totals, then grad_weight/grad_bias (block (c, 0)) and grad_x for this chunk.
template <class T, class W, int V>
__global__ void bn_bwd_dx_kernel(const T* g, const T* x, const W* wt, const W* mean, const W* invstd, T* dx, W* dw,
                                 W* db, Walk w, const math_t<T>* ws, bool training) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  A sg = 0, sgd = 0;
  for (int q = threadIdx.x; q < w.P; q += blockDim.x) sg += ws[(c * w.P + q) * 2], sgd += ws[(c * w.P + q) * 2 + 1];
  sg = block_sum(sg, shm);
  sgd = block_sum(sgd, shm);
  const A mu = load_m(mean[c]), is = load_m(invstd[c]);
  if (p == 0 && threadIdx.x == 0) {
    if (dw) dw[c] = store_m<W>(sgd * is);
    if (db) db[c] = store_m<W>(sg);
  }
  if (!dx) return;
  const A M = static_cast<A>(w.U * V);
  const A a = opt(wt, c, A(1)) * is;
  const A mg = training ? sg / M : A(0);
  const A k2 = training ? is * is * sgd / M : A(0);
  for (int64_t u = w.begin(p) + threadIdx.x; u < w.end(p); u += blockDim.x) {
    const int64_t i = w.at(c, u);
    const AlignedVec<T, V> gv = load_pack<T, V>(g, i), xv = load_pack<T, V>(x, i);
    AlignedVec<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = store_m<T>(a * (load_m(gv.v[j]) - mg - (load_m(xv.v[j]) - mu) * k2));
    *reinterpret_cast<AlignedVec<T, V>*>(dx + i) = r;
  }
}

// The walk for x with V-element units: V = 16 bytes / element when S is a multiple of it and
// every operand is 16-byte aligned, else 1. P: enough chunks for ~8 blocks per SM over all
// channels, at least 1024 units a chunk, at most 128 chunks.
Walk make_walk(const NCS& s, int V, const char* op) {
  Walk w;
  w.s = s;
  w.V = V;
  w.Sv = s.S / V;
  w.U = s.N * w.Sv;
  MG_CHECK(s.C <= 65535 * 1024 && w.U < (int64_t{1} << 31), ShapeError, op, ": ", s.C, " channels of ", s.N * s.S,
           " values each is beyond the CUDA kernel's 32-bit indexing");
  int64_t P = (132 * 8 + s.C - 1) / std::max<int64_t>(s.C, 1);
  P = std::min<int64_t>({P, 128, std::max<int64_t>(1, w.U / 1024)});
  w.P = static_cast<int>(std::max<int64_t>(P, 1));
  w.per = (w.U + w.P - 1) / w.P;
  w.div_sv = mg::cuda::FastDiv(static_cast<uint32_t>(std::max<int64_t>(w.Sv, 1)));
  return w;
}

// 16 bytes / element when the vectors' dimension (`inner`: S for NCHW, C for NHWC) is a
// multiple of it and every operand is 16-byte aligned, else 1.
template <class T>
int vec_width(int64_t inner, std::initializer_list<const void*> ptrs) {
  constexpr int V = kVec16<T>;
  if (V == 1 || inner % V != 0) return 1;
  for (const void* p : ptrs)
    if (p && (reinterpret_cast<uintptr_t>(p) & 15) != 0) return 1;
  return V;
}

// Partial-sum workspace [C, P, 2] in the math type, from the caching allocator.
template <class T>
Tensor workspace(const Walk& w, Device dev) {
  return empty({w.s.C * w.P * 2}, {std::is_same_v<T, double> ? DType::f64 : DType::f32, dev});
}

// Runs f with a compile-time width: kVec16<T> when v says so, else 1.
template <class T, class F>
void with_width(int v, F&& f) {
  if (v == kVec16<T> && kVec16 < T >> 1)
    f(std::integral_constant<int, kVec16<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

// The two-pass launches (training forward, backward): per-channel partial sums from a C x P
// grid into a workspace, then the elementwise pass that reads them. Picks the vector width V
// from the pointers' alignment and calls launch(V as an integral_constant, walk, grid,
// workspace).
template <class T, class Launch>
void two_pass(const NCS& s, std::initializer_list<const void*> ptrs, const char* op, Device dev, Launch&& launch) {
  with_width<T>(vec_width<T>(s.S, ptrs), [&](auto vc) {
    const Walk w = make_walk(s, decltype(vc)::value, op);
    Tensor ws = workspace<T>(w, dev);
    const dim3 grid(static_cast<unsigned>(s.C), static_cast<unsigned>(w.P));
    launch(vc, w, grid, static_cast<math_t<T>*>(ws.raw_data()));
  });
}

// ---------------------------------------------------------------- channels-last
// x is [M, C]: M = N*H*W rows, the channel innermost. A block is TX x TY threads: TX lanes
// across the channels (V channels each, one 16-byte vector), TY lanes down the rows;
// blockIdx.x takes a slice of TX*V channels, blockIdx.y a chunk of rows, so reads are whole
// rows of the slice (coalesced) and a 64-channel layer still fills the card. Each thread
// sums x - K and (x - K)^2 per channel over its rows (K: the chunk's first row), the TY
// lanes' sums add up into one (mean, M2) partial per (chunk, channel); a finalize kernel, a
// block per channel, merges the chunks (Chan et al.) and writes the statistics and the
// per-channel scale/shift that the apply pass holds in registers. Backward: partial sums of
// g and g * (x - mean) the same way, a finalize into per-channel coefficients, then
// dx = a*g + b*x + c.

struct RowsTile {
  int64_t M, C, Cv;  // rows, channels, C / V vector columns
  int tx, ty, P;     // block shape, row chunks
  int64_t per;       // rows per chunk (the last may be shorter)
  __device__ __forceinline__ int64_t begin(int p) const { return min(M, p * per); }
  __device__ __forceinline__ int64_t end(int p) const { return min(M, (p + 1) * per); }
};

RowsTile rows_tile(int64_t M, int64_t C, int V) {
  RowsTile t;
  t.M = M, t.C = C, t.Cv = C / V;
  t.tx = static_cast<int>(std::min<int64_t>(t.Cv, 32));
  t.ty = kNormBlock / t.tx;
  const int64_t gx = (t.Cv + t.tx - 1) / t.tx;
  // ~8 blocks per SM over the whole grid, each chunk at least 4 rows per row lane.
  int64_t P = std::min<int64_t>({(132 * 8 + gx - 1) / gx, 1024, std::max<int64_t>(1, M / (4 * t.ty))});
  t.P = static_cast<int>(std::max<int64_t>(P, 1));
  t.per = (M + t.P - 1) / t.P;
  return t;
}

dim3 tile_grid(const RowsTile& t) {
  return dim3(static_cast<unsigned>((t.Cv + t.tx - 1) / t.tx), static_cast<unsigned>(t.P));
}

// Adds the TY row lanes' a[] and b[] (V values each) into row lane 0's through shared memory
// (sh_a, sh_b: kNormBlock * V each). True on the threads that then hold the block's totals:
// row lane 0 of a column that exists (`valid`).
template <class A, int V>
__device__ __forceinline__ bool sum_row_lanes(A (&a)[V], A (&b)[V], A* sh_a, A* sh_b, const RowsTile& t, bool valid) {
  const int slot = (threadIdx.y * t.tx + threadIdx.x) * V;
#pragma unroll
  for (int j = 0; j < V; ++j) sh_a[slot + j] = a[j], sh_b[slot + j] = b[j];
  __syncthreads();
  if (threadIdx.y != 0 || !valid) return false;
  for (int y = 1; y < t.ty; ++y) {
    const int o = (y * t.tx + threadIdx.x) * V;
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] += sh_a[o + j], b[j] += sh_b[o + j];
  }
  return true;
}

// Partials of chunk p, channel c: ws[(p * C + c) * 2 + {0, 1}] = the chunk's mean and M2.
// Sums of x - K and (x - K)^2 with K the chunk's first row (a value of the data, so the
// shifted sums carry no cancellation worth speaking of); plain sums add across the row lanes.
template <class T, int V>
__global__ void bn_nhwc_stats_kernel(const T* x, RowsTile t, math_t<T>* ws) {
  using A = math_t<T>;
  __shared__ A sh_s1[kNormBlock * V], sh_s2[kNormBlock * V];
  const int64_t cv = blockIdx.x * static_cast<int64_t>(t.tx) + threadIdx.x;
  const int p = blockIdx.y;
  const int64_t r0 = t.begin(p), r1 = t.end(p);
  A s1[V], s2[V], k[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s1[j] = A(0), s2[j] = A(0), k[j] = A(0);
  if (cv < t.Cv && r0 < r1) {
    const AlignedVec<T, V> kv = load_pack<T, V>(x, r0 * t.C + cv * V);
#pragma unroll
    for (int j = 0; j < V; ++j) k[j] = load_m(kv.v[j]);
    for (int64_t r = r0 + threadIdx.y; r < r1; r += t.ty) {
      const AlignedVec<T, V> v = load_pack<T, V>(x, r * t.C + cv * V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A d = load_m(v.v[j]) - k[j];
        s1[j] += d;
        s2[j] += d * d;
      }
    }
  }
  if (!sum_row_lanes<A, V>(s1, s2, sh_s1, sh_s2, t, cv < t.Cv)) return;
  const A n = static_cast<A>(max(int64_t{1}, r1 - r0));
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t c = cv * V + j;
    const A dm = s1[j] / n;  // chunk mean - K
    ws[(p * t.C + c) * 2] = k[j] + dm;
    ws[(p * t.C + c) * 2 + 1] = max(A(0), s2[j] - s1[j] * dm);
  }
}

// A block per channel: the chunks' (mean, M2) merged (count-weighted mean, then
// M2 = sum(M2_p + n_p * (mean_p - mean)^2)); writes the saved and running statistics and
// coef[2c], coef[2c + 1] = the scale and shift of the normalization.
template <class T, class W>
__global__ void bn_nhwc_finalize_kernel(const math_t<T>* ws, RowsTile t, const W* wt, const W* b, W* rmean, W* rvar,
                                        W* smean, W* sinvstd, math_t<T>* coef, double momentum, double eps) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  auto rows = [&](int p) { return static_cast<A>(max(int64_t{0}, min(t.M, (p + 1) * t.per) - p * t.per)); };
  A s1 = 0;
  for (int p = threadIdx.x; p < t.P; p += blockDim.x) s1 += rows(p) * ws[(p * t.C + c) * 2];
  const A M = static_cast<A>(t.M);
  const A mean = block_sum(s1, shm) / M;
  A s2 = 0;
  for (int p = threadIdx.x; p < t.P; p += blockDim.x) {
    const A d = ws[(p * t.C + c) * 2] - mean;
    s2 += ws[(p * t.C + c) * 2 + 1] + rows(p) * d * d;
  }
  const A m2 = block_sum(s2, shm);
  if (threadIdx.x != 0) return;
  const A var = m2 / M;
  const A invstd = A(1) / m_sqrt(var + static_cast<A>(eps));
  write_stats(c, mean, var, invstd, M, momentum, smean, sinvstd, rmean, rvar);
  const A scale = opt(wt, c, A(1)) * invstd;
  coef[2 * c] = scale;
  coef[2 * c + 1] = opt(b, c, A(0)) - mean * scale;
}

// g = 0 where the fused ReLU's output y is not positive (ReLU's gradient).
template <class T, int V>
__device__ __forceinline__ void mask_by(AlignedVec<T, V>& g, const AlignedVec<T, V>& y) {
#pragma unroll
  for (int j = 0; j < V; ++j)
    if (!(load_m(y.v[j]) > 0)) g.v[j] = store_m<T>(math_t<T>(0));
}

// out = x * coef[c][0] + coef[c][1] (forward) or, with a second input, out = g * coef[c][0] +
// x * coef[c][1] + coef[c][2] (backward's dx); K = coefficients per channel. The stats
// kernels' tile shape: a thread keeps one vector column, so its V channels' coefficients
// sit in registers while it walks rows blockIdx.y * ty + threadIdx.y, step gridDim.y * ty.
// relu (forward): out = max(0, ...); ymask (backward): g counts only where ymask > 0 (the
// fused ReLU's output). In the forward (K = 2) g, when given, is a residual added before the
// ReLU: out = max(0, x * coef[c][0] + coef[c][1] + g), rounded once.
template <class T, int V, int K>
__global__ void bn_nhwc_apply_kernel(const T* g, const T* x, const math_t<T>* coef, T* out, RowsTile t, bool relu,
                                     const T* ymask) {
  using A = math_t<T>;
  const int64_t cv = blockIdx.x * static_cast<int64_t>(t.tx) + threadIdx.x;
  if (cv >= t.Cv) return;
  A k[K][V];
#pragma unroll
  for (int j = 0; j < V; ++j)
#pragma unroll
    for (int q = 0; q < K; ++q) k[q][j] = coef[K * (cv * V + j) + q];
  const int64_t step = static_cast<int64_t>(gridDim.y) * t.ty;
  for (int64_t r = blockIdx.y * static_cast<int64_t>(t.ty) + threadIdx.y; r < t.M; r += step) {
    const int64_t i = r * t.C + cv * V;
    const AlignedVec<T, V> xv = load_pack<T, V>(x, i);
    AlignedVec<T, V> o;
    if constexpr (K == 2) {
      AlignedVec<T, V> rv;
      if (g) rv = load_pack<T, V>(g, i);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A v = load_m(xv.v[j]) * k[0][j] + k[1][j];
        if (g) v += load_m(rv.v[j]);
        o.v[j] = store_m<T>(relu ? max(v, A(0)) : v);
      }
    } else {
      AlignedVec<T, V> gv = load_pack<T, V>(g, i);
      if (ymask) mask_by(gv, load_pack<T, V>(ymask, i));
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = store_m<T>(load_m(gv.v[j]) * k[0][j] + load_m(xv.v[j]) * k[1][j] + k[2][j]);
    }
    *reinterpret_cast<AlignedVec<T, V>*>(out + i) = o;
  }
}

// The apply kernels' grid: the tile's channel slices by enough row blocks for ~16 blocks per SM.
dim3 apply_grid(const RowsTile& t) {
  const int64_t gx = (t.Cv + t.tx - 1) / t.tx;
  const int64_t gy = std::min<int64_t>(std::max<int64_t>(1, (132 * 16 + gx - 1) / gx), (t.M + t.ty - 1) / t.ty);
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(std::min<int64_t>(gy, 65535)));
}

// Backward partials: sum(g) and sum(g * (x - mean)) of chunk p, channel c into ws.
template <class T, class W, int V>
__global__ void bn_nhwc_bwd_sums_kernel(const T* g, const T* ymask, const T* x, const W* mean, RowsTile t,
                                        math_t<T>* ws) {
  using A = math_t<T>;
  __shared__ A sh_g[kNormBlock * V], sh_gd[kNormBlock * V];
  const int64_t cv = blockIdx.x * static_cast<int64_t>(t.tx) + threadIdx.x;
  const int p = blockIdx.y;
  const int64_t r0 = t.begin(p), r1 = t.end(p);
  A sg[V], sgd[V], mu[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sg[j] = A(0), sgd[j] = A(0), mu[j] = cv < t.Cv ? load_m(mean[cv * V + j]) : A(0);
  if (cv < t.Cv) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += t.ty) {
      AlignedVec<T, V> gv = load_pack<T, V>(g, r * t.C + cv * V);
      if (ymask) mask_by(gv, load_pack<T, V>(ymask, r * t.C + cv * V));
      const AlignedVec<T, V> xv = load_pack<T, V>(x, r * t.C + cv * V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A gj = load_m(gv.v[j]);
        sg[j] += gj;
        sgd[j] += gj * (load_m(xv.v[j]) - mu[j]);
      }
    }
  }
  if (!sum_row_lanes<A, V>(sg, sgd, sh_g, sh_gd, t, cv < t.Cv)) return;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t c = cv * V + j;
    ws[(p * t.C + c) * 2] = sg[j], ws[(p * t.C + c) * 2 + 1] = sgd[j];
  }
}

// A block per channel: totals, grad_weight / grad_bias, and dx's coefficients (see
// bn_bwd_dx_kernel's formula): dx = a*g - a*k2*x + a*(mu*k2 - mean(g)).
template <class T, class W>
__global__ void bn_nhwc_bwd_finalize_kernel(const math_t<T>* ws, RowsTile t, const W* wt, const W* mean,
                                            const W* invstd, W* dw, W* db, math_t<T>* coef, bool training) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  A sg = 0, sgd = 0;
  for (int p = threadIdx.x; p < t.P; p += blockDim.x) sg += ws[(p * t.C + c) * 2], sgd += ws[(p * t.C + c) * 2 + 1];
  sg = block_sum(sg, shm);
  sgd = block_sum(sgd, shm);
  if (threadIdx.x != 0) return;
  const A mu = load_m(mean[c]), is = load_m(invstd[c]), M = static_cast<A>(t.M);
  if (dw) dw[c] = store_m<W>(sgd * is);
  if (db) db[c] = store_m<W>(sg);
  const A a = opt(wt, c, A(1)) * is;
  const A mg = training ? sg / M : A(0);
  const A k2 = training ? is * is * sgd / M : A(0);
  coef[3 * c] = a;
  coef[3 * c + 1] = -a * k2;
  coef[3 * c + 2] = a * (mu * k2 - mg);
}

// Runs launch(V as an integral_constant, tile, ws, coef) for an [M, C] input:
// ws holds the [P, C, 2] partials, coef the K per-channel coefficients.
template <class T, int K, class Launch>
void nhwc_pass(int64_t M, int64_t C, std::initializer_list<const void*> ptrs, const char* op, Device dev,
               Launch&& launch) {
  with_width<T>(vec_width<T>(C, ptrs), [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const RowsTile t = rows_tile(M, C, V);
    MG_CHECK(C <= 65535 * int64_t{1024} && M < (int64_t{1} << 40), ShapeError, op, ": ", M, " rows of ", C,
             " channels is beyond the channels-last kernels' grid");
    const DType at = std::is_same_v<T, double> ? DType::f64 : DType::f32;
    Tensor ws = empty({t.P * C * 2 + K * C}, {at, dev});
    auto* base = static_cast<math_t<T>*>(ws.raw_data());
    launch(vc, t, base, base + t.P * C * 2);
  });
}

// The per-channel tensors' element type W: T's, or float for a half-precision input whose
// weight, bias, running and saved statistics are f32 (autocast keeps them f32, as PyTorch's
// cuDNN batch norm does: no casts of the parameters, f32 gradients for them).
template <class T, class F>
void with_param_type(DType pd, F&& f) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    if (pd == DType::f32) return f(float{});
  }
  f(T{});
}

// The channels-last training forward: stats, finalize, apply.
void batch_norm_nhwc_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, double momentum, double eps, const Tensor& out,
                             const Tensor& save_mean, const Tensor& save_invstd, bool relu,
                             const Tensor& residual = Tensor()) {
  const int64_t C = x.size(1), M = x.numel() / C;
  cudaStream_t st = stream_of(x);
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    with_param_type<T>(save_mean.dtype(), [&](auto wtag) {
      using W = decltype(wtag);
      using A = math_t<T>;
      nhwc_pass<T, 2>(
          M, C, {x.raw_data(), out.raw_data(), data_as<void>(residual)}, "batch_norm", x.device(),
          [&](auto vc, const RowsTile& t, A* ws, A* coef) {
            constexpr int V = decltype(vc)::value;
            bn_nhwc_stats_kernel<T, V><<<tile_grid(t), dim3(t.tx, t.ty), 0, st>>>(data_as<const T>(x), t, ws);
            bn_nhwc_finalize_kernel<T, W><<<static_cast<unsigned>(C), 128, 0, st>>>(
                ws, t, data_as<const W>(weight), data_as<const W>(bias), data_as<W>(running_mean),
                data_as<W>(running_var), data_as<W>(save_mean), data_as<W>(save_invstd), coef, momentum, eps);
            bn_nhwc_apply_kernel<T, V, 2><<<apply_grid(t), dim3(t.tx, t.ty), 0, st>>>(
                data_as<const T>(residual), data_as<const T>(x), coef, data_as<T>(out), t, relu, nullptr);
          });
      MG_CUDA_CHECK_LAUNCH("batch_norm");
    });
  });
}

// The channels-last backward: partial sums, finalize (grad_weight, grad_bias, coefficients), dx.
// relu_out, when defined, masks grad_out (the fused ReLU's backward).
void batch_norm_nhwc_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& invstd, bool training, const Tensor& grad_x, const Tensor& grad_weight,
                              const Tensor& grad_bias, const Tensor& relu_out) {
  const int64_t C = x.size(1), M = x.numel() / C;
  cudaStream_t st = stream_of(x);
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    with_param_type<T>(mean.dtype(), [&](auto wtag) {
      using W = decltype(wtag);
      using A = math_t<T>;
      nhwc_pass<T, 3>(M, C, {grad_out.raw_data(), x.raw_data(), data_as<void>(grad_x), data_as<void>(relu_out)},
                      "batch_norm_backward", x.device(), [&](auto vc, const RowsTile& t, A* ws, A* coef) {
                        constexpr int V = decltype(vc)::value;
                        bn_nhwc_bwd_sums_kernel<T, W, V><<<tile_grid(t), dim3(t.tx, t.ty), 0, st>>>(
                            data_as<const T>(grad_out), data_as<const T>(relu_out), data_as<const T>(x),
                            data_as<const W>(mean), t, ws);
                        bn_nhwc_bwd_finalize_kernel<T, W><<<static_cast<unsigned>(C), 128, 0, st>>>(
                            ws, t, data_as<const W>(weight), data_as<const W>(mean), data_as<const W>(invstd),
                            data_as<W>(grad_weight), data_as<W>(grad_bias), coef, training);
                        if (grad_x.defined())
                          bn_nhwc_apply_kernel<T, V, 3><<<apply_grid(t), dim3(t.tx, t.ty), 0, st>>>(
                              data_as<const T>(grad_out), data_as<const T>(x), coef, data_as<T>(grad_x), t, false,
                              data_as<const T>(relu_out));
                      });
      MG_CUDA_CHECK_LAUNCH("batch_norm_backward");
    });
  });
}
}  // namespace

template <>
void CudaBackend::batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                              const Tensor& running_mean, const Tensor& running_var, double momentum,
                                              double eps, const Tensor& out, const Tensor& save_mean,
                                              const Tensor& save_invstd) {
  const NCS s = ncs(x);
  if (s.C == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  if (is_channels_last(x))
    return batch_norm_nhwc_forward(x, weight, bias, running_mean, running_var, momentum, eps, out, save_mean,
                                   save_invstd, /*relu=*/false);
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    with_param_type<T>(save_mean.dtype(), [&](auto wtag) {
      using W = decltype(wtag);
      using A = math_t<T>;
      two_pass<T>(s, {x.raw_data(), out.raw_data()}, "batch_norm", x.device(),
                  [&](auto vc, const Walk& w, dim3 grid, A* ws) {
                    constexpr int V = decltype(vc)::value;
                    bn_stats_kernel<T, V><<<grid, kNormBlock, 0, stream_of(x)>>>(data_as<const T>(x), w, ws);
                    bn_normalize_kernel<T, W, V><<<grid, kNormBlock, 0, stream_of(x)>>>(
                        data_as<const T>(x), data_as<const W>(weight), data_as<const W>(bias), data_as<W>(running_mean),
                        data_as<W>(running_var), data_as<T>(out), data_as<W>(save_mean), data_as<W>(save_invstd), w, ws,
                        momentum, eps);
                  });
      MG_CUDA_CHECK_LAUNCH("batch_norm");
    });
  });
}

template <>
void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                          const Tensor& running_mean, const Tensor& running_var, double eps,
                                          const Tensor& out) {
  if (x.numel() == 0) return;
  const NCS s = ncs(x);
  mg::cuda::DeviceGuard guard(x.device());
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    with_param_type<T>(running_mean.dtype(), [&](auto wtag) {
      using W = decltype(wtag);
      bn_eval_kernel<T, W><<<blocks_for(x.numel()), kBlock, 0, stream_of(x)>>>(
          data_as<const T>(x), data_as<const W>(weight), data_as<const W>(bias), data_as<const W>(running_mean),
          data_as<const W>(running_var), data_as<T>(out), s, eps, is_channels_last(x));
      MG_CUDA_CHECK_LAUNCH("batch_norm");
    });
  });
}

template <>
void CudaBackend::batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                      const Tensor& invstd, bool training, const Tensor& grad_x,
                                      const Tensor& grad_weight, const Tensor& grad_bias) {
  const NCS s = ncs(x);
  if (s.C == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  if (is_channels_last(x))
    return batch_norm_nhwc_backward(grad_out, x, weight, mean, invstd, training, grad_x, grad_weight, grad_bias,
                                    Tensor());
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    with_param_type<T>(mean.dtype(), [&](auto wtag) {
      using W = decltype(wtag);
      using A = math_t<T>;
      two_pass<T>(s, {grad_out.raw_data(), x.raw_data(), data_as<void>(grad_x)}, "batch_norm_backward", x.device(),
                  [&](auto vc, const Walk& w, dim3 grid, A* ws) {
                    constexpr int V = decltype(vc)::value;
                    bn_bwd_sums_kernel<T, W, V><<<grid, kNormBlock, 0, stream_of(x)>>>(
                        data_as<const T>(grad_out), data_as<const T>(x), data_as<const W>(mean), w, ws);
                    bn_bwd_dx_kernel<T, W, V><<<grid, kNormBlock, 0, stream_of(x)>>>(
                        data_as<const T>(grad_out), data_as<const T>(x), data_as<const W>(weight),
                        data_as<const W>(mean), data_as<const W>(invstd), data_as<T>(grad_x), data_as<W>(grad_weight),
                        data_as<W>(grad_bias), w, ws, training);
                  });
      MG_CUDA_CHECK_LAUNCH("batch_norm_backward");
    });
  });
}

// The fused ReLU: channels-last inputs only (the NCHW kernels leave it to the caller).
template <>
bool CudaBackend::batch_norm_relu_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                   const Tensor& running_mean, const Tensor& running_var,
                                                   double momentum, double eps, const Tensor& out,
                                                   const Tensor& save_mean, const Tensor& save_invstd,
                                                   const Tensor& residual) {
  if (!is_channels_last(x) || (residual.defined() && !is_channels_last(residual))) return false;
  if (x.numel() == 0) return true;
  mg::cuda::DeviceGuard guard(x.device());
  batch_norm_nhwc_forward(x, weight, bias, running_mean, running_var, momentum, eps, out, save_mean, save_invstd,
                          /*relu=*/true, residual);
  return true;
}

template <>
bool CudaBackend::batch_norm_relu_backward(const Tensor& grad_out, const Tensor& relu_out, const Tensor& x,
                                           const Tensor& weight, const Tensor& mean, const Tensor& invstd,
                                           const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  if (!is_channels_last(x)) return false;
  if (x.numel() == 0) return true;
  mg::cuda::DeviceGuard guard(x.device());
  batch_norm_nhwc_backward(grad_out, x, weight, mean, invstd, /*training=*/true, grad_x, grad_weight, grad_bias,
                           relu_out);
  return true;
}

}  // namespace mg::kernels
