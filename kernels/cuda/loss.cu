// Fused cross-entropy on CUDA: one block per row. The forward makes a single pass over the
// row with an online (max, sum of exp) pair per thread, merged across the block, so the
// logits are read once and nothing of size [M, C] is written; the backward reads the row
// once and writes coef * (softmax - target distribution) in the logits' dtype. For GPT-2's
// [8192, 50304] bf16 logits that replaces cast-to-f32 + log_softmax + nll scatter +
// log_softmax backward + cast back (~15 GB of traffic, two f32 [M, C] buffers) by ~2.5 GB.
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <limits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/deferred_read.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

// Running (max, sum of exp(x - max)): merging two is exact up to rounding.
template <class A>
struct MaxSum {
  A m, s;
};
template <class A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.m > b.m ? a.m : b.m;
  if (m == -std::numeric_limits<A>::infinity()) return {m, a.s + b.s};
  return {m, a.s * m_exp(a.m - m) + b.s * m_exp(b.m - m)};
}

// The per-element exponentials are RowExp's (kernels/cuda/common.cuh): the SFU's ex2 with no
// denormal fix-up for f16/bf16 logits, where the one-pass kernel is bound by its instructions, not
// its traffic.
//
// V values at once: one rescale for their maximum, then V independent exponentials (where
// pushing them one by one chains every exponential on the one before through r). Values that
// are all -inf add nothing.
template <class T, class A, int V>
__device__ __forceinline__ void push_vec(MaxSum<A>& r, const A (&v)[V]) {
  A mv = v[0];
#pragma unroll
  for (int k = 1; k < V; ++k) mv = max(mv, v[k]);
  if (mv == -std::numeric_limits<A>::infinity()) return;
  if (mv > r.m) {
    r.s = r.m == -std::numeric_limits<A>::infinity() ? A(0) : r.s * RowExp<T>(mv)(r.m);
    r.m = mv;
  }
  const RowExp<T> ex(r.m);
  A s = ex(v[0]);
#pragma unroll
  for (int k = 1; k < V; ++k) s += ex(v[k]);
  r.s += s;
}

