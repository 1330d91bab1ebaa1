// Grad mode: whether ops record onto the tape. no_grad is the seeds' "inference without
// a graph": no nodes, no saved tensors, so activations are freed as soon as they die.
#pragma once

#include <vector>

namespace mg {

class Tensor;

bool is_grad_enabled();
void set_grad_enabled(bool on);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
using no_grad = NoGradGuard;

// Drops (set_to_none, PyTorch's default) or zero-fills, without recording, each tensor's
// .grad: what Module::zero_grad and Optimizer::zero_grad do to their parameters.
void zero_grads(const std::vector<Tensor>& params, bool set_to_none);

class EnableGradGuard {
 public:
  explicit EnableGradGuard(bool on = true) : prev_(is_grad_enabled()) { set_grad_enabled(on); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace mg
