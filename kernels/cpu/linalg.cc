// Matrix products on the CPU through Eigen's GEMM on Maps of the tensors' memory.
// Row-major and column-major (transposed) operands map without copying; anything else
// (expanded or sliced with a step) is made contiguous first. f16/bf16 go through f32.
#include <Eigen/Core>

#include "kernels/cpu/cpu_backend.h"

namespace mg::kernels {
namespace {

// A logical matrix (after any transpose): element (i, j) is p[i * rs + j * cs].
struct Mat {
  void* p;
  int64_t r, c, rs, cs;
  Mat t() const { return {p, c, r, cs, rs}; }
};

enum class Layout { Row, Col, None };

// The layout Eigen can map, and its leading dimension.
Layout layout(const Mat& m, int64_t* ld) {
  if ((m.c <= 1 || m.cs == 1) && (m.r <= 1 || m.rs >= std::max<int64_t>(m.c, 1))) {
    *ld = m.r <= 1 ? std::max<int64_t>(m.c, 1) : m.rs;
    return Layout::Row;
  }
  if ((m.r <= 1 || m.rs == 1) && (m.c <= 1 || m.cs >= std::max<int64_t>(m.r, 1))) {
    *ld = m.c <= 1 ? std::max<int64_t>(m.r, 1) : m.cs;
    return Layout::Col;
  }
  return Layout::None;
}

Mat mat_of(const Tensor& t, bool trans) {
  Mat m{t.raw_data(), t.size(0), t.size(1), t.stride(0), t.stride(1)};
  return trans ? m.t() : m;
}

template <class T, int Order>
using CMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0, Eigen::OuterStride<>>;
template <class T>
using RowMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;

template <class T, class MA, class MB>
void product(RowMap<T>& C, const MA& A, const MB& B, T alpha, T beta) {
  if (beta == T(0)) {
    if (alpha == T(1))
      C.noalias() = A * B;
    else
      C.noalias() = alpha * A * B;
  } else {
    if (beta != T(1)) C *= beta;
    if (alpha == T(1))
      C.noalias() += A * B;
    else
      C.noalias() += alpha * A * B;
  }
}

// C (row-major, ldc) = alpha * A @ B + beta * C. A and B must have a Row or Col layout.
template <class T>
void gemm_mapped(const Mat& A, const Mat& B, T* c, int64_t ldc, T alpha, T beta) {
  const int64_t n = A.r, k = A.c, m = B.c;
  RowMap<T> C(c, n, m, Eigen::OuterStride<>(ldc));
  if (n == 0 || m == 0) return;
  if (k == 0) {
    if (beta == T(0))
      C.setZero();
    else
      C *= beta;
    return;
  }
  int64_t lda = 0, ldb = 0;
  const Layout la = layout(A, &lda), lb = layout(B, &ldb);
  const T* pa = static_cast<const T*>(A.p);
  const T* pb = static_cast<const T*>(B.p);
  using Eigen::ColMajor;
  using Eigen::OuterStride;
  using Eigen::RowMajor;
  if (la == Layout::Row) {
    CMap<T, RowMajor> Am(pa, n, k, OuterStride<>(lda));
    if (lb == Layout::Row)
      product(C, Am, CMap<T, RowMajor>(pb, k, m, OuterStride<>(ldb)), alpha, beta);
    else
      product(C, Am, CMap<T, ColMajor>(pb, k, m, OuterStride<>(ldb)), alpha, beta);
  } else {
    CMap<T, ColMajor> Am(pa, n, k, OuterStride<>(lda));
    if (lb == Layout::Row)
      product(C, Am, CMap<T, RowMajor>(pb, k, m, OuterStride<>(ldb)), alpha, beta);
    else
      product(C, Am, CMap<T, ColMajor>(pb, k, m, OuterStride<>(ldb)), alpha, beta);
  }
}

// Makes `t` mappable (copies only when neither row- nor column-major).
Tensor mappable(const Tensor& t, bool trans) {
  int64_t ld;
  if (layout(mat_of(t, trans), &ld) != Layout::None) return t;
  return raw::clone(t);
}

template <class T>
void gemm_t(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& out, double alpha, double beta) {
  Tensor A = mappable(a, ta), B = mappable(b, tb);
  Mat am = mat_of(A, ta), bm = mat_of(B, tb);
  Mat cm = mat_of(out, false);
  int64_t ldc;
  Layout lc = layout(cm, &ldc);
  // Eigen's noalias products must not write into an operand.
  if (out.storage() == A.storage() || out.storage() == B.storage()) lc = Layout::None;
  if (lc == Layout::Row) {
    gemm_mapped<T>(am, bm, static_cast<T*>(cm.p), ldc, T(alpha), T(beta));
  } else if (lc == Layout::Col) {
    // C^T = B^T A^T, and a column-major C is a row-major C^T.
    gemm_mapped<T>(bm.t(), am.t(), static_cast<T*>(cm.p), ldc, T(alpha), T(beta));
  } else {
    Tensor tmp = raw::clone(out);
    Mat tm = mat_of(tmp, false);
    gemm_mapped<T>(am, bm, static_cast<T*>(tm.p), std::max<int64_t>(tm.c, 1), T(alpha), T(beta));
    raw::copy_(out, tmp);
  }
}

bool half(DType t) { return t == DType::f16 || t == DType::bf16; }

}  // namespace

template <>
void CpuBackend::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha,
                      double beta) {
  if (half(a.dtype()) && out.dtype() == DType::f32)  // widening: f32 output
    return gemm_t<float>(raw::to_dtype(a, DType::f32), trans_a, raw::to_dtype(b, DType::f32), trans_b, out, alpha,
                         beta);
  if (half(out.dtype())) {
    Tensor o32 = beta == 0 ? empty(out.sizes(), {DType::f32}) : raw::to_dtype(out, DType::f32);
    gemm_t<float>(raw::to_dtype(a, DType::f32), trans_a, raw::to_dtype(b, DType::f32), trans_b, o32, alpha, beta);
    raw::copy_(out, o32);
    return;
  }
  if (out.dtype() == DType::f64) return gemm_t<double>(a, trans_a, b, trans_b, out, alpha, beta);
  MG_CHECK(out.dtype() == DType::f32, DTypeError, "gemm: unsupported dtype ", out.dtype());
  gemm_t<float>(a, trans_a, b, trans_b, out, alpha, beta);
}

