// Shared pieces of the CUDA kernels: the stream to launch on, an N-operand offset
// calculator over collapsed dims, the math type of each element type, and warp reductions.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/dtype_cuda.cuh"
#include "core/device_runtime.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "core/tensor.h"

namespace mg::kernels::cuda {

using mg::cuda::AlignedVec;
using mg::cuda::from_float;
using mg::cuda::kMaxDims;
using mg::cuda::kVec16;
using mg::cuda::to_float;

inline cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(mg::cuda::Stream::current(t.device().index).handle());
}

constexpr int kBlock = 256;

// The device's SM count (asked once per device: kernels that size their grid to the GPU).
inline int sm_count(const Device& d) {
  static std::atomic<int> counts[64] = {};
  const int i = d.index;
  if (i < 0 || i >= 64) return 132;
  int c = counts[i].load(std::memory_order_relaxed);
  if (c == 0) {
    if (cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, i) != cudaSuccess || c <= 0) c = 132;
    counts[i].store(c, std::memory_order_relaxed);
  }
  return c;
}

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed.
inline unsigned blocks_for(int64_t n, int block = kBlock) {
  int64_t g = (n + block - 1) / block;
  const int64_t cap = 132LL * 32;  // 32 blocks per SM of an H200 is plenty for grid-stride loops
  return static_cast<unsigned>(g < 1 ? 1 : (g > cap ? cap : g));
}

// Programmatic dependent launch (sm_90 and later). A kernel launched by launch_dependent() may be
// scheduled before the kernel ahead of it in the stream has finished: once every block of that
// kernel has exited or called allow_dependents(). It must call wait_for_previous() before it
// reads anything the kernel ahead wrote (or writes what that kernel reads): the wait returns when
// that kernel has completed and its writes are visible. Between two short dependent kernels (a
// reduction and its finalize) this hides the 1-3 us the device otherwise idles between them. On
// older devices, and for a kernel launched plainly, both calls do nothing.
__device__ __forceinline__ void wait_for_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// Like kernel<<<grid, block, smem, st>>>(args...): a failed launch is left for MG_CUDA_CHECK_LAUNCH.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Offsets of N operands for a linear index over a common shape, dims collapsed on the host
// (size-1 dims dropped, dims contiguous in every operand merged). Dim 0 is innermost.
template <int N>
struct OffsetCalc {
  int ndim = 0;
  bool small = false;  // linear indexes < 2^31: mg::cuda::FastDiv instead of int64 division
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims][N];
  mg::cuda::FastDiv divs[kMaxDims];
  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) off[i] = 0;
    if (small) {
      uint32_t l = static_cast<uint32_t>(linear);
      for (int d = 0; d < ndim; ++d) {
        const uint32_t q = divs[d].div(l);
        const int64_t idx = l - q * divs[d].d;
        l = q;
#pragma unroll
        for (int i = 0; i < N; ++i) off[i] += idx * strides[d][i];
      }
      return;
    }
    for (int d = 0; d < ndim; ++d) {
      const int64_t q = linear / sizes[d];
      const int64_t idx = linear - q * sizes[d];
      linear = q;
#pragma unroll
      for (int i = 0; i < N; ++i) off[i] += idx * strides[d][i];
    }
  }
};

// Builds the calculator for `shape` and each operand's strides (same rank as shape).
template <int N>
OffsetCalc<N> make_offset_calc(const Shape& shape, const std::array<const Shape*, N>& strides) {
  OffsetCalc<N> oc;
  int nd = 0;
  int64_t numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    numel *= shape[d];
    if (shape[d] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int i = 0; i < N; ++i)
        if ((*strides[i])[d] != oc.strides[nd - 1][i] * oc.sizes[nd - 1]) merge = false;
      if (merge) {
        oc.sizes[nd - 1] *= shape[d];
        continue;
      }
    }
    MG_CHECK(nd < kMaxDims, ShapeError, "CUDA kernels: at most ", kMaxDims, " non-mergeable dims, got shape ",
             shape_str(shape));
    oc.sizes[nd] = shape[d];
    for (int i = 0; i < N; ++i) oc.strides[nd][i] = (*strides[i])[d];
    ++nd;
  }
  oc.ndim = nd;
  oc.small = numel < (int64_t{1} << 31);
  if (oc.small)
    for (int d = 0; d < nd; ++d) oc.divs[d] = mg::cuda::FastDiv(static_cast<uint32_t>(oc.sizes[d]));
  return oc;
}

