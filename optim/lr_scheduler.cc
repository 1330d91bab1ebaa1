#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace mg::optim {

namespace {
void check_children(const char* who, Optimizer& opt, const std::vector<std::shared_ptr<LRScheduler>>& ss,
                    const std::function<Optimizer*(const LRScheduler&)>& opt_of) {
  MG_CHECK(!ss.empty(), ValueError, who, ": expects at least one scheduler");
  for (size_t i = 0; i < ss.size(); ++i) {
    MG_CHECK(ss[i] != nullptr, ValueError, who, ": scheduler ", i, " is null");
    MG_CHECK(opt_of(*ss[i]) == &opt, ValueError, who, ": scheduler ", i, " (", ss[i]->name(),
             ") was built on another optimizer");
  }
}
}  // namespace

// ---------------------------------------------------------------- LRScheduler

LRScheduler::LRScheduler(std::string name, Optimizer& opt) : opt_(opt), name_(std::move(name)) {
  // The first scheduler built on an optimizer records "initial_lr"; later ones (the parts of
  // a SequentialLR) read it, so they all start from the same base (PyTorch's setdefault).
  for (ParamGroup& g : opt_.param_groups()) {
    if (!g.options.count("initial_lr")) g.set("initial_lr", g.lr());
    base_lrs_.push_back(g.get("initial_lr"));
  }
}

void LRScheduler::init() { apply(0); }

void LRScheduler::apply(int64_t epoch) {
  last_epoch_ = epoch;
  auto& groups = opt_.param_groups();
  MG_CHECK(groups.size() == base_lrs_.size(), ValueError, name_, ": the optimizer has ", groups.size(),
           " parameter groups, the scheduler was built for ", base_lrs_.size());
  last_lrs_.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    last_lrs_[i] = lr_at(epoch, base_lrs_[i]);
    groups[i].set_lr(last_lrs_[i]);
  }
  opt_.sync_device_lr();  // a capturable optimizer's replays read the lr from device memory
}

void LRScheduler::step() { apply(last_epoch_ + 1); }

StateDict LRScheduler::state_dict() const {
  StateDict sd;
  sd.meta = {{"type", name_}, {"last_epoch", last_epoch_}, {"base_lrs", base_lrs_}, {"last_lrs", last_lrs_}};
  return sd;
}

namespace {
// meta[key] as `n` finite numbers (or any count when n is npos); ValueError naming it otherwise.
std::vector<double> finite_numbers(const nlohmann::json& m, const char* key, size_t n, const std::string& op) {
  const nlohmann::json& a = m[key];
  MG_CHECK(a.is_array() && (n == std::string::npos || a.size() == n), ValueError, op, ": \"", key, "\" is ", a.dump(),
           "; expected ", n, " numbers (one per parameter group)");
  std::vector<double> out;
  for (auto& v : a) {
    MG_CHECK(v.is_number() && std::isfinite(v.get<double>()), ValueError, op, ": \"", key, "\" holds ", v.dump(),
             " (expected finite numbers)");
    out.push_back(v.get<double>());
  }
  return out;
}
int64_t counter_value(const nlohmann::json& m, const char* key, const std::string& op) {
  MG_CHECK(m[key].is_number_integer() && m[key].get<int64_t>() >= 0, ValueError, op, ": \"", key, "\" is ",
           m[key].dump(), " (expected an integer >= 0)");
  return m[key].get<int64_t>();
}
}  // namespace

StagedLoad LRScheduler::stage_state_dict(const StateDict& sd) {
  const std::string op = name_ + "::load_state_dict";
  const auto& m = sd.meta;
  MG_CHECK(m.is_object() && m.contains("type") && m.contains("last_epoch") && m.contains("base_lrs"), ValueError, op,
           ": meta lacks \"type\", \"last_epoch\" or \"base_lrs\"");
  MG_CHECK(m["type"] == name_, ValueError, op, ": the state was saved by a ", m["type"].dump());
  std::vector<double> base_lrs = finite_numbers(m, "base_lrs", base_lrs_.size(), op);
  const int64_t epoch = counter_value(m, "last_epoch", op);
  return [this, base_lrs = std::move(base_lrs), epoch] {
    base_lrs_ = base_lrs;
    auto& groups = opt_.param_groups();
    for (size_t i = 0; i < groups.size(); ++i) groups[i].set("initial_lr", base_lrs_[i]);
    apply(epoch);
  };
}

// ---------------------------------------------------------------- closed forms

ClosedFormLR::ClosedFormLR(std::string name, Optimizer& opt, Formula formula)
    : LRScheduler(std::move(name), opt), formula_(std::move(formula)) {
  init();
}