template <class A>
__device__ __forceinline__ MaxSum<A> block_merge(MaxSum<A> r, A* sm, A* ss) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    r = merge(r, MaxSum<A>{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sm[warp] = r.m, ss[warp] = r.s;
  __syncthreads();
  r = lane < nw ? MaxSum<A>{sm[lane], ss[lane]} : MaxSum<A>{-std::numeric_limits<A>::infinity(), A(0)};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    r = merge(r, MaxSum<A>{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
  return r;
}

// One row's forward, x the row (in memory or in shared memory): thread 0 writes lse and loss (NaN
// for a bad label, whose row is flagged in `bad`: the lowest such row wins). Every thread gets
// the row's logsumexp. kSmooth: label smoothing e != 0, which also needs the row's sum (without
// it the loss is lse - x[t], the bits of the smoothing formula at e = 0).
template <class T, int V, bool kSmooth>
__device__ __forceinline__ math_t<T> ce_row_forward(const T* x, int64_t row, const int64_t* target, int64_t C,
                                                    int64_t ignore_index, double e, math_t<T>* loss, math_t<T>* lse,
                                                    unsigned long long* bad) {
  using A = math_t<T>;
  __shared__ A sm[32], ss[32], sx[32];
  MaxSum<A> r{-std::numeric_limits<A>::infinity(), A(0)};
  A sum_x = 0;
#pragma unroll 2
  for (int64_t j = threadIdx.x * V; j < C; j += static_cast<int64_t>(blockDim.x) * V) {
    const AlignedVec<T, V> p = *reinterpret_cast<const AlignedVec<T, V>*>(x + j);
    A v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] = load_m(p.v[k]);
      if constexpr (kSmooth) sum_x += v[k];
    }
    push_vec<T, A, V>(r, v);
  }
  r = block_merge(r, sm, ss);
  if constexpr (kSmooth) sum_x = block_sum(sum_x, sx);
  // Lane 0's: the lanes' merges pair the partial sums in different orders (the compiler's fused
  // multiply-adds round them differently), and lane 0 of every warp computes thread 0's value,
  // the one written to lse. A gradient from this l is then the one from lse.
  const A l = __shfl_sync(0xffffffffu, r.m + m_log(r.s), 0);
  if (threadIdx.x == 0) {
    lse[row] = l;
    const int64_t t = target[row];
    if (t == ignore_index) {
      loss[row] = A(0);
    } else if (t < 0 || t >= C) {
      atomicMin(bad, static_cast<unsigned long long>(row));
      loss[row] = std::numeric_limits<A>::quiet_NaN();
    } else if constexpr (kSmooth) {
      const A ea = static_cast<A>(e);
      loss[row] = l - (A(1) - ea) * load_m(x[t]) - ea / static_cast<A>(C) * sum_x;
    } else {
      loss[row] = l - load_m(x[t]);
    }
  }
  return l;
}

template <class T, int V, bool kSmooth>
__global__ void ce_forward_kernel(const T* logits, const int64_t* target, int64_t C, int64_t ignore_index, double e,
                                  math_t<T>* loss, math_t<T>* lse, unsigned long long* bad) {
  const int64_t row = blockIdx.x;
  ce_row_forward<T, V, kSmooth>(logits + row * C, row, target, C, ignore_index, e, loss, lse, bad);
}

// coef * (softmax - target distribution) for the V values of p from column j on, into o. The
// target's column is found once a vector, by one unsigned compare (hit, below): the vector that
// holds it (one a row) takes the branch that subtracts at that column; the others do no compare
// an element. A bad label hits no vector. Without smoothing, q is the softmax itself: the same
// bits as subtracting off = 0.
template <class T, int V, bool kSmooth>
__device__ __forceinline__ void ce_grad_vec(const AlignedVec<T, V>& p, AlignedVec<T, V>& o, int64_t j, int64_t t,
                                            const RowExp<T>& ex, math_t<T> c, math_t<T> off, math_t<T> hit) {
  using A = math_t<T>;
  const uint64_t d = static_cast<uint64_t>(t) - static_cast<uint64_t>(j);  // wraps for t < j
  if (d >= static_cast<uint64_t>(V)) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A q = ex(load_m(p.v[k]));
      if constexpr (kSmooth) q -= off;
      o.v[k] = store_m<T>(c * q);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A q = ex(load_m(p.v[k]));
      if constexpr (kSmooth) q -= off;
      if (static_cast<uint64_t>(k) == d) q -= hit;
      o.v[k] = store_m<T>(c * q);
    }
  }
}

// One row's gradient, x the row (in memory or in shared memory), g where it goes (x itself is
// fine: each thread reads its elements before it writes them): coef * (softmax - target
// distribution), 0 for an ignored row.
template <class T, int V, bool kSmooth>
__device__ __forceinline__ void ce_row_backward(const T* x, T* g, int64_t t, math_t<T> c, math_t<T> l, int64_t C,
                                                int64_t ignore_index, double e) {
  using A = math_t<T>;
  if (t == ignore_index) {  // the whole row is 0 (the block's branch: t is the row's)
    AlignedVec<T, V> z;
#pragma unroll
    for (int k = 0; k < V; ++k) z.v[k] = store_m<T>(A(0));
    for (int64_t j = threadIdx.x * V; j < C; j += static_cast<int64_t>(blockDim.x) * V)
      *reinterpret_cast<AlignedVec<T, V>*>(g + j) = z;
    return;
  }
  const A off = kSmooth ? static_cast<A>(e) / static_cast<A>(C) : A(0);
  const A hit = kSmooth ? A(1) - static_cast<A>(e) : A(1);
  const RowExp<T> ex(l);
  for (int64_t j = threadIdx.x * V; j < C; j += static_cast<int64_t>(blockDim.x) * V) {
    const AlignedVec<T, V> p = *reinterpret_cast<const AlignedVec<T, V>*>(x + j);
    AlignedVec<T, V> o;
    ce_grad_vec<T, V, kSmooth>(p, o, j, t, ex, c, off, hit);
    *reinterpret_cast<AlignedVec<T, V>*>(g + j) = o;
  }
}

