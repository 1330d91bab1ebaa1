// Stateless layers as Modules: ReLU (optionally in place), GELU, SiLU, Dropout, Flatten. They
// hold no parameters; they exist so models can be written as a Sequential.
#pragma once

#include <string>

#include "autograd/residual.h"
#include "nn/module.h"

namespace mg::nn {

class ReLU : public Module {
 public:
  // inplace: overwrite the input with mg::relu_ when autograd allows it (not a leaf that
  // requires grad), saving one activation-sized buffer; otherwise falls back to mg::relu.
  explicit ReLU(bool inplace = false) : Module("ReLU"), inplace(inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return inplace ? "inplace=true" : ""; }
  bool inplace;
};

// approximate: "none" (erf, exact) or "tanh" (GPT-2's approximation).
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override { return "approximate=" + approximate; }
  const std::string approximate;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Dropout : public Module {
 public:
  // p in [0, 1): probability of zeroing an element; identity in eval mode.
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  // This dropout applied to a residual branch: sets the branch's p (in training, p > 0), so that
  // the stream adds it with its bias and dropout in one kernel (mg::Residual).
  Branch branch(Branch b);
  std::string extra_repr() const override;
  double p;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t start_dim, end_dim;
};

}  // namespace mg::nn
