// Raw linear algebra: matmul with PyTorch semantics, bmm, GEMM, linear; the TF32 switch.
#pragma once

#include <utility>
#include <atomic>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/types.h"

namespace mg::kernels {

// ---- linear algebra ----
// a @ b with PyTorch's matmul semantics (1-D, 2-D, batched with broadcasting of batch dims).
Tensor matmul(const Tensor& a, const Tensor& b);
// [B, n, k] @ [B, k, m] -> [B, n, m]
Tensor bmm(const Tensor& a, const Tensor& b);
// 2-D GEMM: out = alpha * op(a) @ op(b) + beta * out, op = transpose when trans_*. out has the
// inputs' dtype, or f32 for f16/bf16 inputs (products accumulate in f32 either way).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha = 1.0,
          double beta = 0.0);
// y = x @ w^T + bias over the last dim of x (bias optional).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// linear's weight and bias gradients from the output gradient g [rows, out] and the input
// x [rows, in]: gw = g^T @ x and, with want_bias, gb = g summed over rows (else undefined). On
// CUDA a cuBLASLt GEMM and the column reduction (CudaBackend::fused_linear_weight_grads);
// elsewhere a GEMM and a sum. `grad_dtype` (default: x's) may be f32 for f16/bf16 g and x: both
// gradients are then written from f32 sums without rounding to the operands' type (on CUDA;
// elsewhere a widening GEMM, and the bias sum rounded to x's dtype, then widened). Autocast's weight casts take such
// gradients as they are (autograd::grad_dtype_for), which saves the cast back to the f32 weight.
std::pair<Tensor, Tensor> linear_weight_grads(const Tensor& g, const Tensor& x, bool want_bias);
std::pair<Tensor, Tensor> linear_weight_grads(const Tensor& g, const Tensor& x, bool want_bias, DType grad_dtype);

// The transformer MLP's first linear with its tanh GELU: returns (out, pre) with pre = x @ w^T
// + bias and out = gelu_tanh(pre), both shaped like linear's result. On CUDA in f16/bf16 one
// cuBLASLt GEMM writes both (the GELU epilogue, which applies the GELU to the f32 accumulator
// before rounding: `out` can differ from gelu(round(pre)) by one rounding); f32 and everything
// else run linear, then the GELU kernel (the epilogue's tanh is accurate to about 1e-4, below
// f32's precision).
std::pair<Tensor, Tensor> linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// The gradient reaching `pre` when the gradient g [rows, k] reaches gelu's output through a
// linear with weight w [k, n]: g_pre = (g @ w) * gelu_tanh'(pre), pre [rows, n]. On CUDA in
// f16/bf16 one cuBLASLt GEMM (the GELU-derivative epilogue, reading pre); elsewhere a GEMM, then
// the GELU backward kernel. linear_gelu's bias gradient is the row sum of g_pre: the caller takes
// it with the weight gradient (linear_weight_grads), which measured faster than the epilogue's
// own bias-gradient variant.
Tensor matmul_gelu_backward(const Tensor& g, const Tensor& w, const Tensor& pre);

}  // namespace mg::kernels
