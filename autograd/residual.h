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
  friend class Normed;
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

// The layer norm of a residual stream, left for the op that reads it (nn::LayerNorm of a
// Residual returns one). mg::linear and mg::gelu_mlp take it: under the FP8 recipe with delayed
// scaling they run the stream's pending add, the norm and the cast of its output for their first
// GEMM as one pass (autograd/fp8_linear.h, fp8_norm_linear), so the normalized rows are written
// only as that GEMM's FP8 codes. Anything else reads value(): layer_norm(stream, ...), run once
// and kept. A handle, as Residual is: copies share one state.
class Normed {
 public:
  Normed(Residual x, Shape normalized_shape, Tensor weight, Tensor bias, double eps);

  // The norm's output: layer_norm(stream(), ...), run at the first call.
  const Tensor& value() const;
  operator const Tensor&() const { return value(); }  // NOLINT(google-explicit-constructor): it is the norm's output

  // What an op that runs the norm itself reads, while pending() (nothing has run it).
  bool pending() const { return !s_->value.defined() && !s_->ran; }
  const Residual& stream() const { return s_->stream; }
  const Shape& normalized_shape() const { return s_->normalized_shape; }
  const Tensor& weight() const { return s_->weight; }
  const Tensor& bias() const { return s_->bias; }
  double eps() const { return s_->eps; }
  // The shape of the norm's output (the stream's).
  const Shape& sizes() const { return s_->stream.base().sizes(); }
  // Called by an op that ran the norm itself: the stream's value is now `sum` (the pending add
  // done). value() after it runs the norm again, on the sum.
  void ran(Tensor sum) const;

 private:
  struct State {
    Residual stream;
    Shape normalized_shape;
    Tensor weight, bias;
    double eps = 1e-5;
    Tensor value;
    bool ran = false;
  };
  std::shared_ptr<State> s_;
};

// linear and gelu_mlp reading a pending norm: under the FP8 recipe with delayed scaling the norm
// runs inside them (autograd/fp8_linear.h, fp8_norm_linear), else they read x.value(). And
// whether the recipe takes them, decided on the stream, which has the norm output's shape.
Tensor linear(const Normed& x, const Tensor& w, const Tensor& bias = Tensor());
Tensor gelu_mlp(const Normed& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj);
bool fp8_takes_linear(const Normed& x, const Tensor& w);
bool fp8_takes_gelu_mlp(const Normed& x, const Tensor& w_fc, const Tensor& w_proj);

}  // namespace mg
