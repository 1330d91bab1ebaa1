// Grad mode: whether ops record onto the tape. no_grad is the seeds' "inference without
// a graph": no nodes, no saved tensors, so activations are freed as soon as they die.
#pragma once

namespace mg {

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
