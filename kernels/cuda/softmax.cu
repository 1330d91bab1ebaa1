// Softmax and log-softmax along one dim on CUDA, computed in f32 (f64 for f64), stable
// (the row max is subtracted before exp), with the CPU kernel's semantics for inf rows.
// Unit-stride rows: a warp per row up to 1024 elements, held in registers when 16-byte aligned
// (one read; three passes over the row otherwise), and a block per longer row (an online max
// and sum in one read, then the write); rows along a strided dim: a thread per row
// (neighbouring rows are neighbours in memory then, so loads still coalesce).
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

template <class M>
struct RowStats {
  M mx, s;
};

// For the forward: after the max and sum of exp(x - max) of a row.
template <class M>
__device__ __forceinline__ M fix_max(M mx) {
  // A row of all -inf has no finite max; using 0 keeps exp(-inf) = 0 (NaN result, like PyTorch).
  return isinf(mx) ? (mx > M(0) ? mx : M(0)) : mx;
}

// ex is RowExp<T>(mx): exp(x - mx).
template <class T, class M>
__device__ __forceinline__ T softmax_out(M x, M mx, const RowExp<T>& ex, M inv_or_logs, bool log) {
  return log ? store_m<T>((x - mx) - inv_or_logs) : store_m<T>(ex(x) * inv_or_logs);
}

// The last pass over a row shared by blockDim.x threads: y = softmax_out(x) from the row's
// max and c (1 / sum, or log(sum) for log_softmax).
template <int V, class T, class M>
__device__ __forceinline__ void write_row(const AlignedVec<T, V>* xv, AlignedVec<T, V>* yv, int64_t nv, M mx, M c,
                                          bool log) {
  const RowExp<T> ex(mx);
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const AlignedVec<T, V> v = xv[i];
    AlignedVec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = softmax_out<T>(load_m(v.v[k]), mx, ex, c, log);
    yv[i] = o;
  }
}

// One warp's row in three passes (max, sum of exp, write), V elements a load and store: the
// fallback for rows the register path cannot take (unaligned, or a length not a multiple of V).
template <int V, class T, class M>
__device__ __forceinline__ void softmax_row(const T* x, T* y, int64_t K, bool log) {
  using Vec = AlignedVec<T, V>;
  const Vec* xv = reinterpret_cast<const Vec*>(x);
  Vec* yv = reinterpret_cast<Vec*>(y);
  const int64_t nv = K / V;
  M mx = -std::numeric_limits<M>::infinity();
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const Vec v = xv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const M e = load_m(v.v[k]);
      mx = e > mx ? e : mx;
    }
  }
  mx = fix_max(warp_max(mx));
  const RowExp<T> ex(mx);
  M s = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const Vec v = xv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) s += ex(load_m(v.v[k]));
  }
  s = warp_sum(s);
  write_row<V>(xv, yv, nv, mx, log ? m_log(s) : M(1) / s, log);
}

// A warp's row held in registers: NV vectors of V elements a lane (the row read from memory
// once, not three times: three passes over 4 KB rows from L1 ran at half the copy bandwidth in
// f32, where 64 warps' rows overflow it). f32 and f64 rows are overwritten with exp(x - max)
// after the sum, so libm's exp runs once an element; 16-bit rows stay packed (load_warp_row)
// and take the fast exp again at the write.
template <int V, int NV, class T, class M>
__device__ __forceinline__ void softmax_row_regs(const T* x, T* y, int64_t K, bool log) {
  using Vec = AlignedVec<T, V>;
  constexpr bool kKeepExp = std::is_same_v<T, M>;
  Vec* yv = reinterpret_cast<Vec*>(y);
  const int nv = static_cast<int>(K / V), lane = threadIdx.x;
  Vec row[NV];
  load_warp_row<V, NV>(x, nv, lane, row);
  M mx = -std::numeric_limits<M>::infinity();
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if (lane + 32 * j < nv)
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const M e = unpack_m(row[j], k);
        mx = e > mx ? e : mx;
      }
  mx = fix_max(warp_max(mx));
  const RowExp<T> ex(mx);
  M s = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    if (lane + 32 * j < nv) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const M e = ex(unpack_m(row[j], k));
        s += e;
        if constexpr (kKeepExp)
          if (!log) row[j].v[k] = e;
      }
    }
  }
  s = warp_sum(s);
  const M c = log ? m_log(s) : M(1) / s;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int i = lane + 32 * j;
    if (i < nv) {
      Vec o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const M v = unpack_m(row[j], k);
        o.v[k] = log ? store_m<T>((v - mx) - c) : store_m<T>((kKeepExp ? v : ex(v)) * c);
      }
      yv[i] = o;
    }
  }
}

