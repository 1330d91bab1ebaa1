// Raw (no autograd) elementwise ops: unary and binary maps with broadcasting and type
// promotion, clamp, axpby, where, casts, fills and copies. Each checks its inputs, then dispatches.
#pragma once

#include "core/tensor.h"
#include "kernels/types.h"

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

// ---- casts, fills, copies ----
Tensor cast(const Tensor& a, DType dtype);
void fill_(const Tensor& a, double v);
void copy_(const Tensor& dst, const Tensor& src);

}  // namespace mg::kernels
