// cuBLAS access for the CUDA kernels: the calling thread's handle for a device, bound to
// that device's current stream with a workspace from memgrad's caching allocator.
#pragma once

#include <cublas_v2.h>

#include <cstddef>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/types.h"

// Checks a cuBLAS call; a failure raises mg::CudaError naming the call and the status.
#define MG_CUBLAS_CHECK(call)                                                                                         \
  do {                                                                                                                \
    cublasStatus_t mg_st_ = (call);                                                                                   \
    if (mg_st_ != CUBLAS_STATUS_SUCCESS)                                                                              \
      MG_THROW(::mg::CudaError, #call, " failed: ", cublasGetStatusName(mg_st_), " (", cublasGetStatusString(mg_st_), \
               ") at ", __FILE__, ":", __LINE__);                                                                     \
  } while (0)

namespace mg::kernels::cuda {

// The handle of this thread for `device` (created on first use), with its stream set to
// mg::cuda::Stream::current(device) and a workspace for that stream. Call the device's
// DeviceGuard first. The workspace size is MG_CUBLAS_WORKSPACE_MB (default 32 MiB, what
// cuBLAS itself uses on Hopper); it is allocated once per (thread, device, stream).
cublasHandle_t cublas_handle(int device);
// That handle's workspace for the device's current stream (binding the handle first), for the
// cuBLASLt calls that take one explicitly; *bytes gets its size (0: none).
void* cublas_workspace(int device, size_t* bytes);

// cuBLASLt GEMMs with fused epilogues (kernels/cuda/cublaslt.cc), on contiguous row-major
// f32/f16/bf16 operands; false when cuBLASLt cannot take them (or MG_CUBLASLT=0), and the
// caller computes the same with cublasGemmEx and separate kernels.
// out[rows, n] = x[rows, k] @ w[n, k]^T + bias[n] in one kernel (the BIAS epilogue).
bool lt_linear_bias(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);
// gw[n, k] = g[rows, n]^T @ x[rows, k] and gb[n] = g summed over rows, in one kernel (BGRADB).
bool lt_weight_grads(const Tensor& g, const Tensor& x, const Tensor& gw, const Tensor& gb);
// pre[rows, n] = x[rows, k] @ w[n, k]^T + bias[n] and out = gelu_tanh(pre), one kernel
// (GELU_AUX_BIAS: pre is the epilogue's auxiliary output, kept for backward).
bool lt_linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, const Tensor& pre);
// g_pre[rows, n] = (g[rows, k] @ w[k, n]) * gelu_tanh'(pre), one kernel (DGELU, pre as the
// auxiliary input). f16/bf16 only, like lt_linear_gelu.
bool lt_matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre, const Tensor& g_pre);
// Backend::fp8_gemm's plain GEMM through cuBLASLt: out[M, N] = a[M, K] @ b[N, K]^T * a_inv * b_inv
// (+ bias) for u8 codes, on a device with FP8 tensor cores (sm_89 on); false otherwise.
// `fast_accum`: CUBLASLT_MATMUL_DESC_FAST_ACCUM (kernels/types.h, Fp8Accum).
bool lt_fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb, const Tensor& b_inv,
                 const Tensor& bias, const Tensor& out, bool fast_accum);

}  // namespace mg::kernels::cuda