// A long row shared by a block: one read for the max and the sum together (an online
// softmax: each thread rescales its running sum once per vector, to the vector's max when that
// is larger; the block merges the (max, sum) pairs), then one read and the write. Three reads of
// a 100-200 KB row ran at 0.49 (f32) to 0.68 (f16) of a copy's bandwidth. Same results as the three passes for inf and
// NaN rows: -inf entries add nothing, an all -inf row gives NaN, a NaN or +inf entry makes the row NaN.
template <int V, class T, class M>
__device__ __forceinline__ void softmax_row_online(const T* x, T* y, int64_t K, bool log, M* shm) {
  using Vec = AlignedVec<T, V>;
  const Vec* xv = reinterpret_cast<const Vec*>(x);
  Vec* yv = reinterpret_cast<Vec*>(y);
  const int64_t nv = K / V;
  constexpr M kNegInf = -std::numeric_limits<M>::infinity();
  M mx = kNegInf, s = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const Vec v = xv[i];
    M e[V], vmax = kNegInf;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      e[k] = load_m(v.v[k]);
      vmax = e[k] > vmax ? e[k] : vmax;  // NaN never wins a comparison: it reaches s below
    }
    const M m = vmax > mx ? vmax : mx;
    if (m != kNegInf) {
      // One rescale a vector, then its V terms (independent exps, no per-element branch).
      const RowExp<T> ex(m);
      M add = 0;
#pragma unroll
      for (int k = 0; k < V; ++k) add += ex(e[k]);  // -inf adds 0; NaN, or +inf twice, NaN
      s = (mx == kNegInf ? M(0) : s * ex(mx)) + add;
      mx = m;
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (e[k] != e[k]) s += e[k];  // NaN among -inf: the row is NaN
    }
  }
  const M row_mx = fix_max(block_max(mx, shm, kNegInf));
  s = block_sum(mx == kNegInf ? s : s * RowExp<T>(row_mx)(mx), shm);  // s is 0 or NaN there
  write_row<V>(xv, yv, nv, row_mx, log ? m_log(s) : M(1) / s, log);
}

__device__ __forceinline__ bool aligned16(const void* p, const void* q) {
  return ((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(q)) & 15) == 0;
}

// Rows up to 1024 elements: blockDim = (32, 8), a warp per row. The bounds keep f16/bf16 at 32
// registers a lane (their rows stay packed), so eight blocks, all 64 warps, fit an SM: left free,
// ptxas took 36-40 around the exponentials and six fitted. f32 (53) and f64 (80) keep the blocks
// an SM they had.
template <class T>
__global__ void __launch_bounds__(256, mg::cuda::is_half_v<T> ? 8 : 3)
    softmax_warp_rows_kernel(const T* a, T* out, OffsetCalc<2> oc, int64_t rows, int64_t K, bool log) {
  using M = math_t<T>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  if (row >= rows) return;  // whole warps only
  int64_t off[2];
  oc.get(row, off);
  const T* x = a + off[1];
  T* y = out + off[0];
  // Vector loads when the row allows (uniform across the warp: one row).
  constexpr int V = kVec16<T>;
  const int64_t nv = K / V;
  if (V > 1 && K % V == 0 && nv <= 32 * kWarpRowVecs<T> && aligned16(x, y)) {
    // The smallest power-of-two count of vectors per lane that covers the row.
    if (nv <= 32)
      softmax_row_regs<V, 1, T, M>(x, y, K, log);
    else if (nv <= 64)
      softmax_row_regs<V, 2, T, M>(x, y, K, log);
    else if (nv <= 128 || kWarpRowVecs<T> < 8)
      softmax_row_regs<V, (kWarpRowVecs<T> < 4 ? kWarpRowVecs<T> : 4), T, M>(x, y, K, log);
    else
      softmax_row_regs<V, kWarpRowVecs<T>, T, M>(x, y, K, log);
  } else {
    softmax_row<1, T, M>(x, y, K, log);
  }
}

