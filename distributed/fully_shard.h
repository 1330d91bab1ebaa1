// ZeRO-3 / FSDP: every rank stores 1/N of every parameter. The mechanism is ParamUnits
// (autograd/param_units.h: a unit's parameters are on the device only while it runs); this file
// is its source over a process group. A unit's group of parameters is a flat [padded] space cut
// N ways; rank r keeps elements [r n, (r+1) n) as its f32 master shard, which its optimizer
// steps (any elementwise optimizer: SGD, Adam, AdamW). Gathering the unit is an all-gather of
// the shards (of their casts, where the group is materialized in bf16: FSDP2's
// MixedPrecisionPolicy(param_dtype=bf16)); its gradient is reduce-scattered (averaged, in f32)
// into the shard's .grad, added to what earlier backwards left (gradient accumulation). A full
// gradient exists only for the unit whose backward just finished, and only until its
// reduce-scatter has run.
//
//   auto pg = dist::init_process_group();
//   auto fsdp = dist::fully_shard(nn::gpt_param_units(model), pg);   // or any units
//   model.recompute.units = fsdp.units.get();                       // GPT runs unit by unit
//   optim::AdamW opt(fsdp.source->shards(), ao);
//   loss.backward(); fsdp.source->clip_grad_norm_(1.0); opt.step(); opt.zero_grad();
//
// Bytes per parameter on a rank (f32 AdamW): (4 master + 4 gradient + 8 moments) / N, plus the
// gathered units (2 bytes a parameter in bf16) and one unit's full gradient while it reduces.
// With FullyShardOptions::offload_to_host the (4 + 4 + 8) / N live in host memory instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/param_units.h"
#include "core/state_dict.h"
#include "distributed/process_group.h"

namespace mg::nn {
class Module;
}
namespace mg::optim {
class Optimizer;
}

namespace mg::dist {

class ShardSource : public ParamSource {
 public:
  // host_shards: the f32 master shards (and so their gradients and the optimizer's state, which
  // follow the tensors it steps) live in host memory, pinned on a CUDA group; see
  // FullyShardOptions::offload_to_host.
  explicit ShardSource(std::shared_ptr<ProcessGroup> pg, int max_reductions_in_flight = 2, bool host_shards = false);
  int64_t pad_multiple() const override { return pg_->size(); }
  void adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) override;
  std::function<void()> fetch(size_t unit, size_t group, const Tensor& dst) override;
  void reduce(size_t unit, size_t group, Tensor grad) override;
  void end_backward() override;
  // Waits for the reductions in flight and drops them: the shards' gradients keep what earlier
  // steps left.
  void abandon_step() override;

  // This rank's master shards (leaves that require grad, one per unit group, in unit order):
  // the optimizer's parameters.
  std::vector<Tensor> shards() const;
  const Tensor& shard(size_t unit, size_t group) const { return shards_.at(unit).at(group); }
  // Clips the global 2-norm of the gradients to max_norm as optim::clip_grad_norm_ does over the
  // full gradients (coefficient min(max_norm / (norm + 1e-6), 1)), from the shards: each rank's
  // sum of squares, one all-reduce. Collective. Returns the norm.
  double clip_grad_norm_(double max_norm);
  // Reduce-scatters issued during backward since construction.
  int64_t reductions() const { return reductions_; }
  ProcessGroup& process_group() { return *pg_; }
  // Where the master shards live: host memory with host_shards, else the group's device.
  Device shard_device() const { return host_shards_ ? Device::cpu() : pg_->device(); }

 private:
  struct Pending {
    WorkPtr work;
    Tensor out, in;
    size_t unit, group;
  };
  void complete(Pending& p);
  std::shared_ptr<ProcessGroup> pg_;
  int max_in_flight_;
  bool host_shards_;
  std::vector<std::vector<Tensor>> shards_;
  std::vector<Pending> pending_;
  int64_t reductions_ = 0;
};