// ---- element types and their math types ----
// Math type: f32 for f32/f16/bf16, f64 for f64, the integer itself (u8/bool widen to int).
template <class T>
using math_t =
    std::conditional_t<mg::cuda::is_half_v<T>, float,
                       std::conditional_t<std::is_same_v<T, uint8_t> || std::is_same_v<T, bool>, int32_t, T>>;

template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || mg::cuda::is_half_v<T>;

template <class T>
__device__ __forceinline__ math_t<T> load_m(T v) {
  if constexpr (mg::cuda::is_half_v<T>)
    return mg::cuda::to_float(v);
  else
    return static_cast<math_t<T>>(v);
}
template <class T, class M>
__device__ __forceinline__ T store_m(M v) {
  if constexpr (mg::cuda::is_half_v<T>)
    return mg::cuda::from_float<T>(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != M(0);
  else
    return static_cast<T>(v);
}
// kV consecutive elements (one aligned vector load) as floats, and back: the f32 math of the
// f32/f16/bf16 kernels that move 16 (or 8) bytes a thread.
template <int kV, class T>
__device__ __forceinline__ void load_v(const T* p, float (&out)[kV]) {
  const AlignedVec<T, kV> v = *reinterpret_cast<const AlignedVec<T, kV>*>(p);
#pragma unroll
  for (int k = 0; k < kV; ++k) out[k] = static_cast<float>(load_m(v.v[k]));
}
template <int kV, class T>
__device__ __forceinline__ void store_v(T* p, const float (&in)[kV]) {
  AlignedVec<T, kV> v;
#pragma unroll
  for (int k = 0; k < kV; ++k) v.v[k] = store_m<T>(in[k]);
  *reinterpret_cast<AlignedVec<T, kV>*>(p) = v;
}

// Float/double overloads so templates on the math type pick the right precision.
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }

// exp(x - m) for a row's per-element passes (softmax, cross-entropy), m fixed over many x. For
// f16/bf16 data these kernels are bound by instruction issue as much as by traffic, so it is the
// SFU's ex2 of (x - m) log2(e) with results under 2^-126 flushed to zero (ex2.approx.ftz):
// __expf compiles to ex2.approx.f32, whose denormal fix-up is three more instructions an
// exponential. A flushed term adds nothing to a sum whose largest term is 1, f16 cannot hold a
// value that small, and in bf16 it is 0 give or take 2^-126. x - m rounds once, to at most
// 2^-24 |x - m| (exact for x near a row maximum m, by Sterbenz), as __expf(x - m) had it.
// Folding m log2(e) into an FFMA would save one more instruction but round m log2(e): an
// absolute error of |m| 2^-24 that log_softmax's small outputs (x - m - log s) would carry, and
// an overflow for bf16 logits past 2^127 / log2(e). -inf gives 0, inf - inf NaN, as exp(x - m)
// does. f32 and f64 data keep libm's exp of x - m.
constexpr float kLog2e = 1.4426950408889634f;
template <class T>
struct RowExp {
  using A = math_t<T>;
  A m;
  __device__ __forceinline__ explicit RowExp(A m_) : m(m_) {}
  __device__ __forceinline__ A operator()(A x) const {
    if constexpr (mg::cuda::is_half_v<T>)
      return ptx::ex2((x - m) * kLog2e);
    else
      return m_exp(x - m);
  }
};

