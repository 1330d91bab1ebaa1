// Reductions on CUDA. One generic sum-like reduction: each output (a kept-dims index) sums
// a transform of its R reduced elements. Two layouts:
//   rows:    the reduced elements are contiguous (stride 1): a warp (or a block, for long
//            rows) per output, lanes read consecutive elements;
//   columns: consecutive outputs are contiguous in the input (e.g. sum over dim 0 of
//            [N, C]): a thread per output, 8 threads down each column, coalesced across x.
// When there are too few outputs to fill the GPU, the reduced range is split over
// gridDim.y into partial sums (a workspace from our allocator) and a finalize kernel
// adds them. Floating inputs accumulate in f32 (f64 for f64), integers in i64.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

// The DType of an accumulation / math type (for workspaces).
template <class A>
DType dtype_of_acc() {
  if constexpr (std::is_same_v<A, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<A, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<A, int32_t>)
    return DType::i32;
  else
    return DType::i64;
}

enum Mode : int { kSum = 0, kSumSq = 1, kSqDev = 2 };

template <class A>
struct RedArgs {
  int mode = kSum;
  const A* mean = nullptr;  // per output (linear index), for kSqDev
  double scale = 1.0;       // applied once per output (floating only)
  int64_t num_out = 0, R = 0, chunk = 0;
  int64_t rstride = -1;  // stride of the reduced elements when they collapse to one dim, else -1
  OffsetCalc<2> oc;      // output linear index -> (out offset, input base offset)
  OffsetCalc<1> rc;      // reduced linear index -> input offset (when rstride < 0)
};

constexpr int kColY = 8;      // threads down each column in the column kernel
constexpr int kRowBig = 256;  // threads per row for long rows

template <class T, class A>
__device__ __forceinline__ A transform(T v, int mode, A m) {
  const A x = static_cast<A>(load_m(v));
  if (mode == kSum) return x;
  if (mode == kSumSq) return x * x;
  const A d = x - m;
  return d * d;
}

template <class O, class A>
__device__ __forceinline__ O finish(A acc, double scale) {
  if constexpr (std::is_floating_point_v<A>)
    return store_m<O>(static_cast<A>(static_cast<double>(acc) * scale));
  else
    return static_cast<O>(acc);
}

template <class A>
__device__ __forceinline__ int64_t red_offset(const RedArgs<A>& args, int64_t r) {
  if (args.rstride >= 0) return r * args.rstride;
  int64_t off[1];
  args.rc.get(r, off);
  return off[0];
}

// blockDim = (tx, ty): tx threads per output row, ty rows per block (ty == 1 when tx > 32).
template <class T, class A, class O>
__global__ void reduce_rows_kernel(const T* a, O* out, A* partial, RedArgs<A> args) {
  __shared__ A shm[32];
  const int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  const int64_t r0 = blockIdx.y * args.chunk;
  const int64_t r1 = ::min(args.R, r0 + args.chunk);
  A acc = A(0);
  int64_t offs[2] = {0, 0};
  if (o < args.num_out) {
    args.oc.get(o, offs);
    const T* base = a + offs[1];
    const A m = args.mode == kSqDev ? args.mean[o] : A(0);
    constexpr int V = kVec16<T>;
    using Vec = AlignedVec<T, V>;
    if (args.rstride == 1 && V > 1 && (reinterpret_cast<uintptr_t>(base + r0) & 15) == 0) {
      // 16-byte loads over the aligned run (2-byte types read 64 bytes a warp otherwise).
      const int64_t nv = (r1 - r0) / V;
      const Vec* bv = reinterpret_cast<const Vec*>(base + r0);
#pragma unroll 2
      for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
        const Vec x = bv[i];
#pragma unroll
        for (int k = 0; k < V; ++k) acc += transform<T, A>(x.v[k], args.mode, m);
      }
      for (int64_t r = r0 + nv * V + threadIdx.x; r < r1; r += blockDim.x)
        acc += transform<T, A>(base[r], args.mode, m);
    } else if (args.rstride == 1) {
#pragma unroll 4
      for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc += transform<T, A>(base[r], args.mode, m);
    } else {
#pragma unroll 4
      for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
        acc += transform<T, A>(base[red_offset(args, r)], args.mode, m);
    }
  }
  acc = blockDim.x > 32 ? block_sum(acc, shm) : warp_sum(acc);  // blockDim.x is 32 or a multiple of it
  if (threadIdx.x == 0 && o < args.num_out) {
    if (gridDim.y == 1)
      out[offs[0]] = finish<O>(acc, args.scale);
    else
      partial[blockIdx.y * args.num_out + o] = acc;
  }
}