namespace {

// Each scheduler's argument checks (made before the optimizer is touched) and formula.

ClosedFormLR::Formula step_lr(int64_t step_size, double gamma) {
  MG_CHECK(step_size > 0, ValueError, "StepLR: step_size must be > 0, got ", step_size);
  return [=](int64_t e, double base) { return base * std::pow(gamma, static_cast<double>(e / step_size)); };
}

ClosedFormLR::Formula multi_step_lr(std::vector<int64_t> milestones, double gamma) {
  for (size_t i = 1; i < milestones.size(); ++i)
    MG_CHECK(milestones[i] >= milestones[i - 1], ValueError, "MultiStepLR: milestones must be increasing, got ",
             milestones[i - 1], " then ", milestones[i]);
  return [milestones = std::move(milestones), gamma](int64_t e, double base) {
    // A repeated milestone counts twice, like PyTorch's Counter.
    const auto n = std::upper_bound(milestones.begin(), milestones.end(), e) - milestones.begin();
    return base * std::pow(gamma, static_cast<double>(n));
  };
}

ClosedFormLR::Formula cosine_annealing_lr(int64_t t_max, double eta_min) {
  MG_CHECK(t_max > 0, ValueError, "CosineAnnealingLR: T_max must be > 0, got ", t_max);
  return [=](int64_t e, double base) {
    return eta_min +
           (base - eta_min) * (1.0 + std::cos(M_PI * static_cast<double>(e) / static_cast<double>(t_max))) / 2.0;
  };
}

ClosedFormLR::Formula linear_lr(double start, double end, int64_t total_iters) {
  MG_CHECK(start > 0.0 && start <= 1.0, ValueError,
           "LinearLR: starting multiplicative factor expected to be > 0 and <= 1, got ", start);
  MG_CHECK(end >= 0.0 && end <= 1.0, ValueError,
           "LinearLR: ending multiplicative factor expected to be between 0 and 1, got ", end);
  MG_CHECK(total_iters > 0, ValueError, "LinearLR: total_iters must be > 0, got ", total_iters);
  return [=](int64_t e, double base) {
    const double t = static_cast<double>(std::min(e, total_iters)) / static_cast<double>(total_iters);
    return base * (start + (end - start) * t);
  };
}

}  // namespace

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : ClosedFormLR("StepLR", opt, step_lr(step_size, gamma)) {}

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma)
    : ClosedFormLR("MultiStepLR", opt, multi_step_lr(std::move(milestones), gamma)) {}

ExponentialLR::ExponentialLR(Optimizer& opt, double gamma)
    : ClosedFormLR("ExponentialLR", opt,
                   [gamma](int64_t e, double base) { return base * std::pow(gamma, static_cast<double>(e)); }) {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : ClosedFormLR("CosineAnnealingLR", opt, cosine_annealing_lr(t_max, eta_min)) {}

LinearLR::LinearLR(Optimizer& opt, double start_factor, double end_factor, int64_t total_iters)
    : ClosedFormLR("LinearLR", opt, linear_lr(start_factor, end_factor, total_iters)) {}

SequentialLR::SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler("SequentialLR", opt), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  MG_CHECK(!schedulers_.empty(), ValueError, "SequentialLR: expects at least one scheduler");
  MG_CHECK(milestones_.size() + 1 == schedulers_.size(), ValueError, "SequentialLR: expected ", schedulers_.size() - 1,
           " milestones for ", schedulers_.size(), " schedulers, got ", milestones_.size());
  check_children("SequentialLR", opt, schedulers_, [](const LRScheduler& s) { return &s.opt_; });
  for (size_t i = 1; i < milestones_.size(); ++i)
    MG_CHECK(milestones_[i] > milestones_[i - 1], ValueError, "SequentialLR: milestones must be increasing, got ",
             milestones_[i - 1], " then ", milestones_[i]);
  init();
}
double SequentialLR::lr_at(int64_t e, double base) const {
  const size_t idx = std::upper_bound(milestones_.begin(), milestones_.end(), e) - milestones_.begin();
  const int64_t local = idx == 0 ? e : e - milestones_[idx - 1];
  return schedulers_[idx]->lr_at(local, base);
}