__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
template <class M>
__device__ __forceinline__ bool m_isnan(M v) {
  if constexpr (std::is_floating_point_v<M>)
    return isnan(v);
  else
    return false;
}

// ---- reductions within a warp ----
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// ---- a warp's row held in registers (softmax's and layer norm's short-row paths) ----
// Vectors a lane keeps: up to 32 values (f32 and 16-bit rows to 1024 elements, f64 to 512).
template <class T>
constexpr int kWarpRowVecs = 32 / kVec16<T> < 8 ? 32 / kVec16<T> : 8;

// Lane `lane`'s share of a row of nv V-element vectors at x: vector lane + 32 j into v[j], as
// loaded. The row is read from memory once; 16-bit rows stay packed until used (converted to
// f32 in each pass): half the registers of f32 values, so an SM holds more warps and more bytes
// in flight (f16/bf16 rows converted at the load ran at 0.76-0.83 of a copy, f32 rows at 0.90-0.98).
template <int V, int NV, class T>
__device__ __forceinline__ void load_warp_row(const T* x, int nv, int lane, AlignedVec<T, V> (&v)[NV]) {
  const AlignedVec<T, V>* xv = reinterpret_cast<const AlignedVec<T, V>*>(x);
#pragma unroll
  for (int j = 0; j < NV; ++j)
    if (lane + 32 * j < nv) v[j] = xv[lane + 32 * j];
}

// Element k of a vector held packed (load_warp_row) as M, converted where it is used. A bf16
// pair is read from its 32-bit word (a shift or a mask), in volatile asm so the compiler redoes it
// at each use instead of keeping an f32 copy of every element across a kernel's passes: the
// registers the packed row saves (48 instead of 32 for softmax over 1024 in bf16).
template <int V, class T>
__device__ __forceinline__ math_t<T> unpack_m(const AlignedVec<T, V>& v, int k) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(v.v)[k / 2];
    uint32_t r;
    if (k % 2)
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(r) : "r"(w));
    else
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(r) : "r"(w));
    return __uint_as_float(r);
  } else {
    return load_m(v.v[k]);
  }
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
// gets the result. `shm` holds 32 values.
template <class A>
__device__ __forceinline__ A block_sum(A v, A* shm) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // shm may still be read from a previous call
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  v = lane < nw ? shm[lane] : A(0);
  return warp_sum(v);
}
template <class A>
__device__ __forceinline__ A block_max(A v, A* shm, A lowest) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  v = lane < nw ? shm[lane] : lowest;
  return warp_max(v);
}

// The longest row in bytes a block-per-row kernel can hold in shared memory on a device
// (softmax_smem_rows_kernel, ce_fused_smem_kernel): the shared memory a block may opt in to (227
// KiB on sm_90) less 1 KiB for the kernels' static reduction scratch. Read once per process for
// every device, not at each launch.
inline size_t smem_row_limit(int device) {
  static const std::vector<size_t> limits = [] {
    std::vector<size_t> v(mg::cuda::device_count());
    for (size_t d = 0; d < v.size(); ++d) {
      int bytes = 0;
      MG_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, static_cast<int>(d)));
      v[d] = bytes > 1024 ? static_cast<size_t>(bytes) - 1024 : 0;
    }
    return v;
  }();
  return limits.at(device);
}

// Blocks above 48 KiB of dynamic shared memory must opt in (per kernel, per device).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Runs f(tag) with tag's type the unsigned integer of t's element size: for the kernels that
// only move bytes (gather, scatter, where).
template <class F>
void by_size(DType t, const char* op, F f) {
  const size_t bytes = dtype_size(t);
  if (bytes == 1) return f(uint8_t{});
  if (bytes == 2) return f(uint16_t{});
  if (bytes == 4) return f(uint32_t{});
  if (bytes == 8) return f(uint64_t{});
  MG_THROW(DTypeError, op, ": unsupported dtype ", t);
}

#define MG_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

}  // namespace mg::kernels::cuda
