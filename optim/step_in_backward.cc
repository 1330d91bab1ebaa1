#include "optim/step_in_backward.h"

#include "autograd/node.h"
#include "core/error.h"

namespace mg::optim {

StepInBackward::StepInBackward(Optimizer& opt, int64_t bucket_bytes) : opt_(opt), bucket_bytes_(bucket_bytes) {
  MG_CHECK(bucket_bytes >= 0, ValueError, "StepInBackward: bucket_bytes must be >= 0, got ", bucket_bytes);
  for (const ParamGroup& g : opt.param_groups()) {
    for (const Tensor& p : g.params) {
      if (!p.requires_grad()) continue;
      handles_.push_back(autograd::register_post_accumulate_grad_hook(p, [this](const Tensor& t) { on_gradient(t); }));
      ++n_params_;
    }
  }
}

StepInBackward::~StepInBackward() {
  for (uint64_t h : handles_) autograd::remove_post_accumulate_grad_hook(h);
}

void StepInBackward::on_gradient(const Tensor& p) {
  if (!enabled_) return;
  MG_CHECK(done_.insert(p.impl()).second, AutogradError, "StepInBackward: the parameter of shape ",
           shape_str(p.sizes()),
           " received a second gradient after it was handed to the optimizer in this round (used by two "
           "separately accumulated paths, e.g. across reentrant checkpoint regions, or two backward() calls "
           "without finish() between them); its update would be split in two");
  pending_.push_back(p);
  pending_bytes_ += p.nbytes();
  if (pending_bytes_ >= bucket_bytes_ || done_.size() == n_params_) flush();
  if (done_.size() == n_params_) done_.clear();  // every parameter reported: the round is over
}

void StepInBackward::flush() {
  if (pending_.empty()) return;
  // step() updates exactly the parameters holding a gradient. Earlier buckets' gradients were
  // dropped; a later parameter may still hold a partial one (earlier micro-batches of an
  // accumulation), so those are set aside for the step and put back.
  std::unordered_set<const TensorImpl*> bucket;
  for (const Tensor& p : pending_) bucket.insert(p.impl());
  std::vector<std::pair<Tensor, Tensor>> aside;
  for (const ParamGroup& g : opt_.param_groups())
    for (const Tensor& p : g.params)
      if (!bucket.count(p.impl()) && p.grad().defined()) {
        aside.emplace_back(p, p.grad());
        p.set_grad(Tensor());
      }
  struct PutBack {  // even when step() throws: the gradients set aside are the caller's
    std::vector<std::pair<Tensor, Tensor>>& aside;
    ~PutBack() {
      for (const auto& [p, g] : aside) p.set_grad(g);
    }
  } put_back{aside};
  opt_.step();
  for (const Tensor& p : pending_) p.set_grad(Tensor());
  pending_.clear();
  pending_bytes_ = 0;
  ++buckets_;
}

void StepInBackward::abandon() {
  for (const Tensor& p : pending_) p.set_grad(Tensor());
  pending_.clear();
  pending_bytes_ = 0;
  done_.clear();
}

void StepInBackward::finish() {
  flush();
  done_.clear();
}

}  // namespace mg::optim
