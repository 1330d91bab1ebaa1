// Matrix products on CUDA through cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx), and the
// linear layer's fused cuBLASLt forms (kernels/cuda/cublaslt.cc).
// cuBLAS is column-major; a row-major C = A @ B is computed as C^T = B^T @ A^T, and any
// operand whose rows or columns are unit-stride maps without a copy (only other layouts,
// e.g. expanded or stepped slices, are made contiguous). f32 computes in exact f32
// (CUBLAS_COMPUTE_32F, default math: no TF32), f16/bf16 take f32 accumulation, f64 f64.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "core/cuda/check.h"
#include "core/device_runtime.h"
#include "core/env.h"
#include "kernels/cuda/cublas.h"
#include "kernels/cuda/cuda_backend.h"

namespace mg::kernels {
using namespace cuda;  // NOLINT: the launch helpers and math of kernels/cuda/common.cuh

namespace {

// A logical matrix: element (i, j) at p[i * rs + j * cs] (in elements).
struct Mat {
  void* p;
  int64_t r, c, rs, cs;
  Mat t() const { return {p, c, r, cs, rs}; }
};

Mat mat_of(const Tensor& t, bool trans, int64_t d0 = 0) {
  Mat m{t.raw_data(), t.size(d0), t.size(d0 + 1), t.stride(d0), t.stride(d0 + 1)};
  return trans ? m.t() : m;
}

// How cuBLAS sees `m`: op(stored column-major matrix with leading dim ld) == m.
bool blas_view(const Mat& m, cublasOperation_t* op, int64_t* ld) {
  const int64_t r1 = std::max<int64_t>(m.r, 1), c1 = std::max<int64_t>(m.c, 1);
  if ((m.r <= 1 || m.rs == 1) && (m.c <= 1 || m.cs >= r1)) {
    *op = CUBLAS_OP_N;
    *ld = m.c <= 1 ? r1 : m.cs;
    return true;
  }
  if ((m.c <= 1 || m.cs == 1) && (m.r <= 1 || m.rs >= c1)) {
    *op = CUBLAS_OP_T;
    *ld = m.r <= 1 ? c1 : m.rs;
    return true;
  }
  return false;
}

struct BlasType {
  cudaDataType_t data;
  cublasComputeType_t compute;
  bool f64;
};

BlasType blas_type(DType t, const char* op) {
  switch (t) {
    case DType::f64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, true};
    case DType::f32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, false};
    case DType::f16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, false};
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false};
    default:
      MG_THROW(DTypeError, op, ": cuBLAS needs f64, f32, f16 or bf16, got ", t);
  }
}

int to_int(int64_t v, const char* op, const char* what) {
  MG_CHECK(v <= INT_MAX, ShapeError, op, ": ", what, " ", v, " exceeds cuBLAS's 32-bit limit");
  return static_cast<int>(v);
}

// Scalars in the compute type, passed by host pointer.
struct Scal {
  float f;
  double d;
  const void* ptr(bool f64) const { return f64 ? static_cast<const void*>(&d) : static_cast<const void*>(&f); }
};
Scal scal(double v) { return {static_cast<float>(v), v}; }

