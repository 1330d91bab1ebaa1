// Loss modules: thin wrappers over the differentiable losses in autograd/functions.h that
// remember their options, for code written in the `criterion(logits, target)` style.
#pragma once

#include <string>

#include "nn/module.h"

namespace mg::nn {

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(std::string reduction = "mean", int64_t ignore_index = -100, double label_smoothing = 0.0);
  Tensor operator()(const Tensor& logits, const Tensor& target) const;
  std::string extra_repr() const override;
  std::string reduction;
  int64_t ignore_index;
  double label_smoothing;
};

class MSELoss : public Module {
 public:
  explicit MSELoss(std::string reduction = "mean");
  Tensor operator()(const Tensor& input, const Tensor& target) const;
  std::string extra_repr() const override { return "reduction=" + reduction; }
  std::string reduction;
};

}  // namespace mg::nn