template <class T, int V, bool kSmooth>
__global__ void ce_backward_kernel(const math_t<T>* coef, int64_t coef_stride, const T* logits, const int64_t* target,
                                   const math_t<T>* lse, int64_t C, int64_t ignore_index, double e, T* grad) {
  using A = math_t<T>;
  const int64_t row = blockIdx.x;
  const int64_t t = target[row];
  const A c = t == ignore_index ? A(0) : coef[row * coef_stride];
  ce_row_backward<T, V, kSmooth>(logits + row * C, grad + row * C, t, c, lse[row], C, ignore_index, e);
}

// Forward and backward of a row held in shared memory (C * sizeof(T) <= smem_row_limit, C a
// multiple of V, rows 16-byte aligned): the row is copied there with cp.async (each thread's whole
// share in flight), the forward and the gradient read it from there, and the gradient goes to
// `grad` (logits itself or apart). The logits are read from memory once, where the two kernels
// above read them twice (the second read misses the L2: a block's row is 100 KB for GPT-2's
// 50304 classes in bf16, with 264 rows in flight). Same arithmetic as the two kernels, in the
// same order for the same block size: the same bits.
template <class T, bool kSmooth>
__device__ __forceinline__ void ce_fused_row(const T* x, int64_t row, const int64_t* target, int64_t C,
                                             int64_t ignore_index, double e, const math_t<T>* coef, int64_t coef_stride,
                                             math_t<T>* loss, math_t<T>* lse, unsigned long long* bad, T* grad) {
  using A = math_t<T>;
  constexpr int V = kVec16<T>;
  const A l = ce_row_forward<T, V, kSmooth>(x, row, target, C, ignore_index, e, loss, lse, bad);
  const int64_t t = target[row];
  const A c = t == ignore_index ? A(0) : coef[row * coef_stride];
  ce_row_backward<T, V, kSmooth>(x, grad + row * C, t, c, l, C, ignore_index, e);
}

// Queues the cp.async copy of row `row` into dst (one commit group).
template <class T>
__device__ __forceinline__ void ce_load_row(const T* logits, int64_t row, int64_t C, AlignedVec<T, kVec16<T>>* dst) {
  ptx::cp_async_block(dst, reinterpret_cast<const AlignedVec<T, kVec16<T>>*>(logits + row * C),
                      static_cast<int>(C / kVec16<T>));
}

// A row a block (f32 over 50304: one row of 201 KB fits, two do not).
template <class T, bool kSmooth>
__global__ void ce_fused_smem_kernel(const T* logits, const int64_t* target, int64_t C, int64_t ignore_index, double e,
                                     const math_t<T>* coef, int64_t coef_stride, math_t<T>* loss, math_t<T>* lse,
                                     unsigned long long* bad, T* grad) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto* buf = reinterpret_cast<AlignedVec<T, kVec16<T>>*>(smem_bytes);
  ce_load_row(logits, blockIdx.x, C, buf);
  ptx::cp_async_wait<0>();
  __syncthreads();
  ce_fused_row<T, kSmooth>(reinterpret_cast<const T*>(buf), blockIdx.x, target, C, ignore_index, e, coef, coef_stride,
                           loss, lse, bad, grad);
}