// blockDim = (32, kColY): x over 32 consecutive outputs, y down the reduced range.
template <class T, class A, class O>
__global__ void reduce_cols_kernel(const T* a, O* out, A* partial, RedArgs<A> args) {
  __shared__ A shm[kColY][33];
  const int64_t o = blockIdx.x * 32LL + threadIdx.x;
  const int64_t r0 = blockIdx.y * args.chunk;
  const int64_t r1 = ::min(args.R, r0 + args.chunk);
  A acc = A(0);
  int64_t offs[2] = {0, 0};
  if (o < args.num_out) {
    args.oc.get(o, offs);
    const T* base = a + offs[1];
    const A m = args.mode == kSqDev ? args.mean[o] : A(0);
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY)
      acc += transform<T, A>(base[red_offset(args, r)], args.mode, m);
  }
  shm[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < args.num_out) {
    A s = A(0);
#pragma unroll
    for (int y = 0; y < kColY; ++y) s += shm[y][threadIdx.x];
    if (gridDim.y == 1)
      out[offs[0]] = finish<O>(s, args.scale);
    else
      partial[blockIdx.y * args.num_out + o] = s;
  }
}

// The column kernel when each thread can own V adjacent outputs: the outputs are one
// contiguous run in both the input (unit stride) and the output, so a row of 32 * V outputs
// is one coalesced stretch of 16-byte loads (the scalar kernel read 64-128 bytes per warp a row).
template <class T, class A, class O, int V>
__global__ void reduce_cols_vec_kernel(const T* a, O* out, A* partial, RedArgs<A> args) {
  __shared__ A shm[kColY][32 * V + 1];
  wait_for_previous();  // launched dependent: `a` is the kernel ahead's output (a gradient, mostly)
  allow_dependents();   // the finalize may be scheduled now; it waits for this kernel to complete
  const int64_t o = (blockIdx.x * 32LL + threadIdx.x) * V;
  const int64_t r0 = blockIdx.y * args.chunk;
  const int64_t r1 = ::min(args.R, r0 + args.chunk);
  A acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = A(0);
  if (o < args.num_out) {
    A m[V];
#pragma unroll
    for (int j = 0; j < V; ++j) m[j] = args.mode == kSqDev ? args.mean[o + j] : A(0);
    const T* base = a + o;
    // Eight 16-byte loads in flight a thread: with short chunks (8 rows a thread, see reduce_t) the
    // grid has enough of them to cover the copy's latency.
#pragma unroll 8
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY) {
      const AlignedVec<T, V> p = *reinterpret_cast<const AlignedVec<T, V>*>(base + r * args.rstride);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += transform<T, A>(p.v[j], args.mode, m[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) shm[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  // Thread (x, y) now finishes outputs x + 32 * k of this block's 32 * V, k = y, y + kColY, ...
  for (int k = threadIdx.y; k < V; k += kColY) {
    const int col = threadIdx.x + 32 * k;
    const int64_t oo = blockIdx.x * 32LL * V + col;
    if (oo >= args.num_out) continue;
    A sum = A(0);
#pragma unroll
    for (int y = 0; y < kColY; ++y) sum += shm[y][col];
    if (gridDim.y == 1)
      out[oo] = finish<O>(sum, args.scale);
    else
      partial[blockIdx.y * args.num_out + oo] = sum;
  }
}

// Adds the splits' partials of 32 consecutive outputs a block: thread (x, y) sums splits y, y +
// kFinY, ... of output x (kFinY loads in flight per output, where a thread per output made
// `splits` dependent-latency loads), then the kFinY sums are added in order (deterministic).
constexpr int kFinY = 16;
template <class A, class O>
__global__ void reduce_finalize_kernel(const A* partial, int splits, O* out, RedArgs<A> args) {
  __shared__ A shm[kFinY][33];
  wait_for_previous();  // launched dependent on the column kernel that wrote `partial`
  const int64_t o = blockIdx.x * 32LL + threadIdx.x;
  A s = A(0);
  if (o < args.num_out)
    for (int k = threadIdx.y; k < splits; k += kFinY) s += partial[k * args.num_out + o];
  shm[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || o >= args.num_out) return;
  for (int y = 1; y < kFinY; ++y) s += shm[y][threadIdx.x];
  int64_t offs[2];
  args.oc.get(o, offs);
  out[offs[0]] = finish<O>(s, args.scale);
}

// Enough blocks to cover the GPU twice.
int64_t fill_blocks(const Device& d) { return 2LL * sm_count(d); }

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// out (a's rank, size 1 on reduced dims) = scale * sum over reduced dims of transform(a).
template <class T, class A, class O>
void reduce_t(const Tensor& a, const Tensor& out, int mode, double scale, const A* mean) {
  RedArgs<A> args;
  args.mode = mode;
  args.mean = mean;
  args.scale = scale;
  args.num_out = out.numel();
  if (args.num_out == 0) return;
  args.R = a.numel() / args.num_out;
  args.oc = make_offset_calc<2>(out.sizes(), {&out.strides(), &a.strides()});
  Shape rshape(a.dim(), 1);
  for (int64_t d = 0; d < a.dim(); ++d)
    if (out.size(d) != a.size(d)) rshape[d] = a.size(d);
  args.rc = make_offset_calc<1>(rshape, {&a.strides()});
  if (args.rc.ndim == 0)
    args.rstride = 0;
  else if (args.rc.ndim == 1)
    args.rstride = args.rc.strides[0][0];
  cudaStream_t st = stream_of(out);
  const T* pa = static_cast<const T*>(a.raw_data());
  O* po = static_cast<O*>(out.raw_data());

  const bool rows = args.rstride == 1 || args.R == 1 || !(args.oc.ndim >= 1 && args.oc.strides[0][1] == 1);
  // One run of contiguous outputs, read with unit stride, rows 16-byte aligned: vector loads.
  constexpr int kV = kVec16<T>;
  const bool vec = !rows && kV > 1 && args.oc.ndim == 1 && args.oc.strides[0][0] == 1 && args.rstride > 0 &&
                   args.num_out % kV == 0 && args.rstride % kV == 0 && (reinterpret_cast<uintptr_t>(pa) & 15) == 0;
  dim3 block, grid;
  int64_t min_chunk;
  if (vec) {
    block = dim3(32, kColY);
    grid.x = static_cast<unsigned>(cdiv(args.num_out, 32 * kV));
    min_chunk = 8LL * kColY;  // 8 rows a thread: the kernel's unrolled loads
  } else if (rows) {
    // A warp per row up to 16K elements: 256 threads on a 4096-element row read two vectors
    // each and spent the rest on the block reduction's barriers (0.6 of copy in f16).
    const int tx = args.R > 16384 ? kRowBig : 32;
    block = dim3(tx, kRowBig / tx);
    grid.x = static_cast<unsigned>(cdiv(args.num_out, block.y));
    min_chunk = 16LL * tx;
  } else {
    block = dim3(32, kColY);
    grid.x = static_cast<unsigned>(cdiv(args.num_out, 32));
    min_chunk = 64LL * kColY;
  }
  MG_CHECK(grid.x <= 0x7fffffffu, ShapeError, "reduction: too many outputs (", args.num_out, ")");
  int64_t splits = 1;
  const int64_t fill = vec ? 4 * fill_blocks(out.device()) : fill_blocks(out.device());  // vector blocks are short
  if (grid.x < fill && args.R > 2 * min_chunk)
    splits = std::min<int64_t>({cdiv(fill, grid.x), args.R / min_chunk, 65535});
  args.chunk = cdiv(args.R, splits);
  if (rows && splits > 1) args.chunk = cdiv(args.chunk, 16) * 16;  // chunks start 16-element aligned (vector loads)
  splits = args.R ? cdiv(args.R, args.chunk) : 1;
  if (args.R == 0) args.chunk = 0;
  grid.y = static_cast<unsigned>(splits);

  Tensor ws;
  A* partial = nullptr;
  if (splits > 1) {
    ws = empty({splits * args.num_out}, {dtype_of_acc<A>(), out.device()});
    partial = static_cast<A*>(ws.raw_data());
  }
  if (vec)
    launch_dependent(reduce_cols_vec_kernel<T, A, O, kV>, grid, block, 0, st, pa, po, partial, args);
  else if (rows)
    reduce_rows_kernel<T, A, O><<<grid, block, 0, st>>>(pa, po, partial, args);
  else
    reduce_cols_kernel<T, A, O><<<grid, block, 0, st>>>(pa, po, partial, args);
  MG_CUDA_CHECK_LAUNCH("reduce");
  if (splits > 1) {
    MG_CHECK(cdiv(args.num_out, 32) <= 0x7fffffff, ShapeError, "reduction: too many outputs (", args.num_out, ")");
    launch_dependent(reduce_finalize_kernel<A, O>, dim3(static_cast<unsigned>(cdiv(args.num_out, 32))), dim3(32, kFinY),
                     0, st, partial, static_cast<int>(splits), po, args);
    MG_CUDA_CHECK_LAUNCH("reduce (finalize)");
  }
}

// ---- max / min with indices along one dim ----

template <class M>
__device__ __forceinline__ bool better(M v1, int64_t i1, M v2, int64_t i2, bool is_max) {
  // True when (v1, i1) should win over (v2, i2): NaN wins, then the extreme, then the lower index.
  const bool n1 = m_isnan(v1), n2 = m_isnan(v2);
  if (n1 || n2) return n1 && (!n2 || i1 < i2);
  if (v1 != v2) return is_max ? v1 > v2 : v1 < v2;
  return i1 < i2;
}

template <class M>
struct ArgArgs {
  bool is_max = true;
  int64_t num_out = 0, K = 0, sk = 0, chunk = 0;
  OffsetCalc<3> oc;  // output linear -> (values, indices, input base)
};

template <class T>
__global__ void argred_rows_kernel(const T* a, T* values, int64_t* indices, math_t<T>* pv, int64_t* pi,
                                   ArgArgs<math_t<T>> args) {
  using M = math_t<T>;
  __shared__ M sv[32];
  __shared__ int64_t si[32];
  const int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  const int64_t k0 = blockIdx.y * args.chunk;
  const int64_t k1 = ::min(args.K, k0 + args.chunk);
  M best = M(0);
  int64_t bi = -1;
  int64_t offs[3] = {0, 0, 0};
  if (o < args.num_out) {
    args.oc.get(o, offs);
    const T* base = a + offs[2];
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
      const M v = load_m(base[k * args.sk]);
      if (bi < 0 || better(v, k, best, bi, args.is_max)) {
        best = v;
        bi = k;
      }
    }
  }
  // Combine across the warp (an index of -1 marks "nothing yet").
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    const M ov = __shfl_xor_sync(0xffffffffu, best, s);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, s);
    if (oi >= 0 && (bi < 0 || better(ov, oi, best, bi, args.is_max))) {
      best = ov;
      bi = oi;
    }
  }
  if (blockDim.x > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
      sv[warp] = best;
      si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w)
        if (si[w] >= 0 && (bi < 0 || better(sv[w], si[w], best, bi, args.is_max))) {
          best = sv[w];
          bi = si[w];
        }
    }
  }
  if (threadIdx.x == 0 && o < args.num_out) {
    if (gridDim.y == 1) {
      values[offs[0]] = store_m<T>(best);
      indices[offs[1]] = bi;
    } else {
      pv[blockIdx.y * args.num_out + o] = best;
      pi[blockIdx.y * args.num_out + o] = bi;
    }
  }
}

