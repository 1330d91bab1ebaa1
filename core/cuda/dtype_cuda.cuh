// Device-side element types and the dispatch macro that maps a DType to them, plus
// float/double conversions that every CUDA kernel in memgrad uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/tensor.h"

namespace mg::cuda {

// Arithmetic type of an element type (half types compute in float).
template <class T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<__half> {
  using type = float;
};
template <>
struct AccOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct AccOf<bool> {
  using type = float;
};
template <>
struct AccOf<uint8_t> {
  using type = int32_t;
};
template <class T>
using acc_t = typename AccOf<T>::type;

template <class T>
__device__ __forceinline__ double to_double(T v) {
  return static_cast<double>(v);
}
template <>
__device__ __forceinline__ double to_double<__half>(__half v) {
  return static_cast<double>(__half2float(v));
}
template <>
__device__ __forceinline__ double to_double<__nv_bfloat16>(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}

template <class T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<long long>(v));  // defined for negative -> u8
  else
    return static_cast<T>(v);
}
template <>
__device__ __forceinline__ bool from_double<bool>(double v) {
  return v != 0.0;
}
template <>
__device__ __forceinline__ __half from_double<__half>(double v) {
  return __double2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) {
  return __float2bfloat16(static_cast<float>(v));
}

template <class T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ bool from_float<bool>(float v) {
  return v != 0.0f;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
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

#define MG_CUDA_CASE(enum_v, T, ...) \
  case ::mg::DType::enum_v: {        \
    using scalar_t = T;              \
    __VA_ARGS__();                   \
    break;                           \
  }
#define MG_CUDA_DISPATCH_ALL(DT, NAME, ...)                           \
  switch (DT) {                                                       \
    MG_CUDA_CASE(f64, double, __VA_ARGS__)                            \
    MG_CUDA_CASE(f32, float, __VA_ARGS__)                             \
    MG_CUDA_CASE(f16, __half, __VA_ARGS__)                            \
    MG_CUDA_CASE(bf16, __nv_bfloat16, __VA_ARGS__)                    \
    MG_CUDA_CASE(i64, int64_t, __VA_ARGS__)                           \
    MG_CUDA_CASE(i32, int32_t, __VA_ARGS__)                           \
    MG_CUDA_CASE(u8, uint8_t, __VA_ARGS__)                            \
    MG_CUDA_CASE(b8, bool, __VA_ARGS__)                               \
    default:                                                          \
      MG_THROW(::mg::DTypeError, NAME, ": unsupported dtype ", (DT)); \
  }
#define MG_CUDA_DISPATCH_FLOAT(DT, NAME, ...)                                      \
  switch (DT) {                                                                    \
    MG_CUDA_CASE(f64, double, __VA_ARGS__)                                         \
    MG_CUDA_CASE(f32, float, __VA_ARGS__)                                          \
    MG_CUDA_CASE(f16, __half, __VA_ARGS__)                                         \
    MG_CUDA_CASE(bf16, __nv_bfloat16, __VA_ARGS__)                                 \
    default:                                                                       \
      MG_THROW(::mg::DTypeError, NAME, ": expected a floating dtype, got ", (DT)); \
  }