// Where two long rows fit (f16/bf16 over 50304: 2 x 100.6 KB): one block an SM walks rows blockIdx.x,
// + gridDim.x, ..., copying the next row into one buffer while it works on the other, so the
// memory is never idle while the block computes. A block a row, two an SM (the kernel above),
// ran at 0.55-0.64 of a copy on the H200 (bench_cuda_kernels, BM_CrossEntropy): both blocks of
// an SM spent stretches computing with no load in flight.
template <class T, bool kSmooth>
__global__ void ce_fused_pipelined_kernel(const T* logits, const int64_t* target, int64_t M, int64_t C,
                                          int64_t ignore_index, double e, const math_t<T>* coef, int64_t coef_stride,
                                          math_t<T>* loss, math_t<T>* lse, unsigned long long* bad, T* grad) {
  using Vec = AlignedVec<T, kVec16<T>>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Vec* const buf = reinterpret_cast<Vec*>(smem_bytes);  // two rows: buf and buf + nv
  const int64_t nv = C / kVec16<T>;
  int64_t row = blockIdx.x;
  if (row < M) ce_load_row(logits, row, C, buf);
  for (int it = 0; row < M; ++it, row += gridDim.x) {
    const int64_t next = row + gridDim.x;
    if (next < M) {
      ce_load_row(logits, next, C, buf + ((it + 1) & 1) * nv);  // last read before the barrier below
      ptx::cp_async_wait<1>();                                  // this row's copy is done, the next one's in flight
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    ce_fused_row<T, kSmooth>(reinterpret_cast<const T*>(buf + (it & 1) * nv), row, target, C, ignore_index, e, coef,
                             coef_stride, loss, lse, bad, grad);
    __syncthreads();  // every thread is done with this row's buffer before the next iteration refills it
  }
}

int threads_for(int64_t C) { return C >= 8192 ? 512 : C >= 1024 ? 256 : 128; }

// The label of row `row` of a contiguous i64 target, read at once (an error path only).
int64_t read_target(const Tensor& target, unsigned long long row) {
  int64_t v = 0;
  MG_CUDA_CHECK(cudaMemcpy(&v, static_cast<const int64_t*>(target.raw_data()) + row, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

// V when every row starts 16-byte aligned (C a multiple of V, aligned base), else 1.
// Calls f with std::true_type when label smoothing is on, std::false_type when it is off: the
// kernels are compiled for each (the row sum and the smoothing terms only where they are used).
template <class F>
void with_smoothing(double smoothing, F&& f) {
  if (smoothing != 0.0)
    f(std::true_type{});
  else
    f(std::false_type{});
}

template <class T>
bool vec_rows(const void* p, int64_t C) {
  return kVec16<T> > 1 && C % kVec16<T> == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// The label check's finding, `bad` (the lowest bad row, or all ones): a bad label raises the
// IndexError kernels/loss.cc raises for a returned label (kernels::raise_bad_label), here at once
// or, inside a kernels::DeferredIndexChecks scope, at the scope's finish() (cuda::read_to_host);
// meanwhile a bad row's loss is NaN and its gradient has no target term (ce_row_backward matches
// no column): nothing outside the tensors is touched. Inside a CUDA graph capture there is
// nothing to read yet: the check is skipped (docs/cuda_graphs.md). Returns ignore_index: a label
// the caller would raise for is raised here.
int64_t label_check(const Tensor& bad, const Tensor& target, int64_t C, int64_t ignore_index, cudaStream_t st) {
  const int device = bad.device().index;
  if (mg::cuda::is_capturing(device)) return ignore_index;
  read_to_host(bad.raw_data(), sizeof(unsigned long long), device, st, [target, C, ignore_index](const void* host) {
    unsigned long long row;
    std::memcpy(&row, host, sizeof row);
    if (row != ~0ULL) raise_bad_label(read_target(target, row), C, ignore_index);
  });
  return ignore_index;
}

// The label check's buffer: all ones (unsigned max), lowered by the kernels to the first bad row.
Tensor bad_row_flag(const Tensor& logits) { return full({}, -1.0, {DType::i64, logits.device()}); }

}  // namespace

template <>
int64_t CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                           double smoothing, const Tensor& loss, const Tensor& lse) {
  const int64_t M = logits.size(0), C = logits.size(1);
  if (M == 0) return ignore_index;
  mg::cuda::DeviceGuard guard(logits.device());
  cudaStream_t st = stream_of(logits);
  MG_CHECK(M <= 0x7fffffff, ShapeError, "cross_entropy: too many rows (", M, ")");
  const Tensor bad = bad_row_flag(logits);
  auto* pbad = static_cast<unsigned long long*>(bad.raw_data());
  MG_CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    const T* px = static_cast<const T*>(logits.raw_data());
    auto* pl = static_cast<A*>(loss.raw_data());
    auto* pe = static_cast<A*>(lse.raw_data());
    const auto* pt = static_cast<const int64_t*>(target.raw_data());
    with_smoothing(smoothing, [&](auto smooth) {
      constexpr bool kS = decltype(smooth)::value;
      if (vec_rows<T>(px, C))
        ce_forward_kernel<T, kVec16<T>, kS>
            <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(px, pt, C, ignore_index, smoothing, pl, pe, pbad);
      else
        ce_forward_kernel<T, 1, kS>
            <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(px, pt, C, ignore_index, smoothing, pl, pe, pbad);
    });
  });
  MG_CUDA_CHECK_LAUNCH("cross_entropy");
  return label_check(bad, target, C, ignore_index, st);
}

template <>
void CudaBackend::cross_entropy_backward(const Tensor& coef, const Tensor& logits, const Tensor& target,
                                         const Tensor& lse, int64_t ignore_index, double smoothing,
                                         const Tensor& grad) {
  const int64_t M = logits.size(0), C = logits.size(1);
  if (M == 0 || C == 0) return;
  mg::cuda::DeviceGuard guard(logits.device());
  cudaStream_t st = stream_of(logits);
  const int64_t cs = coef.numel() == 1 ? 0 : 1;
  MG_CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    const T* px = static_cast<const T*>(logits.raw_data());
    T* pg = static_cast<T*>(grad.raw_data());
    const auto* pc = static_cast<const A*>(coef.raw_data());
    const auto* pe = static_cast<const A*>(lse.raw_data());
    const auto* pt = static_cast<const int64_t*>(target.raw_data());
    with_smoothing(smoothing, [&](auto smooth) {
      constexpr bool kS = decltype(smooth)::value;
      if (vec_rows<T>(px, C) && vec_rows<T>(pg, C))
        ce_backward_kernel<T, kVec16<T>, kS>
            <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(pc, cs, px, pt, pe, C, ignore_index, smoothing, pg);
      else
        ce_backward_kernel<T, 1, kS>
            <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(pc, cs, px, pt, pe, C, ignore_index, smoothing, pg);
    });
  });
  MG_CUDA_CHECK_LAUNCH("cross_entropy_backward");
}