// Longer rows: blockDim = (tx, 1), a block per row.
template <class T>
__global__ void softmax_block_rows_kernel(const T* a, T* out, OffsetCalc<2> oc, int64_t rows, int64_t K, bool log) {
  using M = math_t<T>;
  __shared__ M shm[32];
  const int64_t row = blockIdx.x;
  int64_t off[2];
  oc.get(row, off);
  const T* x = a + off[1];
  T* y = out + off[0];
  constexpr int V = kVec16<T>;
  if (V > 1 && K % V == 0 && aligned16(x, y))
    softmax_row_online<V>(x, y, K, log, shm);
  else
    softmax_row_online<1>(x, y, K, log, shm);
}

// Rows up to smem_row_limit() bytes with K a multiple of V: blockDim = (tx, 1), a
// block per row. The row is copied to shared memory with cp.async (a thread's whole share in
// flight at once, no registers held), then the online pass and the write read it from there: the
// row is read from memory once. Reading it twice from memory (the block path above) ran at
// 0.58-0.62 of a copy over 50304: 264 rows of 100-200 KB in flight overflow the L2.
template <class T>
__global__ void softmax_smem_rows_kernel(const T* a, T* out, OffsetCalc<2> oc, int64_t rows, int64_t K, bool log) {
  using M = math_t<T>;
  constexpr int V = kVec16<T>;
  using Vec = AlignedVec<T, V>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];  // one name for every T
  Vec* smem_row = reinterpret_cast<Vec*>(smem_bytes);
  __shared__ M shm[32];
  int64_t off[2];
  oc.get(blockIdx.x, off);
  const T* x = a + off[1];
  T* y = out + off[0];
  if (!aligned16(x, y)) return softmax_row_online<1>(x, y, K, log, shm);  // uniform across the block
  ptx::cp_async_block(smem_row, reinterpret_cast<const Vec*>(x), static_cast<int>(K / V));
  ptx::cp_async_wait<0>();
  __syncthreads();
  softmax_row_online<V>(reinterpret_cast<const T*>(smem_row), y, K, log, shm);
}

template <class T>
__global__ void softmax_cols_kernel(const T* a, T* out, OffsetCalc<2> oc, int64_t rows, int64_t K, int64_t sa,
                                    int64_t so, bool log) {
  using M = math_t<T>;
  MG_GRID_STRIDE(row, rows) {
    int64_t off[2];
    oc.get(row, off);
    const T* x = a + off[1];
    T* y = out + off[0];
    M mx = -std::numeric_limits<M>::infinity();
    for (int64_t j = 0; j < K; ++j) {
      const M v = load_m(x[j * sa]);
      mx = v > mx ? v : mx;
    }
    mx = fix_max(mx);
    const RowExp<T> ex(mx);
    M s = 0;
    for (int64_t j = 0; j < K; ++j) s += ex(load_m(x[j * sa]));
    const M c = log ? m_log(s) : M(1) / s;
    for (int64_t j = 0; j < K; ++j) y[j * so] = softmax_out<T>(load_m(x[j * sa]), mx, ex, c, log);
  }
}

// log:     grad_in = g - exp(y) * sum(g)
// softmax: grad_in = y * (g - sum(g * y))
template <class T, class M>
__device__ __forceinline__ M bwd_term(M g, M yv, bool log) {
  return log ? g : g * yv;
}
template <class T, class M>
__device__ __forceinline__ T bwd_out(M g, M yv, M s, bool log) {
  return log ? store_m<T>(g - m_exp(yv) * s) : store_m<T>(yv * (g - s));
}

