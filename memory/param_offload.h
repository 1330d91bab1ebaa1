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
#include "memory/host_params.h"
#include "nn/models/gpt.h"

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

}  // namespace mg::memory