// A thread per output, scanning its K elements in order (strided rows: columns coalesce).
template <class T>
__global__ void argred_cols_kernel(const T* a, T* values, int64_t* indices, ArgArgs<math_t<T>> args) {
  using M = math_t<T>;
  MG_GRID_STRIDE(o, args.num_out) {
    int64_t offs[3];
    args.oc.get(o, offs);
    const T* base = a + offs[2];
    M best = load_m(base[0]);
    int64_t bi = 0;
    for (int64_t k = 1; k < args.K; ++k) {
      const M v = load_m(base[k * args.sk]);
      if (better(v, k, best, bi, args.is_max)) {
        best = v;
        bi = k;
      }
    }
    values[offs[0]] = store_m<T>(best);
    indices[offs[1]] = bi;
  }
}

template <class T>
__global__ void argred_finalize_kernel(const math_t<T>* pv, const int64_t* pi, int splits, T* values, int64_t* indices,
                                       ArgArgs<math_t<T>> args) {
  using M = math_t<T>;
  MG_GRID_STRIDE(o, args.num_out) {
    M best = pv[o];
    int64_t bi = pi[o];
    for (int k = 1; k < splits; ++k) {
      const int64_t i = pi[k * args.num_out + o];
      const M v = pv[k * args.num_out + o];
      if (i >= 0 && (bi < 0 || better(v, i, best, bi, args.is_max))) {
        best = v;
        bi = i;
      }
    }
    int64_t offs[3];
    args.oc.get(o, offs);
    values[offs[0]] = store_m<T>(best);
    indices[offs[1]] = bi;
  }
}

