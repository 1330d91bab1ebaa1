// The optimizer step inside backward: each parameter's gradient is handed to the optimizer as
// soon as it is final (a post-accumulate-grad hook), a bucket at a time, and dropped after
// the update, so the whole set of gradients is never alive at once. GPT-2 124M's f32
// gradients are 0.46 GiB; under activation checkpointing the peak moves into backward, where
// they pile up, and this takes them off it.
//
// What combines with it, and what does not:
//   - plain steps, weight decay, per-group options, LR schedulers (set the lr between steps),
//     frozen parameters (no gradient, no step): yes;
//   - gradient accumulation: yes, with set_enabled(false) for every micro-batch but the last
//     (the hooks then leave the gradients to accumulate as usual);
//   - gradient clipping by the global norm, and GradScaler's unscale + inf check: no. Both need
//     every gradient before the first update; a per-bucket norm is a different algorithm;
//   - DDP: no (its own hooks reduce the buckets; the reduced gradient is not final in this
//     hook);
//   - a parameter that receives two separate accumulations in one backward (tied weights
//     across reentrant checkpoint regions, or two backward() calls without finish() between
//     them): raises mg::AutogradError at the second one instead of stepping twice.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mg::optim {

class StepInBackward {
 public:
  // Registers a hook on every parameter of every group of `opt` (which must outlive this).
  // A bucket is stepped once at least bucket_bytes of parameters have final gradients, and
  // whatever remains when the last parameter reports.
  explicit StepInBackward(Optimizer& opt, int64_t bucket_bytes = int64_t{32} << 20);
  ~StepInBackward();
  StepInBackward(const StepInBackward&) = delete;
  StepInBackward& operator=(const StepInBackward&) = delete;

  // Off: the hooks do nothing and gradients stay on the parameters (call opt.step() yourself,
  // or turn it on again for the last micro-batch of an accumulation).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Steps what is still pending and starts a new round. Needed after a backward in which
  // some parameter got no gradient (frozen, unused): the round cannot tell it is over.
  void finish();
  // Drops the round without stepping it (the pending gradients too): after backward threw,
  // e.g. an OutOfMemoryError, so the next backward starts clean.
  void abandon();

  int64_t buckets_stepped() const { return buckets_; }  // over this object's life

 private:
  void on_gradient(const Tensor& p);
  void flush();

  Optimizer& opt_;
  int64_t bucket_bytes_;
  bool enabled_ = true;
  size_t n_params_ = 0;
  std::vector<uint64_t> handles_;
  std::vector<Tensor> pending_;
  int64_t pending_bytes_ = 0;
  std::unordered_set<const TensorImpl*> done_;  // stepped (or pending) in this round
  int64_t buckets_ = 0;
};

}  // namespace mg::optim
