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

template <class T>
__device__ __forceinline__ math_t<T> opt(const T* p, int64_t c, math_t<T> dflt) {
  return p ? load_m(p[c]) : dflt;
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

template <class T, int V>
__global__ void bn_normalize_kernel(const T* x, const T* wt, const T* b, T* rmean, T* rvar, T* out, T* smean,
                                    T* sinvstd, Walk w, const math_t<T>* ws, double momentum, double eps) {
  using A = math_t<T>;
  __shared__ A shm[32];
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  A mean, m2;
  combine(ws, w, c, V, shm, &mean, &m2);
  const A M = static_cast<A>(w.U * V);
  const A var = m2 / M;
  const A invstd = A(1) / m_sqrt(var + static_cast<A>(eps));
  if (p == 0 && threadIdx.x == 0) {
    smean[c] = store_m<T>(mean);
    sinvstd[c] = store_m<T>(invstd);
    if (rmean) {
      const A mom = static_cast<A>(momentum);
      rmean[c] = store_m<T>((A(1) - mom) * load_m(rmean[c]) + mom * mean);
      rvar[c] = store_m<T>((A(1) - mom) * load_m(rvar[c]) + mom * var * M / (M - A(1)));
    }
  }
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

template <class T>
__global__ void bn_eval_kernel(const T* x, const T* w, const T* b, const T* rmean, const T* rvar, T* out, NCS s,
                               double eps) {
  using A = math_t<T>;
  MG_GRID_STRIDE(i, s.N * s.C * s.S) {
    const int64_t c = (i / s.S) % s.C;
    const A invstd = A(1) / m_sqrt(load_m(rvar[c]) + static_cast<A>(eps));
    const A scale = opt(w, c, A(1)) * invstd;
    out[i] = store_m<T>(load_m(x[i]) * scale + (opt(b, c, A(0)) - load_m(rmean[c]) * scale));
  }
}

// training: dx = w*is * (g - mean(g) - (x - mu) * is^2 * mean(g * (x - mu)));
// eval: the statistics are constants, dx = w*is * g.
// Pass 1: per chunk, sum(g) and sum(g * (x - mu)) into ws[(c * P + p) * 2 + {0, 1}].
template <class T, int V>
__global__ void bn_bwd_sums_kernel(const T* g, const T* x, const T* mean, Walk w, math_t<T>* ws) {
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
template <class T, int V>
__global__ void bn_bwd_dx_kernel(const T* g, const T* x, const T* wt, const T* mean, const T* invstd, T* dx, T* dw,
                                 T* db, Walk w, const math_t<T>* ws, bool training) {
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
    if (dw) dw[c] = store_m<T>(sgd * is);
    if (db) db[c] = store_m<T>(sg);
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

template <class T>
int vec_width(const NCS& s, std::initializer_list<const void*> ptrs) {
  constexpr int V = kVec16<T>;
  if (V == 1 || s.S % V != 0) return 1;
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
  with_width<T>(vec_width<T>(s, ptrs), [&](auto vc) {
    const Walk w = make_walk(s, decltype(vc)::value, op);
    Tensor ws = workspace<T>(w, dev);
    const dim3 grid(static_cast<unsigned>(s.C), static_cast<unsigned>(w.P));
    launch(vc, w, grid, static_cast<math_t<T>*>(ws.raw_data()));
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
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    two_pass<T>(s, {x.raw_data(), out.raw_data()}, "batch_norm", x.device(),
                [&](auto vc, const Walk& w, dim3 grid, A* ws) {
                  constexpr int V = decltype(vc)::value;
                  bn_stats_kernel<T, V><<<grid, kNormBlock, 0, stream_of(x)>>>(data_as<const T>(x), w, ws);
                  bn_normalize_kernel<T, V><<<grid, kNormBlock, 0, stream_of(x)>>>(
                      data_as<const T>(x), data_as<const T>(weight), data_as<const T>(bias), data_as<T>(running_mean),
                      data_as<T>(running_var), data_as<T>(out), data_as<T>(save_mean), data_as<T>(save_invstd), w, ws,
                      momentum, eps);
                });
    MG_CUDA_CHECK_LAUNCH("batch_norm");
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
    bn_eval_kernel<T><<<blocks_for(x.numel()), kBlock, 0, stream_of(x)>>>(
        data_as<const T>(x), data_as<const T>(weight), data_as<const T>(bias), data_as<const T>(running_mean),
        data_as<const T>(running_var), data_as<T>(out), s, eps);
    MG_CUDA_CHECK_LAUNCH("batch_norm");
  });
}

template <>
void CudaBackend::batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                      const Tensor& invstd, bool training, const Tensor& grad_x,
                                      const Tensor& grad_weight, const Tensor& grad_bias) {
  const NCS s = ncs(x);
  if (s.C == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  MG_CUDA_DISPATCH_FLOAT(x.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    two_pass<T>(s, {grad_out.raw_data(), x.raw_data(), data_as<void>(grad_x)}, "batch_norm_backward", x.device(),
                [&](auto vc, const Walk& w, dim3 grid, A* ws) {
                  constexpr int V = decltype(vc)::value;
                  bn_bwd_sums_kernel<T, V><<<grid, kNormBlock, 0, stream_of(x)>>>(
                      data_as<const T>(grad_out), data_as<const T>(x), data_as<const T>(mean), w, ws);
                  bn_bwd_dx_kernel<T, V><<<grid, kNormBlock, 0, stream_of(x)>>>(
                      data_as<const T>(grad_out), data_as<const T>(x), data_as<const T>(weight), data_as<const T>(mean),
                      data_as<const T>(invstd), data_as<T>(grad_x), data_as<T>(grad_weight), data_as<T>(grad_bias), w,
                      ws, training);
                });
    MG_CUDA_CHECK_LAUNCH("batch_norm_backward");
  });
}

}  // namespace mg::kernels