template <class T>
__global__ void nonfinite_kernel(const T* a, OffsetCalc<1> oc, int64_t n, int* flag) {
  MG_GRID_STRIDE(i, n) {
    int64_t off[1];
    oc.get(i, off);
    const auto v = load_m(a[off[0]]);
    if (!isfinite(v)) *flag = 1;  // benign race: every writer stores 1
  }
}

}  // namespace

namespace {
// scale * sum (mode) into out; for kSqDev, `mean` is the per-output mean in the math type. The
// 16-bit floats also reduce into an f32 `out` (var's mean).
void float_reduce(const Tensor& a, const Tensor& out, int mode, double scale, const void* mean, const char* op) {
  MG_DISPATCH_TYPES(mg::cuda::DeviceTypes, FloatDTypes, a.dtype(), op, ": expected a floating tensor, got ", [&] {
    using M = math_t<scalar_t>;
    const M* m = static_cast<const M*>(mean);
    if constexpr (mg::cuda::is_half_v<scalar_t>)
      if (out.dtype() == DType::f32) return reduce_t<scalar_t, M, float>(a, out, mode, scale, m);
    reduce_t<scalar_t, M, scalar_t>(a, out, mode, scale, m);
  });
}
}  // namespace

template <>
void CudaBackend::sum(const Tensor& a, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  if (is_floating(a.dtype())) return float_reduce(a, out, kSum, 1.0, nullptr, "sum");
  MG_CHECK(out.dtype() == DType::i64, DTypeError, "sum: integer input needs an i64 output, got ", out.dtype());
  MG_DISPATCH_TYPES(mg::cuda::DeviceTypes, IntegralDTypes, a.dtype(), "sum", ": unsupported dtype ",
                    [&] { reduce_t<scalar_t, int64_t, int64_t>(a, out, kSum, 1.0, nullptr); });
}

