// Fused cross-entropy on CUDA: one block per row. The forward makes a single pass over the
// row with an online (max, sum of exp) pair per thread, merged across the block, so the
// logits are read once and nothing of size [M, C] is written; the backward reads the row
// once and writes coef * (softmax - target distribution) in the logits' dtype. For GPT-2's
// [8192, 50304] bf16 logits that replaces cast-to-f32 + log_softmax + nll scatter +
// log_softmax backward + cast back (~15 GB of traffic, two f32 [M, C] buffers) by ~2.5 GB.
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/deferred_read.h"

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
// V values at once: one rescale for their maximum, then V independent exponentials (where
// pushing them one by one chains every exponential on the one before through r). Values that
// are all -inf add nothing.
template <class A, int V>
__device__ __forceinline__ void push_vec(MaxSum<A>& r, const A (&v)[V]) {
  A mv = v[0];
#pragma unroll
  for (int k = 1; k < V; ++k) mv = max(mv, v[k]);
  if (mv == -std::numeric_limits<A>::infinity()) return;
  if (mv > r.m) {
    r.s = r.m == -std::numeric_limits<A>::infinity() ? A(0) : r.s * m_exp(r.m - mv);
    r.m = mv;
  }
  A s = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) s += m_exp(v[k] - r.m);
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

template <class T, int V>
__global__ void ce_forward_kernel(const T* logits, const int64_t* target, int64_t C, int64_t ignore_index, double e,
                                  math_t<T>* loss, math_t<T>* lse, unsigned long long* bad) {
  using A = math_t<T>;
  __shared__ A sm[32], ss[32], sx[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * C;
  MaxSum<A> r{-std::numeric_limits<A>::infinity(), A(0)};
  A sum_x = 0;
#pragma unroll 2
  for (int64_t j = threadIdx.x * V; j < C; j += static_cast<int64_t>(blockDim.x) * V) {
    const AlignedVec<T, V> p = *reinterpret_cast<const AlignedVec<T, V>*>(x + j);
    A v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] = load_m(p.v[k]);
      sum_x += v[k];
    }
    push_vec(r, v);
  }
  r = block_merge(r, sm, ss);
  if (e != 0.0) sum_x = block_sum(sum_x, sx);
  if (threadIdx.x == 0) {
    const A l = r.m + m_log(r.s);
    lse[row] = l;
    const int64_t t = target[row];
    if (t == ignore_index) {
      loss[row] = A(0);
    } else if (t < 0 || t >= C) {
      atomicMin(bad, static_cast<unsigned long long>(row));
      loss[row] = std::numeric_limits<A>::quiet_NaN();
    } else {
      const A ea = static_cast<A>(e);
      loss[row] = l - (A(1) - ea) * load_m(x[t]) - (e != 0.0 ? ea / static_cast<A>(C) * sum_x : A(0));
    }
  }
}

template <class T, int V>
__global__ void ce_backward_kernel(const math_t<T>* coef, int64_t coef_stride, const T* logits, const int64_t* target,
                                   const math_t<T>* lse, int64_t C, int64_t ignore_index, double e, T* grad) {
  using A = math_t<T>;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * C;
  T* g = grad + row * C;
  const int64_t t = target[row];
  const bool ignored = t == ignore_index;
  const A c = ignored ? A(0) : coef[row * coef_stride];
  const A l = lse[row];
  const A off = static_cast<A>(e) / static_cast<A>(C), hit = A(1) - static_cast<A>(e);
  for (int64_t j = threadIdx.x * V; j < C; j += static_cast<int64_t>(blockDim.x) * V) {
    const AlignedVec<T, V> p = *reinterpret_cast<const AlignedVec<T, V>*>(x + j);
    AlignedVec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A q = m_exp(load_m(p.v[k]) - l) - off - (j + k == t ? hit : A(0));
      o.v[k] = store_m<T>(ignored ? A(0) : c * q);
    }
    *reinterpret_cast<AlignedVec<T, V>*>(g + j) = o;
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
template <class T>
bool vec_rows(const void* p, int64_t C) {
  return kVec16<T> > 1 && C % kVec16<T> == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

template <>
int64_t CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                           double smoothing, const Tensor& loss, const Tensor& lse) {
  const int64_t M = logits.size(0), C = logits.size(1);
  if (M == 0) return ignore_index;
  mg::cuda::DeviceGuard guard(logits.device());
  cudaStream_t st = stream_of(logits);
  MG_CHECK(M <= 0x7fffffff, ShapeError, "cross_entropy: too many rows (", M, ")");
  Tensor bad = full({}, -1.0, {DType::i64, logits.device()});  // all ones: unsigned max
  auto* pbad = static_cast<unsigned long long*>(bad.raw_data());
  MG_CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    using A = math_t<T>;
    const T* px = static_cast<const T*>(logits.raw_data());
    auto* pl = static_cast<A*>(loss.raw_data());
    auto* pe = static_cast<A*>(lse.raw_data());
    const auto* pt = static_cast<const int64_t*>(target.raw_data());
    if (vec_rows<T>(px, C))
      ce_forward_kernel<T, kVec16<T>>
          <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(px, pt, C, ignore_index, smoothing, pl, pe, pbad);
    else
      ce_forward_kernel<T, 1>
          <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(px, pt, C, ignore_index, smoothing, pl, pe, pbad);
  });
  MG_CUDA_CHECK_LAUNCH("cross_entropy");
  // One 8-byte read per call, like nll_loss's label check: a bad label must raise. Inside a CUDA
  // graph capture there is nothing to read yet: the check is skipped (docs/cuda_graphs.md).
  if (mg::cuda::is_capturing(logits.device().index)) return ignore_index;
  // Inside a kernels::DeferredIndexChecks scope the read waits for the scope's finish(), which
  // raises the IndexError kernels/loss.cc raises for a returned label, word for word. Meanwhile a
  // bad row's loss is NaN and its gradient has no target term (ce_backward_kernel matches no
  // column): nothing outside the tensors is touched.
  auto settle = [target, C, ignore_index](const void* host) {
    unsigned long long row;
    std::memcpy(&row, host, sizeof row);
    if (row == ~0ULL) return;
    const int64_t v = read_target(target, row);
    MG_THROW(IndexError, "cross_entropy: target ", v, " is out of range for ", C, " classes (expected [0, ", C - 1,
             "] or ignore_index ", ignore_index, ")");
  };
  if (defer_host_read(pbad, sizeof(unsigned long long), logits.device().index, st, settle)) return ignore_index;
  unsigned long long first = 0;
  MG_CUDA_CHECK(cudaMemcpyAsync(&first, pbad, sizeof first, cudaMemcpyDeviceToHost, st));
  MG_CUDA_CHECK(cudaStreamSynchronize(st));
  return first == ~0ULL ? ignore_index : read_target(target, first);
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
    if (vec_rows<T>(px, C) && vec_rows<T>(pg, C))
      ce_backward_kernel<T, kVec16<T>>
          <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(pc, cs, px, pt, pe, C, ignore_index, smoothing, pg);
    else
      ce_backward_kernel<T, 1>
          <<<static_cast<unsigned>(M), threads_for(C), 0, st>>>(pc, cs, px, pt, pe, C, ignore_index, smoothing, pg);
  });
  MG_CUDA_CHECK_LAUNCH("cross_entropy_backward");
}

}  // namespace mg::kernels
