// The residual stream of a pre-norm transformer as a value: x = x + branch reads as the math,
// and the op layer decides how the add runs (fused into the next layer norm, or with dropout).
#pragma once

#include <memory>

#include "core/tensor.h"

namespace mg {

// What a transformer branch (attention, MLP) hands to the residual stream: its output, the bias
// of the Linear that made it when that Linear left the bias out of its GEMM (undefined
// otherwise), and the training-mode dropout probability applied after the bias (0: none).
// The stream's next value is x + dropout(out + bias, p).
struct Branch {
  Tensor out, bias;
  double p = 0.0;
};

// x + branch with the add left pending: the next layer_norm of the stream runs the add, the
// bias and the norm as one op (add_layer_norm: one kernel forward and one backward on CUDA,
// and the bias's gradient comes out of the norm's backward). Anything else that needs the
// stream's value asks value(), which does the add once. A branch with dropout is added at
// once (bias_dropout_add: one kernel), never left pending.
//
// Residual is a handle: copies share one state, so that `x = x + f(ln(x))` sees the add that
// ln(x) did, whatever order the compiler evaluates the operands in.
class Residual {
 public:
  Residual() : s_(std::make_shared<State>()) {}
  Residual(Tensor x);  // NOLINT(google-explicit-constructor): a stream with nothing pending
  Residual(Tensor x, Branch pending);

  // A new stream whose value is this one's plus the branch.
  Residual operator+(const Branch& b) const;
  Residual operator+(const Tensor& b) const { return *this + Branch{b}; }

  // The stream's value, the pending add done (once: the result is kept).
  const Tensor& value() const;
  // The value without the pending branch, and the branch (what layer_norm reads).
  const Tensor& base() const { return s_->base; }
  const Branch& pending() const { return s_->pending; }
  bool has_pending() const { return s_->pending.out.defined(); }

 private:
  friend Tensor layer_norm(const Residual& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                           double eps);
  struct State {
    Tensor base;
    Branch pending;
  };
  std::shared_ptr<State> s_;
};

// layer_norm of the stream's value. With a branch pending, the add (and its bias) runs inside
// the norm (add_layer_norm) and the stream keeps the sum, so no add runs on its own. Under
// autocast the normalized output comes in the autocast dtype: a pre-norm block hands it to a
// linear, which would cast it anyway.
Tensor layer_norm(const Residual& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace mg
