// Parameters that live elsewhere between uses: the one mechanism under ZeRO-3 (each rank keeps
// a shard, distributed/fully_shard.h) and parameter offload (the master lives in host memory,
// memory/param_offload.h). A model's parameters are split into units (a transformer block's,
// the embeddings and head as the root); a unit's parameters are on the device only while the
// unit runs, and a ParamSource says where their values come from and where their gradients go.
//
//   forward   enter(u)    gathers unit u (the source's fetch into the unit's device storage;
//                         started early by the unit before it: `prefetch`), then starts
//                         gathering the next units;
//             leave(u, y) releases u's storage and returns y through a boundary node whose
//                         backward is the unit's pre-backward hook.
//   backward  at u's boundary, u is gathered again (already started by the unit after it) and
//             the unit before u starts; ops that saved u's parameters read the same storages,
//             filled again. As soon as every parameter of u has its gradient (gradient sinks,
//             autograd/node.h) the unit's gradients go to the source (reduce) and its storage is
//             released; when the whole backward ends (autograd::queue_callback) the rest follows.
//
// Storage: a unit's parameters of one dtype lie end to end in one flat storage (a UnitGroup):
// one fetch, one reduction, one allocation a group. The module's parameter tensors keep their
// identity (they are views of the group's storage, autograd leaves as before) but own no memory
// between uses: reading one then is a ValueError naming it (core/tensor.h, release_storage).
// A parameter may be materialized in a narrower dtype than its f32 master (bf16 for a Linear
// under bf16 autocast: ParamUnitsOptions::dtype): what autocast would have cast it to, so the
// forward is bitwise that of the f32 parameter under autocast, and the gradient too: the
// parameter's sink takes it in the master's dtype, so a GEMM writes a bf16 weight's gradient in
// f32 as it does for an f32 weight's autocast cast (set_gradient_sink's grad_dtype).
//
// What it saves: a unit's parameters cost the device their materialized bytes only while it is
// gathered; at most 1 + prefetch units (plus the kept ones) at a time, counted under
// MemoryCategory::Gathered. What it costs: every unit's fetch twice a step (forward and
// backward), hidden behind the unit before it where the source is fast enough.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mg {

// One dtype's parameters of a unit, end to end in one storage on the device.
struct UnitGroup {
  DType dtype = DType::f32;         // materialized (what the module reads)
  DType master_dtype = DType::f32;  // the parameters' own (the source's masters)
  int64_t numel = 0;                // the parameters' elements
  int64_t padded = 0;               // numel rounded up to the source's pad_multiple()
  Tensor flat;                      // [padded] over the group's storage (released between uses)
  std::vector<Tensor> params;
  std::vector<int64_t> offsets;  // each parameter's first element in flat
};

// Where a unit's values come from and where its gradients go.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // The padded length of every group is a multiple of this (a shard source: its world size).
  virtual int64_t pad_multiple() const { return 1; }
  // Once per group, at setup: the group's values end to end in its master dtype, zero padded ([padded], on the
  // parameters' device or the CPU); the source keeps what it needs (a shard, a host master).
  virtual void adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) = 0;
  // Starts writing the group's values, in its dtype, into `dst` ([padded], on the device),
  // ordered after the work already issued on the calling thread's current stream. The returned
  // function makes them ready for what that thread issues next (a stream wait, or a block).
  virtual std::function<void()> fetch(size_t unit, size_t group, const Tensor& dst) = 0;
  // One backward's gradient of the group ([padded], in the master dtype, on the device; zero
  // where a parameter got none). The source owns it from here.
  virtual void reduce(size_t unit, size_t group, Tensor grad) = 0;
  // The first gather of a step's forward, and the end of a backward (after every reduce).
  virtual void begin_step() {}
  virtual void end_backward() {}
  // A step that threw (ParamUnits::abandon_step): forget what it reduced and start clean.
  virtual void abandon_step() {}
};

