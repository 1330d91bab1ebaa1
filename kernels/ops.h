// The one dispatch surface for raw compute (no autograd): every function checks its
// inputs, then switches on device (cpu/ or cuda/) and dtype. autograd/ builds on these.
#pragma once

#include <atomic>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg::kernels {

enum class Unary {
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Relu, Gelu /* erf */, GeluTanh, Sigmoid, Tanh, Sign, Reciprocal, Square, Silu,
  LogicalNot
};
enum class Binary {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum,
  Eq, Ne, Lt, Le, Gt, Ge,  // comparisons return b8
  // Backward helpers: grad (a) combined with the forward input or output (b).
  ReluBackward,      // a * (b > 0), b = input
  GeluBackward,      // a * gelu'(b), b = input (erf form)
  GeluTanhBackward,  // a * gelu_tanh'(b)
  SigmoidBackward,   // a * b * (1 - b), b = output
  TanhBackward,      // a * (1 - b^2), b = output
  SiluBackward,      // a * silu'(b), b = input
};

// ---- elementwise (broadcasting, type promotion; comparisons give b8) ----
Tensor unary(Unary op, const Tensor& a);
Tensor binary(Binary op, const Tensor& a, const Tensor& b);
// a = op(a, b) in place; b broadcasts to a's shape; result cast to a's dtype. Bumps a's version.
void binary_(Binary op, const Tensor& a, const Tensor& b);
void unary_(Unary op, const Tensor& a);
// Shape both operands broadcast to; raises ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

inline Tensor add(const Tensor& a, const Tensor& b) { return binary(Binary::Add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(Binary::Sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(Binary::Mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(Binary::Div, a, b); }
// Scalar forms (the scalar takes a's dtype).
Tensor add_scalar(const Tensor& a, double s);
Tensor mul_scalar(const Tensor& a, double s);
Tensor pow_scalar(const Tensor& a, double exponent);
Tensor clamp(const Tensor& a, double lo, double hi);  // use +-inf for one-sided
// a*alpha + b*beta fused (optimizers, accumulation): out-of-place and in-place on a.
Tensor axpby(const Tensor& a, double alpha, const Tensor& b, double beta);
void axpby_(const Tensor& a, double alpha, const Tensor& b, double beta);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Gradient of clamp: grad where lo <= x <= hi, else 0.
Tensor clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi);

// ---- casts, fills, copies ----
Tensor cast(const Tensor& a, DType dtype);
void fill_(const Tensor& a, double v);
void copy_(const Tensor& dst, const Tensor& src);

// ---- reductions (dims may be negative; empty dims = all) ----
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Values and i64 indices of the max along one dim.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max_all(const Tensor& a);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (the reverse of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& shape);
// Sum of squares of all elements as an f32/f64 scalar tensor (norms, clipping).
Tensor sum_squares(const Tensor& a);
// True if any element is inf or NaN.
bool has_nonfinite(const Tensor& a);

// ---- settings ----
// TF32 tensor-core math for f32 matmuls on CUDA (faster, ~1e-3 relative error). Off by
// default, like PyTorch's torch.backends.cuda.matmul.allow_tf32.
inline std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}
inline void set_allow_tf32(bool on) { tf32_flag().store(on); }
inline bool allow_tf32() { return tf32_flag().load(); }

// ---- linear algebra ----
// a @ b with PyTorch's matmul semantics (1-D, 2-D, batched with broadcasting of batch dims).
Tensor matmul(const Tensor& a, const Tensor& b);
// [B, n, k] @ [B, k, m] -> [B, n, m]
Tensor bmm(const Tensor& a, const Tensor& b);
// 2-D GEMM: out = alpha * op(a) @ op(b) + beta * out, op = transpose when trans_*.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha = 1.0,
          double beta = 0.0);
// y = x @ w^T + bias over the last dim of x (bias optional).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// ---- softmax family (dim may be negative; computed in at least f32) ----
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// grad_in = y * (g - sum(g * y, dim))
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);
// grad_in = g - exp(y) * sum(g, dim)
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);

// ---- indexing ----
// one_hot(i64 indices, C) -> i64 [..., C]; raises IndexError for labels outside [0, C).
Tensor one_hot(const Tensor& indices, int64_t num_classes);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
void scatter_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
void scatter_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
void index_add_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim);

// ---- losses' fused pieces ----
// -log_probs[i, target[i]] per row, skipping ignore_index (0 loss); targets i64 [N].
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100);

}  // namespace mg::kernels
