// CUDA kernels behind kernels/ops.h, declared like kernels/cpu/cpu_ops.h: ops.cc has
// already validated shapes, dtypes and devices and allocated the outputs; these compute.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace mg::kernels::cuda {

// ---- elementwise (elementwise.cu); every dtype, float ops in f32 (f64 for f64) ----
// `a` and `out` have the same shape; out has a's dtype (b8 also allowed for LogicalNot).
void unary(Unary op, const Tensor& a, const Tensor& out);
// `a`, `b` already broadcast (expanded views) to out's shape and cast to one dtype;
// out has that dtype, or b8 for comparisons. `out` may alias `a` (in-place ops).
void binary(Binary op, const Tensor& a, const Tensor& b, const Tensor& out);
void clamp(const Tensor& a, double lo, double hi, const Tensor& out);
// x has grad's dtype and shape.
void clamp_backward(const Tensor& grad, const Tensor& x, double lo, double hi, const Tensor& out);
// out = a*alpha + b*beta; a, b broadcast to out's shape with out's dtype (out may alias a).
void axpby(const Tensor& a, double alpha, const Tensor& b, double beta, const Tensor& out);
// cond is b8; cond, a, b broadcast to out's shape; a, b have out's dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);

// ---- reductions (reduce.cu) ----
// `out` has a's rank with size 1 on the reduced dims (keepdim shape).
void sum(const Tensor& a, const Tensor& out);   // out dtype: a's (floating) or i64
void mean(const Tensor& a, const Tensor& out);  // floating only
void var(const Tensor& a, int64_t correction, const Tensor& out);  // floating only
// values/indices have a's rank with size 1 at `dim`; a.size(dim) > 0; indices i64.
void max_min(const Tensor& a, int64_t dim, bool is_max, const Tensor& values, const Tensor& indices);
void sum_squares(const Tensor& a, const Tensor& out);  // out: 0-dim f32 or f64
// One device->host read of a flag (synchronizes the current stream).
bool has_nonfinite(const Tensor& a);

// ---- linear algebra (linalg.cc, cuBLAS); f64, f32, f16, bf16; f32 stays exact (no TF32) ----
// out = alpha * op(a) @ op(b) + beta * out for 2-D tensors of one dtype (any strides).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha, double beta);
// [B, n, k] @ [B, k, m] -> out [B, n, m] (out contiguous); batch strides may be 0 (broadcast).
void bmm(const Tensor& a, const Tensor& b, const Tensor& out);
// out [M, N] (contiguous) = x [M, K] @ w[N, K]^T + bias [N] (bias may be undefined).
void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out);

// ---- softmax family (softmax.cu); floating only, same dtype in and out ----
void softmax(const Tensor& a, int64_t dim, bool log, const Tensor& out);
void softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const Tensor& out);

// ---- indexing (index.cu); index tensors are i64 or i32 and are bounds-checked here
// (one small device->host read per call) before any kernel reads through them ----
void one_hot(const Tensor& indices, int64_t num_classes, const Tensor& out);
void gather(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out);
void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool add);
void index_select(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& out);
void index_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// out has target's shape; class dim of log_probs is 1 (0 for 1-D input).
void nll_loss_forward(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, const Tensor& out);

}  // namespace mg::kernels::cuda