template <>
void CudaBackend::mean(const Tensor& a, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  const int64_t count = out.numel() ? a.numel() / out.numel() : 0;
  float_reduce(a, out, kSum, 1.0 / static_cast<double>(count), nullptr, "mean");
}

template <>
void CudaBackend::var(const Tensor& a, int64_t correction, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  MG_CHECK(is_floating(a.dtype()), DTypeError, "var: expected a floating tensor, got ", a.dtype());
  const int64_t count = out.numel() ? a.numel() / out.numel() : 0;
  // Two passes: the mean (kept in the accumulation type), then the squared deviations.
  Tensor mu = empty(out.sizes(), {a.dtype() == DType::f64 ? DType::f64 : DType::f32, out.device()});
  float_reduce(a, mu, kSum, 1.0 / static_cast<double>(count), nullptr, "var");
  const double denom = std::max<double>(0.0, static_cast<double>(count - correction));
  float_reduce(a, out, kSqDev, 1.0 / denom, mu.raw_data(), "var");
}

template <>
void CudaBackend::sum_squares(const Tensor& a, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  Tensor x = is_floating(a.dtype()) ? a : raw::to_dtype(a, DType::f32);
  Tensor o = raw::view(out, Shape(x.dim(), 1));  // 0-dim out seen with x's rank
  if (x.numel() == 0) {
    raw::fill_(out, 0.0);
    return;
  }
  if (x.dtype() == DType::f64 && out.dtype() == DType::f32) x = raw::to_dtype(x, DType::f32);
  if (x.dtype() != DType::f64 && out.dtype() == DType::f64) x = raw::to_dtype(x, DType::f64);
  float_reduce(x, o, kSumSq, 1.0, nullptr, "sum_squares");
}

