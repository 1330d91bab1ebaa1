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
// 2-D GEMM: out = alpha * op(a) @ op(b) + beta * out, op = transpose when trans_*.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out, double alpha = 1.0,
          double beta = 0.0);
// y = x @ w^T + bias over the last dim of x (bias optional).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// linear's weight and bias gradients from the output gradient g [rows, out] and the input
// x [rows, in]: gw = g^T @ x and, with want_bias, gb = g summed over rows (else undefined). On
// CUDA one cuBLASLt GEMM computes both (the bias-gradient epilogue); elsewhere a GEMM and a sum.
std::pair<Tensor, Tensor> linear_weight_grads(const Tensor& g, const Tensor& x, bool want_bias);

}  // namespace mg::kernels
