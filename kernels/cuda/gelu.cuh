// The tanh GELU's device math, shared by the elementwise kernels (elementwise.cu) and the FP8
// casts that take the GELU or its derivative in their passes (fp8.cu), so both round the same way.
#pragma once

#include "kernels/cuda/common.cuh"

namespace mg::kernels::cuda {

constexpr double kTanhK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kTanhC = 0.044715;

// tanh for the 16-bit types' GELU: the hardware's tanh.approx.f32 (one MUFU instruction,
// relative error below 2^-10.9), where libm's tanhf made the half kernels compute-bound (0.48-0.60
// of a copy's bandwidth on the H200, bench/results/h200_run_2026-12-02.log). The error is below bf16's
// rounding (2^-8) and about one f16 rounding (2^-11); f32 and f64 keep the libm tanh.
template <class T, class M>
__device__ __forceinline__ M gelu_tanh_of(M x) {
  if constexpr (mg::cuda::is_half_v<T>) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(static_cast<float>(x)));
    return t;
  } else {
    return m_tanh(x);
  }
}

// gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in T's math type M, for elements of
// type T (unary(GeluTanh)'s values once rounded to T).
template <class T, class M>
__device__ __forceinline__ M gelu_tanh(M x) {
  return M(0.5) * x * (M(1) + gelu_tanh_of<T>(M(kTanhK) * (x + M(kTanhC) * x * x * x)));
}

// g * gelu_tanh'(y) in T's math type M, for elements of type T.
template <class T, class M>
__device__ __forceinline__ M gelu_tanh_backward(M g, M y) {
  const M t = gelu_tanh_of<T>(M(kTanhK) * (y + M(kTanhC) * y * y * y));
  const M d = M(0.5) * (M(1) + t) + M(0.5) * y * (M(1) - t * t) * M(kTanhK) * (M(1) + M(3 * kTanhC) * y * y);
  return g * d;
}

}  // namespace mg::kernels::cuda