template <>
void CpuBackend::bmm(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (half(out.dtype())) {
    Tensor o32 = empty(out.sizes(), {DType::f32});
    bmm(raw::to_dtype(a, DType::f32), raw::to_dtype(b, DType::f32), o32);
    raw::copy_(out, o32);
    return;
  }
  const int64_t B = a.size(0);
  // Check the layout of one batch matrix; the same strides apply to every batch.
  auto batch_ok = [](const Tensor& t) {
    int64_t ld;
    Mat m{t.raw_data(), t.size(1), t.size(2), t.stride(1), t.stride(2)};
    return layout(m, &ld) != Layout::None;
  };
  Tensor A = batch_ok(a) ? a : raw::contiguous(a);
  Tensor Bt = batch_ok(b) ? b : raw::contiguous(b);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    T* pc = static_cast<T*>(out.raw_data());
    const int64_t n = out.size(1), m = out.size(2);
    for (int64_t i = 0; i < B; ++i) {
      Mat am{static_cast<T*>(A.raw_data()) + i * A.stride(0), A.size(1), A.size(2), A.stride(1), A.stride(2)};
      Mat bm{static_cast<T*>(Bt.raw_data()) + i * Bt.stride(0), Bt.size(1), Bt.size(2), Bt.stride(1), Bt.stride(2)};
      gemm_mapped<T>(am, bm, pc + i * n * m, std::max<int64_t>(m, 1), T(1), T(0));
    }
  };
  if (out.dtype() == DType::f64) {
    run(double{});
  } else {
    MG_CHECK(out.dtype() == DType::f32, DTypeError, "bmm: unsupported dtype ", out.dtype());
    run(float{});
  }
}

template <>
void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  if (bias.defined()) {
    raw::copy_(out, bias);  // broadcast bias into every row, then accumulate x @ w^T
    gemm(x, false, w, true, out, 1.0, 1.0);
  } else {
    gemm(x, false, w, true, out, 1.0, 0.0);
  }
}

template <>
bool CpuBackend::fused_linear_weight_grads(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;  // a GEMM and a row sum (kernels/linalg.cc)
}

template <>
bool CpuBackend::fused_linear_gelu(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;  // linear, then gelu (kernels/linalg.cc)
}

template <>
bool CpuBackend::fused_matmul_gelu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return false;
}

}  // namespace mg::kernels