struct FullyShardOptions {
  int prefetch = 1;                                 // ParamUnitsOptions::prefetch
  std::vector<size_t> keep = {0};                   // the root unit stays gathered for the step
  std::function<DType(const Tensor& param)> dtype;  // ParamUnitsOptions::dtype (empty: f32)
  // ZeRO-3 with its shards in host memory (FSDP2's CPUOffloadPolicy, ZeRO-Infinity's sharded
  // offload): each rank's f32 master shards, their gradients and the optimizer's state (build the
  // optimizer over source->shards(): it steps them on the host) live in pinned host memory. A
  // gather copies the shard to the device, casts it there and all-gathers; a reduce-scatter's
  // result comes home and is added to the shard's gradient. The device holds no model state
  // between uses, only the gathered units. Costs: the shard crosses the host link twice a step
  // (4 bytes a parameter / N each way, f32) and its gradient once, and the update runs at the
  // host's speed after backward.
  bool offload_to_host = false;
};

struct FullyShardedModel {
  std::shared_ptr<ShardSource> source;
  std::unique_ptr<ParamUnits> units;
  // The full value of every parameter, named as `model` names it, gathered from the shards in
  // the masters' dtype. Collective.
  StateDict full_state_dict(const nn::Module& model) const;
  // Takes this rank's shards of a full state dict (any world size saved it; names as `model`
  // names its parameters); a missing name or a wrong shape is an mg::ValueError naming it. Not
  // collective.
  void load_full_state_dict(const nn::Module& model, const StateDict& sd);

  // The optimizer's state (`opt` steps source->shards(), one group, elementwise state: SGD's
  // momentum, Adam's moments) as one optimizer of the same type over model.parameters() would
  // hold it: "state.<i>.<buffer>" shaped as parameter i, meta "param_names" naming each i.
  // Collective. Every parameter of `model` must be in a unit (ValueError naming it otherwise).
  StateDict full_optimizer_state_dict(const nn::Module& model, const optim::Optimizer& opt) const;
  // Takes this rank's slices of such a dict (any world size saved it; with "param_names" the
  // parameters are matched by name, else by position). Not collective.
  void load_full_optimizer_state_dict(const nn::Module& model, optim::Optimizer& opt, const StateDict& sd);

  // Sharded checkpoints. Every rank writes its master shards and `opt`'s state for them to
  // dir/fsdp-shard-<rank>-of-<N>.safetensors; then, after a barrier, rank 0 writes
  // dir/fsdp-index.json: the world size, each parameter's name, shape, group and flat offset,
  // each group's padded length, and the save's id, which every shard also carries. Each file is
  // written atomically and the index last: a directory whose index is there holds a whole save,
  // and shards left by an earlier or interrupted save are told apart by their id. The directory
  // must exist. Collective.
  void save_sharded(const nn::Module& model, const optim::Optimizer& opt, const std::string& dir) const;
  // This rank's shards and optimizer state from a directory save_sharded wrote at any world size
  // (resharding): read_fsdp_checkpoint, then load_full_state_dict and
  // load_full_optimizer_state_dict. Not collective; it holds the whole state while it loads.
  void load_sharded(const nn::Module& model, optim::Optimizer& opt, const std::string& dir);
};

// A whole training state read back from a sharded checkpoint: the parameters by name (what
// model.load_state_dict takes) and the optimizer state as one optimizer of the saved type over
// model.parameters() holds it (what its load_state_dict takes): resharding to any world size,
// or back into one process without ZeRO.
struct FullCheckpoint {
  StateDict model;
  StateDict optimizer;
};
// Reads every shard that dir/fsdp-index.json names. A missing index, a missing shard, a shard of
// another save or layout, is an mg::IOError naming the file (and the rank).
FullCheckpoint read_fsdp_checkpoint(const std::string& dir);

// Shards `units` (their parameters, identical on every rank: broadcast first) over `pg`.
FullyShardedModel fully_shard(std::vector<std::vector<Tensor>> units, std::shared_ptr<ProcessGroup> pg,
                              FullyShardOptions opts = {});

}  // namespace mg::dist
