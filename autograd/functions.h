// The user-facing differentiable ops (mg::add, mg::matmul, mg::relu, ...): each runs the
// kernels forward and records a node whose backward sits beside it in autograd/*_ops.cc.
#pragma once

#include <vector>

#include "autograd/conv_functions.h"
#include "autograd/grad_mode.h"
#include "autograd/transformer_functions.h"
#include "core/tensor.h"

namespace mg {

// ---- elementwise (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor rsub(double s, const Tensor& a);  // s - a
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor square(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanh_approx = false);
Tensor silu(const Tensor& a);
// log(1 + exp(beta x)) / beta, smooth relu; x itself where beta x > 20 (PyTorch's default
// threshold: the two differ by less than exp(-20) x, under f32's rounding). beta > 0.
Tensor softplus(const Tensor& a, double beta = 1.0);
Tensor sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor clamp(const Tensor& a, double lo, double hi);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Comparisons (not differentiable; b8 results).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// ---- in-place (version-counted; an in-place op on a saved tensor fails at backward) ----
Tensor& add_(Tensor& a, const Tensor& b);
Tensor& add_(Tensor& a, double s);
Tensor& mul_(Tensor& a, const Tensor& b);
Tensor& mul_(Tensor& a, double s);
Tensor& relu_(Tensor& a);
Tensor& fill_(Tensor& a, double v);
Tensor& zero_(Tensor& a);

// ---- reductions ----
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& a, int64_t dim, bool keepdim = false);  // values; gradient to the argmax
Tensor amax(const Tensor& a);                                    // max over all elements
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

// ---- linear algebra ----
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// Whether linear(x, w, bias) runs under the FP8 recipe (core/autocast.h, Fp8Autocast). Its GEMM
// adds the bias in the epilogue and its backward sums the bias gradient in the pass that casts the
// output gradient, so a branch keeps its bias there rather than leave it to the residual stream's
// norm, whose backward would take a column reduction of its own (nn::Linear::branch).
bool fp8_takes_linear(const Tensor& x, const Tensor& w);

// ---- softmax family ----
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);

// ---- shape (differentiable free-function forms of the Tensor methods) ----
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const Shape& dims);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);

// ---- indexing ----
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor one_hot(const Tensor& indices, int64_t num_classes);  // not differentiable
Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);

// ---- losses (reduction: "mean", "sum" or "none") ----
// cross_entropy takes class indices (integer, [N] or [N, d1...]: the fused kernel, O(N) saved)
// or class probabilities (floating, the input's shape: one-hot or soft labels, composed).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction = "mean",
                     int64_t ignore_index = -100, double label_smoothing = 0.0);
// cross_entropy(linear(x, weight), target) (no bias) without the logits: a language model's
// head and loss as one node. Rows go through in chunks (chunk_rows, 0: about 512 MiB of logits
// each), each chunk's logit gradient is folded into the x and weight gradients at once, so the
// [rows, classes] logits and their gradient never exist whole. x [..., in], weight [classes,
// in], target integer [...]. Follows autocast like linear (the loss itself in f32). reduction
// "none" (and half precision on the CPU) runs as the two ops.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& target,
                            const std::string& reduction = "mean", int64_t ignore_index = -100,
                            double label_smoothing = 0.0, int64_t chunk_rows = 0);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const std::string& reduction = "mean",
                int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

// ---- regularization ----
// Inverted dropout with a Philox mask; identity when !training or p == 0. One kernel
// (kernels::bias_dropout_add without bias or residual), and only the b8 mask is saved.
Tensor dropout(const Tensor& a, double p, bool training);
// x + dropout(branch + bias, p, training): a transformer branch's bias, dropout and residual add
// in one kernel, with the mask dropout would draw (same generator stream) and only that b8 mask
// saved for backward. x and bias may be undefined; bias is [branch.size(-1)] (cast to branch's
// dtype when it differs: autocast's f32 bias with a bf16 branch). The result has x's dtype: an
// f32 residual stream with an f16/bf16 branch stays f32, other mixes promote. When dropout is
// off it is the plain adds. Bias's gradient is the column sums of the branch's.
Tensor bias_dropout_add(const Tensor& x, const Tensor& branch, const Tensor& bias, double p, bool training);

// Operators.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(s, a); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace mg
