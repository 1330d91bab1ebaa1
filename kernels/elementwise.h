// Raw (no autograd) elementwise ops: unary and binary maps with broadcasting and type
// promotion, clamp, axpby, where, casts, fills and copies. Each checks its inputs, then dispatches.
#pragma once

#include <optional>
#include <utility>

#include "core/tensor.h"
#include "kernels/types.h"

namespace mg {
class Generator;
}  // namespace mg

namespace mg::kernels {

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

// ---- fused bias + dropout + residual (transformer branches) ----
// Inverted dropout of (branch + bias), added to the residual x, in one pass: returns (out,
// keep) with out = x + keep * (branch + bias) / (1 - p) and keep (b8, branch's shape) the mask
// bernoulli_(1 - p) would draw from `gen` (the default generator when null) at this point of
// its stream. x and bias may be undefined (a plain dropout). branch is floating with ndim >= 1;
// bias is [N], N = branch's last dim, in branch's dtype; x has branch's shape and either
// branch's dtype or f32 with an f16/bf16 branch (a residual stream kept in f32 under autocast),
// and out has x's dtype (branch's without x). Math in f32 (f64 for f64), one rounding: in f32
// and f64 the same bits as add(x, mul(add(branch, bias), mul_scalar(keep, 1 / (1 - p)))).
// 0 <= p < 1; a CUDA graph capture draws as random fills do (core/random.h).
std::pair<Tensor, Tensor> bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, double p,
                                           Generator* gen = nullptr);
// grad * keep / (1 - p) in out_dtype (grad's when unset; else grad's dtype, or f16/bf16 from an
// f32 grad): the gradient bias_dropout_add passes to its branch.
Tensor dropout_backward(const Tensor& grad, const Tensor& keep, double p,
                        std::optional<DType> out_dtype = std::nullopt);

// ---- casts, fills, copies ----
Tensor cast(const Tensor& a, DType dtype);
void fill_(const Tensor& a, double v);
void copy_(const Tensor& dst, const Tensor& src);

}  // namespace mg::kernels
