// nn::Linear: y = x @ W^T + b over the last dim, initialised like torch.nn.Linear
// (weight and bias ~ U(-1/sqrt(in), 1/sqrt(in))).
#pragma once

#include "core/random.h"
#include "autograd/residual.h"
#include "nn/module.h"

namespace mg::nn {

class Linear : public Module {
 public:
  // Parameters are allocated under MemoryCategory::Parameters; `gen` null = default generator.
  Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions opts = {},
         Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  using Module::operator();
  // The layer reading a pending layer norm (mg::Normed): under the FP8 recipe the norm runs in
  // the layer's node (mg::linear(Normed)). After the pre-hooks, as operator()(Tensor).
  Tensor operator()(const Normed& x);
  // The layer as a residual branch (mg::Residual): the output without the bias, and the bias,
  // which the stream adds inside its next layer norm. With bias_pending false (no norm reads
  // the stream next), a derived bias (leaves_bias) or a linear the FP8 recipe takes
  // (mg::fp8_takes_linear) the bias stays in the GEMM.
  Branch branch(const Tensor& x, bool bias_pending = true);
  // Whether branch() leaves the bias to the stream: asked to, with a bias that is the parameter
  // itself. A derived bias (pruning's bias_orig * mask, made by a pre-hook) must not outlive the
  // call that made it.
  bool leaves_bias(bool bias_pending) const;
  // kaiming_uniform_(weight, a = sqrt(5)) and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  void reset_parameters(Generator* gen = nullptr);
  std::string extra_repr() const override;

  const int64_t in_features;
  const int64_t out_features;
  // Bound to the registry: assigning here re-points the registered parameter (weight tying).
  Tensor& weight;  // [out, in]
  Tensor& bias;    // [out], undefined when bias = false

 private:
  void check_input(const Shape* x) const;
};

}  // namespace mg::nn