// Column-major C (n x m, N view with ldc) = alpha * A (n x k) @ B (k x m) + beta * C, for
// `batch` matrices spaced by the given element strides. A and B hold dt; C holds c_dt (dt, or
// f32 for half inputs: cuBLAS then writes the f32 accumulator unrounded).
void gemm_colmajor(const Mat& C, int64_t ldc, const Mat& A, const Mat& B, int64_t k, DType dt, double alpha,
                   double beta, int64_t batch, int64_t sa, int64_t sb, int64_t sc, const char* op, int device,
                   DType c_dt) {
  cublasOperation_t opa, opb;
  int64_t lda, ldb;
  MG_CHECK(blas_view(A, &opa, &lda) && blas_view(B, &opb, &ldb), ValueError, op, ": internal: operand layout");
  const BlasType bt = blas_type(dt, op);
  const cudaDataType_t c_type = blas_type(c_dt, op).data;
  const Scal al = scal(alpha), be = scal(beta);
  cublasHandle_t h = cublas_handle(device);
  const int n = to_int(C.r, op, "rows"), m = to_int(C.c, op, "columns"), kk = to_int(k, op, "inner dim");
  const int ila = to_int(lda, op, "leading dim"), ilb = to_int(ldb, op, "leading dim"),
            ilc = to_int(ldc, op, "leading dim");
  if (batch == 1) {
    MG_CUBLAS_CHECK(cublasGemmEx(h, opa, opb, n, m, kk, al.ptr(bt.f64), A.p, bt.data, ila, B.p, bt.data, ilb,
                                 be.ptr(bt.f64), C.p, c_type, ilc, bt.compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  MG_CHECK(c_type == bt.data, DTypeError, op, ": internal: a batched GEMM writes its inputs' dtype");
  const size_t es = dtype_size(dt);
  // Older cuBLAS builds limit the batch count to the grid's y dimension: chunk it.
  for (int64_t b0 = 0; b0 < batch; b0 += 65535) {
    const int nb = static_cast<int>(std::min<int64_t>(65535, batch - b0));
    const char* pa = static_cast<const char*>(A.p) + b0 * sa * es;
    const char* pb = static_cast<const char*>(B.p) + b0 * sb * es;
    char* pc = static_cast<char*>(C.p) + b0 * sc * es;
    MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opa, opb, n, m, kk, al.ptr(bt.f64), pa, bt.data, ila, sa, pb, bt.data,
                                               ilb, sb, be.ptr(bt.f64), pc, bt.data, ilc, sc, nb, bt.compute,
                                               CUBLAS_GEMM_DEFAULT));
  }
}

// `t` if its (possibly transposed) matrix at dims (d0, d0+1) maps to cuBLAS, else a contiguous copy.
Tensor blas_ready(const Tensor& t, bool trans, int64_t d0) {
  cublasOperation_t op;
  int64_t ld;
  if (blas_view(mat_of(t, trans, d0), &op, &ld)) return t;
  return raw::contiguous(t);
}

// out *= beta (k == 0: the product is empty).
void scale_out(const Tensor& out, double beta) {
  if (beta == 0.0) {
    raw::fill_(out, 0.0);
    return;
  }
  Tensor s = raw::expand(full({}, beta, {out.dtype(), out.device()}), out.sizes());
  backend(out.device(), "gemm").binary(Binary::Mul, out, s, out);
}

}  // namespace

template <>
void CudaBackend::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha,
                       double beta) {
  const char* op = "gemm";
  mg::cuda::DeviceGuard g(out.device());
  const int64_t n = out.size(0), m = out.size(1), k = trans_a ? a.size(0) : a.size(1);
  if (n == 0 || m == 0) return;
  if (k == 0) return scale_out(out, beta);
  Tensor A = blas_ready(a, trans_a, 0), B = blas_ready(b, trans_b, 0);
  Mat am = mat_of(A, trans_a), bm = mat_of(B, trans_b), cm = mat_of(out, false);
  cublasOperation_t opc;
  int64_t ldc;
  // cuBLAS must not write into an operand: an aliased output goes through a temporary.
  const bool aliased = out.storage() == A.storage() || out.storage() == B.storage();
  if (!aliased && blas_view(cm, &opc, &ldc)) {
    if (opc == CUBLAS_OP_N) {
      gemm_colmajor(cm, ldc, am, bm, k, a.dtype(), alpha, beta, 1, 0, 0, 0, op, out.device().index, out.dtype());
    } else {
      // Row-major C: C^T (column-major) = B^T @ A^T.
      gemm_colmajor(cm.t(), ldc, bm.t(), am.t(), k, a.dtype(), alpha, beta, 1, 0, 0, 0, op, out.device().index,
                    out.dtype());
    }
    return;
  }
  Tensor tmp = beta == 0.0 ? empty(out.sizes(), {out.dtype(), out.device()}) : raw::clone(out);
  gemm(A, trans_a, B, trans_b, tmp, alpha, beta);
  raw::copy_(out, tmp);
}

