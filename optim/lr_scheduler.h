// Learning-rate schedulers with torch.optim.lr_scheduler's names and closed forms: StepLR,
// MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR (warmup), SequentialLR and
// ChainedScheduler (chaining), ReduceLROnPlateau.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/state_dict.h"
#include "optim/optimizer.h"

namespace mg::optim {

// An epoch-indexed schedule. Like PyTorch, construction records each group's "initial_lr"
// (the base lr) and applies epoch 0; every step() then advances one epoch (or one batch,
// when called per batch) and sets each group's lr to lr_at(epoch, base_lr). Call it after
// optimizer.step(). The value is a closed form of the epoch, so a resumed schedule cannot
// drift from an uninterrupted one.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  void step();
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The lrs this scheduler last set, one per group (PyTorch's get_last_lr()).
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  // The schedule's value at `epoch` for a group whose base lr is `base_lr`.
  virtual double lr_at(int64_t epoch, double base_lr) const = 0;

  // {"type", "last_epoch", "base_lrs", "last_lrs"}; load re-applies the saved epoch's lrs to
  // the optimizer. A different type or group count, a last_epoch that is not an integer >= 0
  // or a base lr that is not a finite number is a ValueError, and nothing changes.
  virtual StateDict state_dict() const;
  void load_state_dict(const StateDict& sd) { stage_state_dict(sd)(); }
  // The checking half of load_state_dict; the returned function commits (core/state_dict.h).
  StagedLoad stage_state_dict(const StateDict& sd);
  const std::string& name() const { return name_; }

 protected:
  LRScheduler(std::string name, Optimizer& opt);
  // Applies epoch 0. Derived constructors call it once their parameters are set (lr_at is
  // virtual, so the base constructor cannot).
  void init();
  void apply(int64_t epoch);
  Optimizer& opt_;

 private:
  friend class SequentialLR;
  friend class ChainedScheduler;
  std::string name_;
  int64_t last_epoch_ = -1;
  std::vector<double> base_lrs_, last_lrs_;
};

// A schedule given by a formula of (epoch, base lr). The closed-form schedulers below are
// this class with their arguments checked and bound into the formula.
class ClosedFormLR : public LRScheduler {
 public:
  using Formula = std::function<double(int64_t epoch, double base_lr)>;
  double lr_at(int64_t epoch, double base_lr) const final { return formula_(epoch, base_lr); }

 protected:
  ClosedFormLR(std::string name, Optimizer& opt, Formula formula);

 private:
  Formula formula_;
};

// lr = base * gamma^(epoch / step_size)  (integer division)
class StepLR : public ClosedFormLR {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
};

// lr = base * gamma^(number of milestones <= epoch)
class MultiStepLR : public ClosedFormLR {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);
};

// lr = base * gamma^epoch
class ExponentialLR : public ClosedFormLR {
 public:
  ExponentialLR(Optimizer& opt, double gamma);
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2
class CosineAnnealingLR : public ClosedFormLR {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0.0);
};

// Linear warmup: lr = base * (start + (end - start) * min(epoch, total_iters) / total_iters).
class LinearLR : public ClosedFormLR {
 public:
  LinearLR(Optimizer& opt, double start_factor = 1.0 / 3.0, double end_factor = 1.0, int64_t total_iters = 5);
};

// Chains schedulers in time: schedulers[0] until milestones[0], then schedulers[1] counted
// from 0 again, ... (torch.optim.lr_scheduler.SequentialLR), e.g. LinearLR warmup then
// cosine. The children must be built on the same optimizer; this one drives them.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<int64_t> milestones);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

// Runs schedulers side by side (torch.optim.lr_scheduler.ChainedScheduler): each one's value
// is the next one's base, lr = s_n(e, ... s_1(e, base)). For the multiplicative schedulers
// (StepLR, MultiStepLR, ExponentialLR, LinearLR) that is base * f_1(e) * ... * f_n(e),
// exactly PyTorch's chained result; CosineAnnealingLR with eta_min != 0 composes differently
// from PyTorch's recursive form.
class ChainedScheduler : public LRScheduler {
 public:
  ChainedScheduler(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

struct PlateauOptions {
  std::string mode = "min";  // "min": lower metric is better; "max": higher is
  double factor = 0.1;       // new lr = max(lr * factor, min_lr)
  int64_t patience = 10;     // bad epochs tolerated before a reduction
  double threshold = 1e-4;
  std::string threshold_mode = "rel";  // "rel": best * (1 -/+ threshold); "abs": best -/+ threshold
  int64_t cooldown = 0;                // epochs after a reduction during which bad epochs don't count
  std::vector<double> min_lr = {0.0};  // one value for all groups, or one per group
  double eps = 1e-8;                   // reductions smaller than this are skipped
};

// Reduces the lr when a metric stops improving (torch.optim.lr_scheduler.ReduceLROnPlateau).
class ReduceLROnPlateau {
 public:
  ReduceLROnPlateau(Optimizer& opt, PlateauOptions options = {});
  void step(double metric);
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  int64_t last_epoch() const { return last_epoch_; }

  // Entries of the wrong type or range (negative counters, a non-finite best or min_lr) are a
  // ValueError, and nothing changes.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd) { stage_state_dict(sd)(); }
  StagedLoad stage_state_dict(const StateDict& sd);

 private:
  bool is_better(double a) const;
  Optimizer& opt_;
  PlateauOptions o_;
  std::vector<double> min_lrs_, last_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
};

}  // namespace mg::optim
