// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay, with
// PyTorch's exact update rule (torch.optim.SGD, foreach=False).
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace mg::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
  // Fused multi-tensor update (kernels/optim.h) for every contiguous f32 parameter (f64
  // too on the CPU); false: one kernel per op per parameter (PyTorch's foreach=False).
  bool fused = true;
  // Capturable (optim/optimizer.h): the lr and step counts in device memory, so the step can run
  // inside a CUDA graph and be skipped on the device by a GradScaler. Needs the fused path for
  // every parameter.
  bool capturable = false;
};

// Per parameter p with gradient g (group options lr, mu = momentum, tau = dampening, wd):
//   g = maximize ? -g : g;   if wd != 0: g = g + wd * p
//   if mu != 0: b = (first step) ? g : mu * b + (1 - tau) * g
//               g = nesterov ? g + mu * b : b
//   p = p - lr * g
// The momentum buffer b is created on the first step that sees a gradient for p, under
// MemoryCategory::OptimizerState. Group options: "lr", "momentum", "dampening",
// "weight_decay", "nesterov" (0/1), "maximize" (0/1).
// A bf16 parameter (pure-bf16 training) is updated in f32 with an f32 momentum buffer and
// rounded stochastically (optim/bf16_update.h), so updates below its resolution still count.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions defaults);
  SGD(std::vector<ParamGroup> groups, SGDOptions defaults);
  void step() override;

 protected:
  void validate(const ParamGroup& group) const override;
  StateSpec state_spec(const std::map<std::string, double>& options, const Tensor& param) const override;

 private:
  bool fused_;
};

}  // namespace mg::optim
