// FP8 kernels: quantize with the hardware's conversion (cvt.rn.satfinite through cuda_fp8.h,
// what the FP8 GEMM's producers use), dequantize, and amax with the scale rule on the device.
// tests/kernels/cuda/fp8_parity_test.cc holds them to the CPU reference (cpu/fp8.cc) bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/fp8_math.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers of kernels/cuda/common.cuh
namespace {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__global__ void quantize_kernel(const T* x, const float* scale, __nv_fp8_interpretation_t kind, uint8_t* q, int64_t n) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    q[i] = __nv_cvt_float_to_fp8(to_f(x[i]) * s, __NV_SATFINITE, kind);
}

template <class T>
__device__ __forceinline__ void store(T* p, float v);
template <>
__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}
template <>
__device__ __forceinline__ void store(__half* p, float v) {
  *p = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

template <class T>
__global__ void dequantize_kernel(const uint8_t* q, const float* scale, __nv_fp8_interpretation_t kind, T* out,
                                  int64_t n) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // fp8 -> f16 is exact for both formats (f16 has more exponent and mantissa than each).
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], kind)));
    store(out + i, __fdiv_rn(v, s));
  }
}

// max |x| as the bits of a non-negative float (their order is the floats' order), a NaN as
// 0x7fc00000, larger than every finite and infinite magnitude's bits.
template <class T>
__global__ void amax_kernel(const T* x, int64_t n, unsigned* amax_bits) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = fabsf(to_f(x[i]));
    const unsigned b = isnan(a) ? 0x7fc00000u : __float_as_uint(a);
    m = b > m ? b : m;
  }
  for (int off = 16; off > 0; off /= 2) {
    const unsigned o = __shfl_down_sync(0xffffffffu, m, off);
    m = o > m ? o : m;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, m);
}

__global__ void scale_kernel(unsigned* amax_bits, fp8_math::Format f, int margin, float* scale, float* scale_inv) {
  const float amax = __uint_as_float(*amax_bits);
  const float s = fp8_math::scale_for(amax, f, margin);
  *scale = s;
  if (scale_inv) *scale_inv = __frcp_rn(s);
}

// One 32 x 32 tile of x [rows, cols] through shared memory: its codes written row by row into q
// and column by column into qt (qt [cols, rows]), each warp writing 32 consecutive bytes.
constexpr int kTile = 32, kTileRows = 8;
template <class T>
__global__ void quantize_transpose_kernel(const T* x, const float* scale, __nv_fp8_interpretation_t kind, uint8_t* q,
                                          uint8_t* qt, int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const float s = *scale;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = to_f(x[r * cols + c]) * s;
      tile[i][threadIdx.x] = v;
      if (q) q[r * cols + c] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind);
    }
  }
  if (!qt) return;
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) qt[c * rows + r] = __nv_cvt_float_to_fp8(tile[threadIdx.x][i], __NV_SATFINITE, kind);
  }
}

__nv_fp8_interpretation_t kind_of(Fp8Format f) { return f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2; }

template <class F>
void dispatch_half_or_f32(DType d, F f) {
  if (d == DType::f32)
    f(float{});
  else if (d == DType::f16)
    f(__half{});
  else
    f(__nv_bfloat16{});
}

}  // namespace

template <>
void CudaBackend::fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  dispatch_half_or_f32(x.dtype(), [&](auto t) {
    using T = decltype(t);
    quantize_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(static_cast<const T*>(x.raw_data()),
                                                         data_as<const float>(scale), kind_of(format),
                                                         static_cast<uint8_t*>(out.raw_data()), n);
  });
  MG_CUDA_CHECK_LAUNCH("fp8_quantize");
}

template <>
void CudaBackend::fp8_dequantize(const Tensor& q, const Tensor& scale, Fp8Format format, const Tensor& out) {
  const int64_t n = q.numel();
  if (n == 0) return;
  mg::cuda::DeviceGuard guard(q.device());
  cudaStream_t st = stream_of(q);
  dispatch_half_or_f32(out.dtype(), [&](auto t) {
    using T = decltype(t);
    dequantize_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(static_cast<const uint8_t*>(q.raw_data()),
                                                           data_as<const float>(scale), kind_of(format),
                                                           static_cast<T*>(out.raw_data()), n);
  });
  MG_CUDA_CHECK_LAUNCH("fp8_dequantize");
}

template <>
void CudaBackend::fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Fp8Format format, const Tensor& out,
                                         const Tensor& out_t) {
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  MG_CHECK(grid.y <= 65535, ShapeError, "fp8_quantize_transpose: ", rows, " rows is more than this kernel's ",
           65535 * kTile);
  auto* q = out.defined() ? static_cast<uint8_t*>(out.raw_data()) : nullptr;
  auto* qt = out_t.defined() ? static_cast<uint8_t*>(out_t.raw_data()) : nullptr;
  dispatch_half_or_f32(x.dtype(), [&](auto t) {
    using T = decltype(t);
    quantize_transpose_kernel<T><<<grid, dim3(kTile, kTileRows), 0, st>>>(
        static_cast<const T*>(x.raw_data()), data_as<const float>(scale), kind_of(format), q, qt, rows, cols);
  });
  MG_CUDA_CHECK_LAUNCH("fp8_quantize_transpose");
}

template <>
void CudaBackend::fp8_amax_scale(const Tensor& x, Fp8Format format, int margin, const Tensor& amax, const Tensor& scale,
                                 const Tensor& scale_inv) {
  mg::cuda::DeviceGuard guard(x.device());
  cudaStream_t st = stream_of(x);
  auto* bits = static_cast<unsigned*>(amax.raw_data());  // the f32 result, built as its bits
  MG_CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof(unsigned), st));
  const int64_t n = x.numel();
  if (n > 0)
    dispatch_half_or_f32(x.dtype(), [&](auto t) {
      using T = decltype(t);
      amax_kernel<T><<<blocks_for(n), kBlock, 0, st>>>(static_cast<const T*>(x.raw_data()), n, bits);
    });
  scale_kernel<<<1, 1, 0, st>>>(bits, format == Fp8Format::E4M3 ? fp8_math::kE4M3 : fp8_math::kE5M2, margin,
                                data_as<float>(scale), scale_inv.defined() ? data_as<float>(scale_inv) : nullptr);
  MG_CUDA_CHECK_LAUNCH("fp8_current_scale");
}

}  // namespace mg::kernels
