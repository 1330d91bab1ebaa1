// GradScaler: dynamic loss scaling for f16 training (PyTorch's torch.amp.GradScaler). Scales
// the loss so small gradients survive f16, unscales them with one fused kernel, skips steps
// whose gradients overflowed and adapts the scale.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mg::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
  bool enabled = true;             // false: every method is a pass-through (f32/bf16 runs)
  // The scale, the clean-step count and the overflow flags in device memory, updated by kernels
  // (torch._amp_update_scale_): scale(), unscale_(), step() and update() read nothing back to
  // the host and can run inside a CUDA graph. step() then needs a capturable optimizer, which
  // skips itself on the device, and returns true for "queued". The first scale() makes the
  // device state on the loss's device (outside a capture); get_scale() and the counters read it.
  bool capturable = false;
};

// The usual step:
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);                  // optional: only to clip / inspect true gradients
//   clip_grad_norm_(params, 1.0);
//   scaler.step(opt);                      // skipped when a gradient is inf/NaN
//   scaler.update();
// Gradients are unscaled and checked by kernels::amp_unscale_, one multi-tensor launch per
// 64 gradients with no host read; step() then reads the overflow flag once (one read per
// device the optimizer's gradients live on: one on a single GPU).
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (differentiable). Pass-through when disabled.
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of `opt`'s parameters by the scale, in place, and records
  // whether any is inf/NaN. Idempotent until update(): a second call (or the one inside
  // step()) does nothing, so gradients can be clipped between unscale_ and step.
  void unscale_(Optimizer& opt);
  // Unscales if not done yet, then runs opt.step() unless a gradient was inf/NaN. Returns
  // whether the optimizer stepped. Calling it twice for one optimizer before update() is a
  // ValueError.
  bool step(Optimizer& opt);
  // Adjusts the scale from this iteration's overflow checks (backoff on overflow, growth
  // after growth_interval clean steps) and resets the per-optimizer records. A ValueError
  // when neither unscale_ nor step ran since the last update.
  void update();
  // Sets the scale outright (e.g. after a restart); also resets the per-optimizer records.
  void update(double new_scale);

  double get_scale() const;
  int64_t growth_tracker() const;
  bool is_enabled() const { return enabled_; }
  const GradScalerOptions& options() const { return opts_; }
  // Steps skipped because of inf/NaN gradients since construction (reporting).
  int64_t skipped_steps() const;

  // PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker
  // (in meta; no tensors). load_state_dict checks them: ValueError naming a bad entry.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd) { stage_state_dict(sd)(); }
  // The checking half of load_state_dict; the returned function commits (core/state_dict.h).
  StagedLoad stage_state_dict(const StateDict& sd);

 private:
  struct PerOptimizer {
    bool unscaled = false;
    bool stepped = false;
    bool found_inf = false;               // read once, at step()
    std::map<std::string, Tensor> flags;  // device -> one-element f32 overflow flag
  };
  bool read_found_inf(PerOptimizer& st);
  // The capturable state: made on `dev` from the host values on first use.
  struct DeviceState {
    Tensor scale;                                  // f32 [1]
    Tensor growth_tracker;                         // i64 [1]
    Tensor skipped;                                // i64 [1]
    std::map<const Optimizer*, Tensor> found_inf;  // f32 [1], zeroed by each unscale_
  };
  DeviceState& device_state(const Device& dev);
  void write_device_state();
  void unscale_on_device(Optimizer& opt, PerOptimizer& st);

  GradScalerOptions opts_;
  bool enabled_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
  std::map<const Optimizer*, PerOptimizer> per_opt_;
  std::unique_ptr<DeviceState> dev_;
};

}  // namespace mg::optim