template <>
void CudaBackend::max_min(const Tensor& a, int64_t dim, bool is_max, const Tensor& values, const Tensor& indices) {
  const char* op = is_max ? "max" : "min";
  mg::cuda::DeviceGuard g(values.device());
  cudaStream_t st = stream_of(values);
  const int64_t num_out = values.numel();
  if (num_out == 0) return;
  const int64_t K = a.dim() ? a.size(dim) : 1;
  const int64_t sk = a.dim() ? a.stride(dim) : 0;
  MG_CUDA_DISPATCH_ALL(a.dtype(), op, [&] {
    using T = scalar_t;
    using M = math_t<T>;
    ArgArgs<M> args;
    args.is_max = is_max;
    args.num_out = num_out;
    args.K = K;
    args.sk = sk;
    args.oc = make_offset_calc<3>(values.sizes(), {&values.strides(), &indices.strides(), &a.strides()});
    const T* pa = static_cast<const T*>(a.raw_data());
    T* pv = static_cast<T*>(values.raw_data());
    int64_t* pi = static_cast<int64_t*>(indices.raw_data());
    if (sk != 1 && K > 1 && num_out >= 32) {
      argred_cols_kernel<T><<<blocks_for(num_out), kBlock, 0, st>>>(pa, pv, pi, args);
      MG_CUDA_CHECK_LAUNCH(op);
      return;
    }
    const int tx = K > 2048 ? kRowBig : 32;
    dim3 block(tx, kRowBig / tx), grid(static_cast<unsigned>(cdiv(num_out, block.y)));
    int64_t splits = 1;
    const int64_t min_chunk = 16LL * tx;
    const int64_t fill = fill_blocks(values.device());
    if (grid.x < fill && K > 2 * min_chunk) splits = std::min<int64_t>({cdiv(fill, grid.x), K / min_chunk, 65535});
    args.chunk = cdiv(K, splits);
    splits = cdiv(K, args.chunk);
    grid.y = static_cast<unsigned>(splits);
    Tensor wv, wi;
    M* ppv = nullptr;
    int64_t* ppi = nullptr;
    if (splits > 1) {
      wv = empty({splits * num_out}, {dtype_of_acc<M>(), values.device()});
      wi = empty({splits * num_out}, {DType::i64, values.device()});
      ppv = static_cast<M*>(wv.raw_data());
      ppi = static_cast<int64_t*>(wi.raw_data());
    }
    argred_rows_kernel<T><<<grid, block, 0, st>>>(pa, pv, pi, ppv, ppi, args);
    MG_CUDA_CHECK_LAUNCH(op);
    if (splits > 1) {
      argred_finalize_kernel<T>
          <<<blocks_for(num_out), kBlock, 0, st>>>(ppv, ppi, static_cast<int>(splits), pv, pi, args);
      MG_CUDA_CHECK_LAUNCH(op);
    }
  });
}

template <>
bool CudaBackend::has_nonfinite(const Tensor& a) {
  if (!is_floating(a.dtype()) || a.numel() == 0) return false;
  MG_CHECK(!mg::cuda::is_capturing(a.device().index), DeviceError,
           "has_nonfinite: reads its answer on the host, which a CUDA graph capture cannot do (an inf check "
           "inside a captured step must stay on the device)");
  mg::cuda::DeviceGuard g(a.device());
  cudaStream_t st = stream_of(a);
  Tensor flag = empty({1}, {DType::i32, a.device()});
  MG_CUDA_CHECK(cudaMemsetAsync(flag.raw_data(), 0, sizeof(int), st));
  const int64_t n = a.numel();
  auto oc = make_offset_calc<1>(a.sizes(), {&a.strides()});
  MG_CUDA_DISPATCH_FLOAT(a.dtype(), "has_nonfinite", [&] {
    nonfinite_kernel<scalar_t><<<blocks_for(n), kBlock, 0, st>>>(static_cast<const scalar_t*>(a.raw_data()), oc, n,
                                                                 static_cast<int*>(flag.raw_data()));
  });
  MG_CUDA_CHECK_LAUNCH("has_nonfinite");
  int host = 0;
  MG_CUDA_CHECK(cudaMemcpyAsync(&host, flag.raw_data(), sizeof(int), cudaMemcpyDeviceToHost, st));
  MG_CUDA_CHECK(cudaStreamSynchronize(st));
  return host != 0;
}

}  // namespace mg::kernels
