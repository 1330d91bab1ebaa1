#include "optim/grad_scaler.h"

#include <cmath>
#include <vector>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "core/device_runtime.h"
#include "kernels/amp.h"
#include "kernels/ops.h"

namespace mg::optim {

GradScaler::GradScaler(GradScalerOptions o) : opts_(o), enabled_(o.enabled), scale_(o.init_scale) {
  MG_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, ValueError,
           "GradScaler: init_scale must be finite and > 0, got ", o.init_scale);
  MG_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1.0, ValueError,
           "GradScaler: growth_factor must be > 1, got ", o.growth_factor);
  MG_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, ValueError,
           "GradScaler: backoff_factor must be in (0, 1), got ", o.backoff_factor);
  MG_CHECK(o.growth_interval > 0, ValueError, "GradScaler: growth_interval must be > 0, got ", o.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  MG_CHECK(loss.defined(), ValueError, "GradScaler::scale: undefined loss");
  if (!enabled_) return loss;
  MG_CHECK(is_floating(loss.dtype()), DTypeError, "GradScaler::scale: the loss must be floating, got ", loss.dtype());
  if (opts_.capturable) {
    // The scale as a 0-d view, so the scaled loss keeps the loss's shape.
    const Tensor s = const_cast<GradScaler*>(this)->device_state(loss.device()).scale;
    return mul(loss, loss.dim() == 0 ? s.view({}) : s);
  }
  return mul(loss, scale_);
}

GradScaler::DeviceState& GradScaler::device_state(const Device& dev) {
  if (dev_) {
    MG_CHECK(dev_->scale.device() == dev, DeviceError, "GradScaler(capturable): its state lives on ",
             dev_->scale.device(), ", got a loss or gradients on ", dev, " (one device per capturable scaler)");
    return *dev_;
  }
  MG_CHECK(!dev.is_cuda() || !cuda::is_capturing(dev.index), ValueError,
           "GradScaler(capturable): the device state is made by the first scale(), which must run before a "
           "CUDA graph capture (a warm-up step)");
  dev_ = std::make_unique<DeviceState>();
  dev_->scale = empty({1}, {DType::f32, dev});
  dev_->growth_tracker = empty({1}, {DType::i64, dev});
  dev_->skipped = empty({1}, {DType::i64, dev});
  write_device_state();
  return *dev_;
}

void GradScaler::write_device_state() {
  if (!dev_) return;
  raw::fill_(dev_->scale, scale_);
  raw::fill_(dev_->growth_tracker, static_cast<double>(growth_tracker_));
  raw::fill_(dev_->skipped, static_cast<double>(skipped_));
}

double GradScaler::get_scale() const {
  if (!enabled_) return 1.0;
  return dev_ ? raw::to_device(dev_->scale, Device::cpu()).item() : scale_;
}
int64_t GradScaler::growth_tracker() const {
  return dev_ ? static_cast<int64_t>(raw::to_device(dev_->growth_tracker, Device::cpu()).item()) : growth_tracker_;
}
int64_t GradScaler::skipped_steps() const {
  return dev_ ? static_cast<int64_t>(raw::to_device(dev_->skipped, Device::cpu()).item()) : skipped_;
}

void GradScaler::unscale_on_device(Optimizer& opt, PerOptimizer& st) {
  std::vector<Tensor> grads;
  for (const ParamGroup& g : opt.param_groups())
    for (const Tensor& p : g.params)
      if (p.grad().defined()) grads.push_back(p.grad());
  MG_CHECK(!grads.empty(), ValueError, "GradScaler::unscale_(capturable): the optimizer has no gradients");
  DeviceState& d = device_state(grads.front().device());
  Tensor& flag = d.found_inf[&opt];
  if (!flag.defined()) {
    MG_CHECK(!cuda::is_capturing(grads.front().device().index), ValueError,
             "GradScaler::unscale_(capturable): first unscale of an optimizer inside a CUDA graph capture; run one "
             "eager step first");
    flag = empty({1}, {DType::f32, grads.front().device()});
  }
  raw::fill_(flag, 0.0);  // a memset: part of the captured step, so every replay starts clean
  kernels::amp_unscale_(grads, flag, d.scale);
  st.unscaled = true;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!enabled_) return;
  PerOptimizer& st = per_opt_[&opt];
  MG_CHECK(!st.stepped, ValueError,
           "GradScaler::unscale_: step() already ran for this optimizer since the last update()");
  if (st.unscaled) return;
  NoGradGuard ng;
  if (opts_.capturable) return unscale_on_device(opt, st);
  // One list per device: each gets its flag and its launches.
  std::map<std::string, std::vector<Tensor>> grads;
  for (const ParamGroup& g : opt.param_groups())
    for (const Tensor& p : g.params) {
      Tensor gr = p.grad();
      if (gr.defined()) grads[gr.device().str()].push_back(gr);
    }
  const double inv_scale = 1.0 / scale_;
  for (auto& [dev, list] : grads) {
    Tensor flag = zeros({1}, {DType::f32, list.front().device()});
    kernels::amp_unscale_(list, flag, inv_scale);
    st.flags[dev] = flag;
  }
  st.unscaled = true;
}