template <>
int64_t CudaBackend::cross_entropy_forward_backward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                                    double smoothing, const Tensor& coef, const Tensor& loss,
                                                    const Tensor& lse, const Tensor& grad) {
  const int64_t M = logits.size(0), C = logits.size(1);
  if (M == 0) return ignore_index;
  mg::cuda::DeviceGuard guard(logits.device());
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(logits.dtype());
  bool one_pass = false;
  MG_CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    one_pass = kVec16<T> > 1 && vec_rows<T>(logits.raw_data(), C) && vec_rows<T>(grad.raw_data(), C) &&
               row_bytes <= smem_row_limit(logits.device().index);
  });
  if (!one_pass) {  // long or unaligned rows: the two kernels
    const int64_t v = cross_entropy_forward(logits, target, ignore_index, smoothing, loss, lse);
    cross_entropy_backward(coef, logits, target, lse, ignore_index, smoothing, grad);
    return v;
  }
  cudaStream_t st = stream_of(logits);
  MG_CHECK(M <= 0x7fffffff, ShapeError, "cross_entropy: too many rows (", M, ")");
  const Tensor bad = bad_row_flag(logits);
  const int64_t cs = coef.numel() == 1 ? 0 : 1;
  MG_CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    auto* pbad = static_cast<unsigned long long*>(bad.raw_data());
    // Long rows two a block (a block an SM), short ones a block each (many blocks an SM).
    const bool pipelined = row_bytes >= 32 * 1024 && 2 * row_bytes <= smem_row_limit(logits.device().index);
    with_smoothing(smoothing, [&](auto smooth) {
      constexpr bool kS = decltype(smooth)::value;
      if (pipelined) {
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(M, sm_count(logits.device())));
        allow_smem(ce_fused_pipelined_kernel<T, kS>, 2 * row_bytes);
        ce_fused_pipelined_kernel<T, kS><<<blocks, threads_for(C), 2 * row_bytes, st>>>(
            data_as<const T>(logits), data_as<const int64_t>(target), M, C, ignore_index, smoothing,
            data_as<const A>(coef), cs, data_as<A>(loss), data_as<A>(lse), pbad, data_as<T>(grad));
      } else {
        allow_smem(ce_fused_smem_kernel<T, kS>, row_bytes);
        ce_fused_smem_kernel<T, kS><<<static_cast<unsigned>(M), threads_for(C), row_bytes, st>>>(
            data_as<const T>(logits), data_as<const int64_t>(target), C, ignore_index, smoothing,
            data_as<const A>(coef), cs, data_as<A>(loss), data_as<A>(lse), pbad, data_as<T>(grad));
      }
    });
  });
  MG_CUDA_CHECK_LAUNCH("cross_entropy");
  return label_check(bad, target, C, ignore_index, st);
}

}  // namespace mg::kernels