// A backward row's gradient, output (y) and result pointers.
template <class T>
struct BwdRow {
  const T* g;
  const T* y;
  T* r;
};
template <class T>
__device__ __forceinline__ BwdRow<T> bwd_row(const T* grad, const T* yt, T* out, const OffsetCalc<3>& oc, int64_t row) {
  int64_t off[3];
  oc.get(row, off);
  return {grad + off[0], yt + off[1], out + off[2]};
}

template <class T>
__global__ void softmax_bwd_rows_kernel(const T* grad, const T* yt, T* out, OffsetCalc<3> oc, int64_t rows, int64_t K,
                                        bool log) {
  using M = math_t<T>;
  __shared__ M shm[32];
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  const bool big = blockDim.x > 32;
  if (!big && row >= rows) return;
  const auto [g, y, r] = bwd_row(grad, yt, out, oc, row);
  M s = 0;
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) s += bwd_term<T>(load_m(g[j]), load_m(y[j]), log);
  s = big ? block_sum(s, shm) : warp_sum(s);
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) r[j] = bwd_out<T>(load_m(g[j]), load_m(y[j]), s, log);
}

template <class T>
__global__ void softmax_bwd_cols_kernel(const T* grad, const T* yt, T* out, OffsetCalc<3> oc, int64_t rows, int64_t K,
                                        int64_t sg, int64_t sy, int64_t so, bool log) {
  using M = math_t<T>;
  MG_GRID_STRIDE(row, rows) {
    const auto [g, y, r] = bwd_row(grad, yt, out, oc, row);
    M s = 0;
    for (int64_t j = 0; j < K; ++j) s += bwd_term<T>(load_m(g[j * sg]), load_m(y[j * sy]), log);
    for (int64_t j = 0; j < K; ++j) r[j * so] = bwd_out<T>(load_m(g[j * sg]), load_m(y[j * sy]), s, log);
  }
}

// Launch shape for unit-stride rows of K elements.
void row_launch(int64_t rows, int64_t K, dim3* grid, dim3* block) {
  const int tx = K > 1024 ? (K > 8192 ? 1024 : 256) : 32;
  *block = dim3(tx, tx == 32 ? 8 : 1);
  const int64_t g = (rows + block->y - 1) / block->y;
  MG_CHECK(g <= 0x7fffffff, ShapeError, "softmax: too many rows (", rows, ")");
  *grid = dim3(static_cast<unsigned>(g));
}

// The shape with `dim` collapsed to 1: one entry per row.
Shape rows_shape(const Tensor& t, int64_t dim) { return with_dim(t.sizes(), dim, 1); }

}  // namespace

