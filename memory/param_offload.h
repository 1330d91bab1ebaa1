// Parameter offload (ZeRO-Infinity on one GPU): every parameter's f32 master and optimizer state
// live in pinned host memory and are stepped there (memory::HostParams' worker, overlapped with
// backward); the device holds a unit's parameters (a transformer block's, in bf16 where autocast
// reads them so) only while the unit runs. The mechanism is ParamUnits (autograd/param_units.h),
// the one ZeRO-3 uses; HostSource is its source over host memory:
//   fetch    waits for the parameter's update, then copies its pinned cast (or f32 master) to
//            the device on a side stream, ordered before the unit's first use;
//   reduce   hands the unit's gradient (bf16 where materialized so: half the bytes home) to the
//            worker, which casts it to f32 and updates master, moments and cast.
//
// What it saves: the device holds no model state at all between uses (no master, gradient,
// moment or cast), only the gathered units (root + 1 + prefetch blocks) and activations. What it
// costs: every block's bytes cross the host link twice a step (forward and backward), 2 bytes a
// parameter each way in bf16, plus the gradient's 2 home; the update at the host's memory
// bandwidth, overlapped with backward; the first block's fetch waits for the whole update.
#pragma once

#include <memory>
#include <vector>

#include "autograd/param_units.h"
#include "core/device_runtime.h"
#include "core/state_dict.h"
#include "memory/host_params.h"
#include "nn/models/gpt.h"
#include "optim/state_by_name.h"

namespace mg::memory {

class HostSource : public ParamSource {
 public:
  HostSource(Device device, HostOptimizerFactory make_optimizer);
  void adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) override;
  std::function<void()> fetch(size_t unit, size_t group, const Tensor& dst) override;
  void reduce(size_t unit, size_t group, Tensor grad) override;
  void end_backward() override;
  // Waits for the updates the failed step queued and starts a new round.
  void abandon_step() override;
  // The masters, their optimizer and the update worker (built at the first use, after every group
  // was adopted): its optimizer() for the learning rate and state, stats(), set_step(false) for
  // gradient accumulation.
  HostParams& host();
  // The f32 master of a unit's group (pinned; the worker steps it).
  const Tensor& master(size_t unit, size_t group) { return host().params().at(index_.at(unit).at(group)); }
  // Its index among host().params(), the host optimizer's numbering.
  size_t master_index(size_t unit, size_t group) const { return index_.at(unit).at(group); }

 private:
  Device device_;
  HostOptimizerFactory make_optimizer_;
  std::vector<Tensor> masters_;
  std::vector<DType> dtypes_;
  std::vector<std::vector<size_t>> index_;  // [unit][group] -> master
  std::unique_ptr<HostParams> host_;
  cuda::Stream stream_;  // the copies to the device
};

// Parameter offload of a whole GPT: its units (gpt_param_units) on a HostSource, Linear weights
// and biases materialized in `compute` (bf16 autocast's dtype), the root kept for the step, and
// the model's plan pointed at them (model.recompute.units). Build the model on the CPU (a model
// that does not fit the device in f32 never has to), then call this; train under autocast.
struct ParamOffload {
  std::shared_ptr<HostSource> source;
  std::unique_ptr<ParamUnits> units;
};
ParamOffload offload_gpt_params(nn::GPT& model, Device device, HostOptimizerFactory make_optimizer, int prefetch = 1,
                                DType compute = DType::bf16);

// Checkpoints of parameter offload, in the model's own layout, by parameter name. The model's
// parameters own no storage between uses (reading one is a ValueError); their values are the
// source's f32 masters, one flat tensor a unit group, stepped by the host optimizer
// (po.source->host().optimizer()), whose state has one entry a master. Each call first waits
// for the queued updates.
//   model_state_dict          every parameter's values sliced from its master (f32 copies in
//                             host memory) under its Module::named_parameters() name: what the
//                             device-resident model's state_dict() holds, so either mode loads it.
//   load_model_state_dict     the inverse, from a state dict saved in either mode: every name
//                             checked (present, the parameter's shape, floating) before any
//                             master changes; the next fetch casts the loaded values again.
//   optimizer_named_state     the host optimizer's state with each master's buffers sliced into
//                             its parameters: the state one optimizer of its type over the
//                             model's parameters would hold, by name, for optim::merge_state_dicts
//                             to lay out for any optimizer over the model (a device-resident one).
//                             Per-element state only (AdamW's moments, SGD's momentum): 8-bit
//                             moments are quantized in blocks that span a unit's parameters, a
//                             ValueError naming the buffer (they resume in this mode through
//                             po.source->host().state_dict()).
//   load_optimizer_named_state  the inverse: state saved by name in any layout (a resident
//                             optimizer's optim::named_state) gathered into the masters' layout and
//                             loaded into the host optimizer (its own checks apply).
// The same mode also resumes bit for bit from model_state_dict and host().state_dict() (the
// masters' layout as it is).
StateDict model_state_dict(ParamOffload& po, const nn::Module& model);
void load_model_state_dict(ParamOffload& po, const nn::Module& model, const StateDict& sd);
optim::NamedState optimizer_named_state(ParamOffload& po, const nn::Module& model);
void load_optimizer_named_state(ParamOffload& po, const nn::Module& model, const optim::NamedState& saved);

}  // namespace mg::memory
