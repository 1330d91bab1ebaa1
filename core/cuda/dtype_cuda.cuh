// Device-side element types and the dispatch macros that map a DType to them, plus
// float/double conversions that every CUDA kernel in memgrad uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/tensor.h"

namespace mg::cuda {

// The element types device code sees: HostTypes (core/dtype.h) with CUDA's 16-bit floats.
using DeviceTypes = ElementTypes<__half, __nv_bfloat16>;
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// Element <-> float/double conversions: the 16-bit floats through CUDA's intrinsics, bool as
// v != 0, integers from double through long long (defined for negative -> u8).
template <class T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return static_cast<float>(v);
}
template <class T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (is_half_v<T>)
    return static_cast<double>(to_float(v));
  else
    return static_cast<double>(v);
}
// float or double W -> T: bool is "nonzero", __half rounds once from W, __nv_bfloat16 goes
// through float; a double reaches an integer type as the CPU's casts do (through long long,
// NaN -> 0). from_float keeps the plain conversion for integers (the hot elementwise path).
template <class T, class W>
__device__ __forceinline__ T from_wide(W v) {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, double>);
  if constexpr (std::is_same_v<T, bool>)
    return v != W(0);
  else if constexpr (std::is_same_v<T, __half> && std::is_same_v<W, float>)
    return __float2half(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __double2half(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(static_cast<float>(v));
  else if constexpr (std::is_integral_v<T> && std::is_same_v<W, double>)
    // mg::float_to_int64 (core/dtype.h): the conversion instruction saturates out-of-range
    // values, but turns NaN into INT64_MIN, so NaN is mapped to 0 here as on the CPU.
    return static_cast<T>(v != v ? 0LL : static_cast<long long>(v));
  else
    return static_cast<T>(v);
}
template <class T>
__device__ __forceinline__ T from_float(float v) {
  return from_wide<T>(v);
}
template <class T>
__device__ __forceinline__ T from_double(double v) {
  return from_wide<T>(v);
}

// Elements of T in one 16-byte access (1 for types of 16 bytes or more), and V elements moved
// as one aligned vector load/store: what every vectorized kernel (copies, casts, elementwise,
// reductions, norms, losses) reads and writes through.
template <class T>
inline constexpr int kVec16 = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
template <class T, int V>
struct alignas(sizeof(T) * V) AlignedVec {
  T v[V];
};

// Division by a divisor fixed at launch, as a multiply-high, an add and a shift
// (Granlund-Montgomery), exact for dividends < 2^31. A 64-bit division is a software routine
// of ~70 instructions on the GPU and the strided kernels divide once per dim per element, so
// with int64 math they ran at 15-30% of copy bandwidth; indexes below 2^31 take this path.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    return (__umulhi(n, m) + n) >> s;
#else
    return static_cast<uint32_t>(((static_cast<uint64_t>(n) * m >> 32) + n) >> s);
#endif
  }
};

// Up to kMaxDims strided dims passed by value to kernels.
constexpr int kMaxDims = 10;
struct StridedIndexer {
  int ndim = 0;
  bool small = false;  // every linear index < 2^31: FastDiv instead of int64 division
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
  FastDiv divs[kMaxDims];
  int64_t offset = 0;
  __host__ __device__ __forceinline__ int64_t operator()(int64_t linear) const {
    int64_t off = offset;
    if (small) {
      uint32_t l = static_cast<uint32_t>(linear);
      for (int d = ndim - 1; d >= 0; --d) {
        const uint32_t q = divs[d].div(l);
        off += static_cast<int64_t>(l - q * divs[d].d) * strides[d];
        l = q;
      }
      return off;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};
// Indexer of `t` seen through `shape` (t already broadcast to it); offset excludes the
// tensor's own offset (the kernel gets raw_data()).
// Size-1 dims are dropped and dims contiguous with their inner neighbour merged (each tensor's
// own layout: the linear index over the logical shape maps the same), so e.g. the source of a
// [B, T, H, D] -> [B, H, T, D] copy walks 3 dims; the FastDiv tables are filled for < 2^31.
StridedIndexer make_indexer(const Tensor& t);

inline unsigned grid_for(int64_t n, int block = 256) {
  int64_t g = (n + block - 1) / block;
  return static_cast<unsigned>(g > 65535 * 64 ? 65535 * 64 : g);
}

}  // namespace mg::cuda

// MG_DISPATCH_ALL/FLOAT (core/dtype.h) with scalar_t the device element type.
#define MG_CUDA_DISPATCH_ALL(DT, NAME, ...) \
  MG_DISPATCH_TYPES(::mg::cuda::DeviceTypes, ::mg::AllDTypes, DT, NAME, ": unsupported dtype ", __VA_ARGS__)
#define MG_CUDA_DISPATCH_FLOAT(DT, NAME, ...)                                                                  \
  MG_DISPATCH_TYPES(::mg::cuda::DeviceTypes, ::mg::FloatDTypes, DT, NAME, ": expected a floating dtype, got ", \
                    __VA_ARGS__)
