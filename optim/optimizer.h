// Optimizer base: parameter groups with their own hyper-parameters (falling back to the
// optimizer's defaults), lazily created per-parameter state, zero_grad() and step().
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "kernels/types.h"

namespace mg::optim {

// One group of parameters and the options that differ from the optimizer's defaults, e.g.
// {backbone->parameters(), {{"lr", 1e-5}}}. After the optimizer adopts the group, `options`
// holds every option (the defaults filled in), so schedulers can read and set "lr".
struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;

  double get(const std::string& key) const;  // mg::ValueError when absent
  void set(const std::string& key, double value) { options[key] = value; }
  double lr() const { return get("lr"); }
  void set_lr(double lr) { set("lr", lr); }
};

// Per-parameter state (momentum buffers, Adam moments) and a step count. A capturable
// optimizer keeps the count in device memory (step_count, i64 [1], advanced by the update
// kernel so replayed steps count); `step` then holds the value it started from.
struct ParamState {
  std::map<std::string, Tensor> buffers;
  int64_t step = 0;
  Tensor step_count;
  int64_t step_value() const;  // step_count's value (a host read) when defined, else step
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (under NoGradGuard, in place).
  virtual void step() = 0;

  // Capturable optimizers (PyTorch's capturable=True) can run inside a CUDA graph: the lr of
  // each group and Adam's step counts live in device memory, the update kernels read them when
  // they run, and nothing is read back to the host. Every parameter must take the fused
  // multi-tensor path (f32, contiguous); a step inside a capture needs the state made by one
  // eager step first (CapturedStep's warm-up).
  bool capturable() const { return capturable_; }
  // Writes every group's lr into its device copy where it changed since the last write, on
  // the current stream. Schedulers call it after setting lrs; call it after setting an lr by
  // hand between replays of a captured step. Eager steps call it themselves. No-op while
  // capturing and for an optimizer that is not capturable.
  void sync_device_lr();
  // step(), skipped on the device when found_inf[0] != 0 (f32 [1], the parameters' device): the
  // GradScaler's step with no host read. Needs a capturable optimizer (ValueError otherwise).
  void step_unless(const Tensor& found_inf);
  // Drops (set_to_none, PyTorch's default) or zero-fills every parameter's .grad.
  void zero_grad(bool set_to_none = true);

  // Adds a group; missing options take the defaults. A parameter may be in only one group.
  void add_param_group(ParamGroup group);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const std::map<std::string, double>& defaults() const { return defaults_; }

  // The state of `p`, or null if the optimizer has not created it yet (state is lazy:
  // the first step() that sees a gradient for p creates it).
  const ParamState* state(const Tensor& p) const;
  size_t state_size() const { return state_.size(); }
  // Bytes held by all state buffers (what MemoryCategory::OptimizerState counts).
  int64_t state_nbytes() const;

  // torch.optim's layout: parameters are numbered 0, 1, ... across the groups in order;
  // tensors "state.<i>.<buffer>" alias the live buffers (serialize before the next step());
  // meta {"type": name, "param_groups": [{<options>, "params": [i, ...]}, ...],
  //       "state": {"<i>": {"step": n}, ...}}. Options are doubles, written round-trip exact.
  StateDict state_dict() const;
  // Restores every group's options and the per-parameter state (buffers copied onto each
  // parameter's device, in the dtype the optimizer keeps them in, under
  // MemoryCategory::OptimizerState), so the next step() continues bit-identically. Checked
  // before anything changes: the type, group sizes, every option (the optimizer's own ranges),
  // each state's step (an integer >= 0) and buffers (exactly the names the optimizer uses for
  // the group's options, floating, the parameter's shape, finite, and >= 0 where a square is
  // kept). A problem is a ValueError (ShapeError for a shape) naming the group or parameter
  // index, the buffer and the values, and leaves this optimizer unchanged.
  void load_state_dict(const StateDict& sd) { stage_state_dict(sd)(); }
  // The checking and copying half of load_state_dict; the returned function commits.
  StagedLoad stage_state_dict(const StateDict& sd);

 protected:
  // `defaults` lists every option the optimizer knows; a group naming any other key is a
  // ValueError (a typo like "learning_rate" should not silently use the default).
  Optimizer(std::string name, std::map<std::string, double> defaults);
  // Checks one fully-populated group's options (ranges, combinations); throws ValueError.
  virtual void validate(const ParamGroup& group) const = 0;
  // The state buffers a parameter of a group with `options` holds after a step: each name,
  // whether it must be present (or only may be, e.g. left over from an option since turned
  // off), and whether its values are >= 0 (running squares). All kept in `dtype` and the
  // parameter's shape, unless the buffer names its own (8-bit state: u8 codes and a scale per block).
  struct BufferSpec {
    std::string name;
    bool required = true;
    bool nonnegative = false;
    std::optional<DType> dtype = std::nullopt;
    std::optional<Shape> shape = std::nullopt;
  };
  struct StateSpec {
    std::vector<BufferSpec> buffers;
    DType dtype = DType::f32;
  };
  virtual StateSpec state_spec(const std::map<std::string, double>& options, const Tensor& param) const = 0;
  // A state dict saved by another optimizer type (`saved_type`) converted into this one's layout,
  // when this optimizer knows how (AdamW's f32 moments and AdamW8bit's codes); nullopt otherwise,
  // and loading it is then refused naming both types.
  virtual std::optional<StateDict> converted_state_dict(const StateDict& sd, const std::string& saved_type) const {
    (void)sd;
    (void)saved_type;
    return std::nullopt;
  }
  // Creates the state on first use. Call under MemoryCategoryGuard(OptimizerState). Creating
  // it inside a CUDA graph capture is a ValueError (the graph would reset it on every replay).
  ParamState& state_for(const Tensor& p);
  const std::string& name() const { return name_; }

  // For a capturable step of group `gi` on `dev`: the device lr (sync_device_lr's copy) and
  // the skip flag of step_unless (undefined outside it). Checks that `p` and its gradient can
  // take the fused path, naming the parameter otherwise.
  kernels::DeviceScalars device_scalars(size_t gi, const Device& dev);
  void check_capturable(const Tensor& p, const Tensor& grad, size_t gi, size_t index) const;
  // Capturable Adam: the parameter's device step count, made from st.step on first use.
  Tensor& step_count_for(const Tensor& p, ParamState& st);

  bool capturable_ = false;

 private:
  struct DeviceLr {
    Tensor lr;  // f64 [1]
    double written = 0;
  };
  std::map<std::pair<size_t, std::string>, DeviceLr> device_lr_;  // (group, device)
  Tensor found_inf_;
  std::string name_;
  std::map<std::string, double> defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

// A parameter's key in a state dict's "state" (Optimizer::state_dict): its index in decimal,
// nothing else ("01", "1x", "-1" are not). False for anything else.
bool parse_state_index(const std::string& key, size_t* out);

}  // namespace mg::optim