bool GradScaler::read_found_inf(PerOptimizer& st) {
  bool found = false;
  for (auto& [dev, flag] : st.flags) found |= flag.item() != 0.0;  // the step's one host read (per device)
  st.flags.clear();
  return found;
}

bool GradScaler::step(Optimizer& opt) {
  if (!enabled_) {
    opt.step();
    return true;
  }
  unscale_(opt);
  PerOptimizer& st = per_opt_[&opt];
  MG_CHECK(!st.stepped, ValueError, "GradScaler::step: already called for this optimizer since the last update()");
  if (opts_.capturable) {
    MG_CHECK(opt.capturable(), ValueError,
             "GradScaler::step(capturable): the optimizer must be capturable too (options .capturable = true) so "
             "it can skip the step on the device");
    opt.step_unless(dev_->found_inf.at(&opt));
    st.stepped = true;
    return true;  // queued; skipped on the device on overflow
  }
  MG_CHECK(!cuda::is_capturing(), ValueError,
           "GradScaler::step inside a CUDA graph capture reads the overflow flag on the host; construct the scaler "
           "with GradScalerOptions{.capturable = true} and a capturable optimizer");
  st.found_inf = read_found_inf(st);
  st.stepped = true;
  if (st.found_inf) {
    ++skipped_;
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!enabled_) return;
  MG_CHECK(!per_opt_.empty(), ValueError,
           "GradScaler::update: no inf/NaN checks were recorded since the last update() (call unscale_ or step first)");
  if (opts_.capturable) {
    // One flag for all optimizers of this iteration: their sum is nonzero when any overflowed.
    Tensor found;
    for (auto& [opt, st] : per_opt_) {
      const Tensor& f = dev_->found_inf.at(opt);
      found = found.defined() ? kernels::add(found, f) : f;
    }
    per_opt_.clear();
    kernels::amp_update_scale_(dev_->scale, dev_->growth_tracker, dev_->skipped, found, opts_.growth_factor,
                               opts_.backoff_factor, opts_.growth_interval);
    return;
  }
  bool found = false;
  for (auto& [opt, st] : per_opt_) {
    if (!st.stepped) st.found_inf = read_found_inf(st);  // unscale_ without step: still counts
    found |= st.found_inf;
  }
  per_opt_.clear();
  if (found) {
    scale_ *= opts_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == opts_.growth_interval) {
    const double grown = scale_ * opts_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // never grow into inf (PyTorch's rule)
    growth_tracker_ = 0;
  }
}

void GradScaler::update(double new_scale) {
  if (!enabled_) return;
  MG_CHECK(std::isfinite(new_scale) && new_scale > 0, ValueError,
           "GradScaler::update: new scale must be finite and > 0, got ", new_scale);
  per_opt_.clear();
  scale_ = new_scale;
  if (dev_) raw::fill_(dev_->scale, new_scale);
}

StateDict GradScaler::state_dict() const {
  StateDict sd;
  if (!enabled_) return sd;  // PyTorch saves nothing for a disabled scaler
  sd.meta = {{"scale", get_scale()},
             {"growth_factor", opts_.growth_factor},
             {"backoff_factor", opts_.backoff_factor},
             {"growth_interval", opts_.growth_interval},
             {"_growth_tracker", growth_tracker()}};
  return sd;
}

StagedLoad GradScaler::stage_state_dict(const StateDict& sd) {
  if (!enabled_) return [] {};
  MG_CHECK(!sd.meta.empty(), ValueError,
           "GradScaler::load_state_dict: the state dict is empty (saved from a disabled scaler?)");
  auto num = [&](const char* key) {
    MG_CHECK(sd.meta.contains(key) && sd.meta[key].is_number(), ValueError,
             "GradScaler::load_state_dict: missing or non-numeric entry '", key, "'");
    return sd.meta[key].get<double>();
  };
  const double s = num("scale"), gf = num("growth_factor"), bf = num("backoff_factor");
  const double gi = num("growth_interval"), gt = num("_growth_tracker");
  MG_CHECK(std::isfinite(s) && s > 0, ValueError, "GradScaler::load_state_dict: scale must be finite and > 0, got ", s);
  MG_CHECK(std::isfinite(gf) && gf > 1.0 && bf > 0.0 && bf < 1.0 && gi >= 1 && gi < 0x1p62 && gi == std::floor(gi) &&
               gt >= 0 && gt < gi && gt == std::floor(gt),
           ValueError, "GradScaler::load_state_dict: inconsistent entries growth_factor=", gf, " backoff_factor=", bf,
           " growth_interval=", gi, " _growth_tracker=", gt);
  return [this, s, gf, bf, gi, gt] {
    scale_ = s;
    opts_.growth_factor = gf;
    opts_.backoff_factor = bf;
    opts_.growth_interval = static_cast<int64_t>(gi);
    growth_tracker_ = static_cast<int64_t>(gt);
    per_opt_.clear();
    if (dev_) {
      skipped_ = skipped_steps();
      write_device_state();
    }
  };
}

}  // namespace mg::optim