ChainedScheduler::ChainedScheduler(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler("ChainedScheduler", opt), schedulers_(std::move(schedulers)) {
  check_children("ChainedScheduler", opt, schedulers_, [](const LRScheduler& s) { return &s.opt_; });
  init();
}
double ChainedScheduler::lr_at(int64_t e, double base) const {
  double lr = base;
  for (auto& s : schedulers_) lr = s->lr_at(e, lr);
  return lr;
}

// ---------------------------------------------------------------- ReduceLROnPlateau

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& opt, PlateauOptions options) : opt_(opt), o_(std::move(options)) {
  MG_CHECK(o_.mode == "min" || o_.mode == "max", ValueError, "ReduceLROnPlateau: mode ", o_.mode,
           " is unknown (valid: min, max)");
  MG_CHECK(o_.threshold_mode == "rel" || o_.threshold_mode == "abs", ValueError, "ReduceLROnPlateau: threshold mode ",
           o_.threshold_mode, " is unknown (valid: rel, abs)");
  MG_CHECK(o_.factor < 1.0 && o_.factor >= 0.0, ValueError, "ReduceLROnPlateau: factor should be in [0, 1), got ",
           o_.factor);
  MG_CHECK(o_.patience >= 0 && o_.cooldown >= 0, ValueError, "ReduceLROnPlateau: patience (", o_.patience,
           ") and cooldown (", o_.cooldown, ") must be >= 0");
  const size_t n = opt_.param_groups().size();
  MG_CHECK(o_.min_lr.size() == 1 || o_.min_lr.size() == n, ValueError, "ReduceLROnPlateau: expected 1 or ", n,
           " min_lr values, got ", o_.min_lr.size());
  min_lrs_ = o_.min_lr.size() == 1 ? std::vector<double>(n, o_.min_lr[0]) : o_.min_lr;
  best_ = o_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  for (auto& g : opt_.param_groups()) last_lrs_.push_back(g.lr());
}

bool ReduceLROnPlateau::is_better(double a) const {
  const double t = o_.threshold;
  if (o_.mode == "min") return o_.threshold_mode == "rel" ? a < best_ * (1.0 - t) : a < best_ - t;
  return o_.threshold_mode == "rel" ? a > best_ * (t + 1.0) : a > best_ + t;
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in cooldown are ignored
  }
  auto& groups = opt_.param_groups();
  if (num_bad_epochs_ > o_.patience) {
    for (size_t i = 0; i < groups.size(); ++i) {
      const double old_lr = groups[i].lr();
      const double new_lr = std::max(old_lr * o_.factor, min_lrs_[i]);
      if (old_lr - new_lr > o_.eps) groups[i].set_lr(new_lr);
    }
    cooldown_counter_ = o_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lrs_.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) last_lrs_[i] = groups[i].lr();
  opt_.sync_device_lr();
}

StateDict ReduceLROnPlateau::state_dict() const {
  StateDict sd;
  // +-inf "best" (no metric seen yet) is not valid JSON: stored as null.
  sd.meta = {{"type", "ReduceLROnPlateau"},           {"last_epoch", last_epoch_}, {"num_bad_epochs", num_bad_epochs_},
             {"cooldown_counter", cooldown_counter_}, {"last_lrs", last_lrs_},     {"min_lrs", min_lrs_}};
  sd.meta["best"] = std::isfinite(best_) ? nlohmann::json(best_) : nlohmann::json(nullptr);
  return sd;
}

StagedLoad ReduceLROnPlateau::stage_state_dict(const StateDict& sd) {
  const std::string op = "ReduceLROnPlateau::load_state_dict";
  const auto& m = sd.meta;
  for (const char* k : {"type", "last_epoch", "num_bad_epochs", "cooldown_counter", "best", "min_lrs"})
    MG_CHECK(m.is_object() && m.contains(k), ValueError, op, ": meta lacks \"", k, "\"");
  MG_CHECK(m["type"] == "ReduceLROnPlateau", ValueError, op, ": the state was saved by a ", m["type"].dump());
  std::vector<double> min_lrs = finite_numbers(m, "min_lrs", opt_.param_groups().size(), op);
  for (double v : min_lrs) MG_CHECK(v >= 0, ValueError, op, ": min_lr ", v, " is negative");
  const int64_t last_epoch = counter_value(m, "last_epoch", op), bad = counter_value(m, "num_bad_epochs", op),
                cooldown = counter_value(m, "cooldown_counter", op);
  // +-inf "best" (no metric seen yet) is saved as null.
  MG_CHECK(m["best"].is_null() || (m["best"].is_number() && std::isfinite(m["best"].get<double>())), ValueError, op,
           ": \"best\" is ", m["best"].dump(), " (expected a finite number or null)");
  const double best = m["best"].is_null() ? (o_.mode == "min" ? std::numeric_limits<double>::infinity()
                                                              : -std::numeric_limits<double>::infinity())
                                          : m["best"].get<double>();
  return [this, min_lrs = std::move(min_lrs), last_epoch, bad, cooldown, best] {
    last_epoch_ = last_epoch;
    num_bad_epochs_ = bad;
    cooldown_counter_ = cooldown;
    min_lrs_ = min_lrs;
    best_ = best;
    last_lrs_.clear();
    for (auto& g : opt_.param_groups()) last_lrs_.push_back(g.lr());  // the lrs live in the optimizer's state
  };
}

}  // namespace mg::optim