struct ParamUnitsOptions {
  Device device;     // where units are gathered
  int prefetch = 1;  // units gathered ahead of the one running, forward and backward (0: none)
  // Units kept gathered from their first use until the end of the backward (the root: the
  // embeddings and the head, read at the forward's start and its end).
  std::vector<size_t> keep;
  // The dtype a parameter is materialized in (its master keeps its own); empty: its own.
  std::function<DType(const Tensor& param)> dtype;
};

class ParamUnits {
 public:
  // units[u]: the parameters of unit u (distinct floating leaves, contiguous, on one device or
  // the CPU, each in one unit; a group's of one dtype). Hands each group's values to `source`, then turns every
  // parameter into a view of its group's storage, released. Build optimizers on the source's tensors (its shards or
  // masters), not on these. A ValueError names a parameter that does not qualify.
  ParamUnits(std::vector<std::vector<Tensor>> units, std::shared_ptr<ParamSource> source, ParamUnitsOptions opts);
  ~ParamUnits();
  ParamUnits(const ParamUnits&) = delete;
  ParamUnits& operator=(const ParamUnits&) = delete;

  // Before unit u's forward: gathers it and starts the next ones.
  void enter(size_t u);
  // After it: releases u (unless kept) and returns `outputs` through u's boundary (when grad
  // mode records). Inside a backward (a checkpoint's replay) both leave the unit as it is.
  std::vector<Tensor> leave(size_t u, const std::vector<Tensor>& outputs);
  // enter(u), fn(x), leave(u, ...): one unit's forward.
  Tensor run(size_t u, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);
  // Releases every gathered unit (after a forward that had no backward).
  void release_all();
  // After a step that threw (an out-of-memory error mid-forward or mid-backward): drops the
  // gradients gathered so far, releases every unit and tells the source
  // (ParamSource::abandon_step), so that the next step starts as if the failed one never ran.
  void abandon_step();
  // Gathers every unit, calls fn, releases them (reading or writing the parameters as a whole:
  // a state dict).
  void with_all_gathered(const std::function<void()>& fn);

  size_t size() const { return units_.size(); }
  const std::vector<UnitGroup>& groups(size_t u) const { return units_.at(u).groups; }
  ParamSource& source() { return *source_; }
  int64_t unit_bytes(size_t u) const;  // materialized bytes of unit u

  struct Stats {
    int64_t gathers = 0, reductions = 0;
    int64_t gathered_units = 0, peak_gathered_units = 0;  // not counting kept units
    int64_t gathered_bytes = 0, peak_gathered_bytes = 0;  // all gathered units
    double wait_ms = 0.0;                                 // the host's time in fetch waits
  };
  Stats stats() const { return stats_; }
  void reset_peaks();

 private:
  enum class State { Released, Fetching, Ready };
  struct Unit {
    std::vector<UnitGroup> groups;
    State state = State::Released;
    bool kept = false;
    std::vector<std::function<void()>> waiters;
    std::vector<Tensor> grads;  // per group, this backward's (allocated at the first gradient)
    int64_t trainable = 0, arrived = 0;
    std::vector<uint8_t> got;  // per parameter of the unit (in group order)
  };
  void start_gather(size_t u);
  void drain(Unit& un);  // runs (and drops) the unit's fetch waiters
  void gather(size_t u);
  void release(size_t u);
  void pre_backward(size_t u);
  void on_gradient(size_t u, size_t group, size_t k, const Tensor& g);
  void finish_unit(size_t u);
  void end_backward();
  void ensure_callback();
  void prefetch_after(size_t u, int direction);
  std::vector<size_t> order_;          // units in the order the last forward entered them
  std::vector<size_t> current_order_;  // this forward's so far
  std::vector<Unit> units_;
  std::shared_ptr<ParamSource> source_;
  ParamUnitsOptions opts_;
  bool in_step_ = false;
  bool callback_queued_ = false;
  Stats stats_;
};

}  // namespace mg