template <>
void CudaBackend::bmm(const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* op = "bmm";
  mg::cuda::DeviceGuard g(out.device());
  const int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  if (batch == 0 || n == 0 || m == 0) return;
  if (k == 0) return raw::fill_(out, 0.0);
  MG_CHECK(out.is_contiguous(), ValueError, op, ": output must be contiguous");
  Tensor A = blas_ready(a, false, 1), B = blas_ready(b, false, 1);
  Mat am = mat_of(A, false, 1), bm = mat_of(B, false, 1);
  Mat cm{out.raw_data(), n, m, m, 1};
  // Row-major C: C^T (column-major, ld m) = B^T @ A^T, batch by batch.
  gemm_colmajor(cm.t(), std::max<int64_t>(m, 1), bm.t(), am.t(), k, out.dtype(), 1.0, 0.0, batch, B.stride(0),
                A.stride(0), n * m, op, out.device().index, out.dtype());
}

template <>
void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  mg::cuda::DeviceGuard g(out.device());
  if (bias.defined() && cuda::lt_linear_bias(x, w, bias, out)) return;  // bias inside the GEMM
  if (bias.defined()) {
    // Bias into every row, then accumulate x @ w^T on top (one rounding of the sum).
    raw::copy_(out, bias);
    gemm(x, false, w, true, out, 1.0, 1.0);
  } else {
    gemm(x, false, w, true, out, 1.0, 0.0);
  }
}

// The bias gradient is the column sum of g by memgrad's vectorized column reduction, after
// the plain weight-gradient GEMM. cuBLASLt's BGRADB epilogue runs the same sum as a kernel of
// its own (globalKernelBgradAB_v2) at about half the copy's bandwidth: 0.65 ms of a GPT-2 124M
// bf16 step at B=8, 48 launches (bench/results/h200_run_2026-12-03.log).
// MG_BIAS_GRAD=epilogue takes the epilogue instead (A/B runs).
namespace {
bool bias_grad_epilogue() {
  static const bool on = env::choice("MG_BIAS_GRAD", {"reduce", "epilogue"}) == "epilogue";
  return on;
}
}  // namespace

template <>
bool CudaBackend::fused_linear_weight_grads(const Tensor& g, const Tensor& x, const Tensor& gw, const Tensor& gb) {
  mg::cuda::DeviceGuard guard(gw.device());
  if (!gb.defined() || bias_grad_epilogue()) return cuda::lt_weight_grads(g, x, gw, gb);
  if (!cuda::lt_weight_grads(g, x, gw, Tensor())) return false;
  sum(g, raw::view(gb, {1, gb.numel()}));
  return true;
}

template <>
bool CudaBackend::fused_linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                                    const Tensor& pre) {
  mg::cuda::DeviceGuard guard(out.device());
  return cuda::lt_linear_gelu(x, w, bias, out, pre);
}

template <>
bool CudaBackend::fused_matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre, const Tensor& g_pre) {
  mg::cuda::DeviceGuard guard(g_pre.device());
  return cuda::lt_matmul_gelu_backward(g, w, pre, g_pre);
}

template <>
bool CudaBackend::fp8_gemm(const Tensor& a, Fp8Format fa, const Tensor& a_inv, const Tensor& b, Fp8Format fb,
                           const Tensor& b_inv, const Tensor& bias, const Tensor& out, bool fast_accum) {
  mg::cuda::DeviceGuard guard(out.device());
  return cuda::lt_fp8_gemm(a, fa, a_inv, b, fb, b_inv, bias, out, fast_accum);
}

}  // namespace mg::kernels