template <>
void CudaBackend::softmax(const Tensor& a, int64_t dim, bool log, const Tensor& out) {
  const char* op = log ? "log_softmax" : "softmax";
  const int64_t K = a.dim() ? a.size(dim) : 1;
  if (a.numel() == 0) return;
  const int64_t rows = a.numel() / K;
  const int64_t sa = a.dim() ? a.stride(dim) : 1, so = out.dim() ? out.stride(dim) : 1;
  mg::cuda::DeviceGuard g(out.device());
  cudaStream_t st = stream_of(out);
  MG_CUDA_DISPATCH_FLOAT(a.dtype(), op, [&] {
    using T = scalar_t;
    // One block row per softmax row (unit stride along `d`).
    auto run_rows = [&](const Tensor& x, const Tensor& o, int64_t d) {
      auto oc = make_offset_calc<2>(rows_shape(x, d), {&o.strides(), &x.strides()});
      dim3 grid, block;
      row_launch(rows, K, &grid, &block);
      const size_t row_bytes = K * sizeof(T);
      if (block.x == 32) {
        softmax_warp_rows_kernel<T><<<grid, block, 0, st>>>(data_as<const T>(x), data_as<T>(o), oc, rows, K, log);
      } else if (const size_t limit = smem_row_limit(out.device().index); K % kVec16<T> == 0 && row_bytes <= limit) {
        // 1024 threads at 40 registers fill an SM's register file: where two rows fit in shared
        // memory (f16/bf16 over 50304), 512-thread blocks let one row's load overlap another's
        // write (1024 threads: 0.66-0.69 of a copy in f16/bf16, one block an SM).
        if (block.x == 1024 && 2 * (row_bytes + 1024) <= limit + 1024) block.x = 512;
        allow_smem(softmax_smem_rows_kernel<T>, row_bytes);
        softmax_smem_rows_kernel<T>
            <<<grid, block, row_bytes, st>>>(data_as<const T>(x), data_as<T>(o), oc, rows, K, log);
      } else {
        softmax_block_rows_kernel<T><<<grid, block, 0, st>>>(data_as<const T>(x), data_as<T>(o), oc, rows, K, log);
      }
    };
    if ((sa == 1 && so == 1) || K == 1) {
      run_rows(a, out, dim);
    } else if (rows < 64) {
      // Few long strided rows: run on a contiguous copy with the dim moved last.
      const int64_t last = a.dim() - 1;
      Tensor at = raw::contiguous(raw::transpose(a, dim, last));
      Tensor ot = empty(at.sizes(), {out.dtype(), out.device()});
      run_rows(at, ot, last);
      MG_CUDA_CHECK_LAUNCH(op);
      return raw::copy_(out, raw::transpose(ot, dim, last));
    } else {
      auto oc = make_offset_calc<2>(rows_shape(a, dim), {&out.strides(), &a.strides()});
      softmax_cols_kernel<T>
          <<<blocks_for(rows), kBlock, 0, st>>>(data_as<const T>(a), data_as<T>(out), oc, rows, K, sa, so, log);
    }
    MG_CUDA_CHECK_LAUNCH(op);
  });
}

template <>
void CudaBackend::softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const Tensor& out) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  const int64_t K = y.dim() ? y.size(dim) : 1;
  if (y.numel() == 0) return;
  const int64_t rows = y.numel() / K;
  const int64_t sg = y.dim() ? grad.stride(dim) : 1, sy = y.dim() ? y.stride(dim) : 1,
                so = y.dim() ? out.stride(dim) : 1;
  mg::cuda::DeviceGuard g(out.device());
  cudaStream_t st = stream_of(out);
  MG_CUDA_DISPATCH_FLOAT(y.dtype(), op, [&] {
    using T = scalar_t;
    // One block row per softmax row (unit stride along `d`).
    auto run_rows = [&](const Tensor& gr, const Tensor& yv, const Tensor& o, int64_t d) {
      auto oc = make_offset_calc<3>(rows_shape(yv, d), {&gr.strides(), &yv.strides(), &o.strides()});
      dim3 grid, block;
      row_launch(rows, K, &grid, &block);
      softmax_bwd_rows_kernel<T>
          <<<grid, block, 0, st>>>(data_as<const T>(gr), data_as<const T>(yv), data_as<T>(o), oc, rows, K, log);
    };
    if ((sg == 1 && sy == 1 && so == 1) || K == 1) {
      run_rows(grad, y, out, dim);
    } else if (rows < 64) {
      // Few long strided rows, as in the forward.
      const int64_t last = y.dim() - 1;
      Tensor gt = raw::contiguous(raw::transpose(grad, dim, last));
      Tensor yt = raw::contiguous(raw::transpose(y, dim, last));
      Tensor ot = empty(yt.sizes(), {out.dtype(), out.device()});
      run_rows(gt, yt, ot, last);
      MG_CUDA_CHECK_LAUNCH(op);
      return raw::copy_(out, raw::transpose(ot, dim, last));
    } else {
      auto oc = make_offset_calc<3>(rows_shape(y, dim), {&grad.strides(), &y.strides(), &out.strides()});
      softmax_bwd_cols_kernel<T><<<blocks_for(rows), kBlock, 0, st>>>(data_as<const T>(grad), data_as<const T>(y),
                                                                      data_as<T>(out), oc, rows, K, sg, sy, so, log);
    }
    MG_CUDA_CHECK_LAUNCH(op);
  });
}

}  // namespace mg::kernels
