// ZeRO stages 1 and 2: optimizer-state and gradient sharding. The parameters are laid end to end
// in one flat index space; each rank owns 1/N of it, keeps the optimizer state (SGD momentum,
// Adam moments) for that slice only, updates that slice, then all-gathers the updated parameters.
// Stage 2 also shards the gradients: as backward finalizes the gradients of every parameter in a
// chunk (post-accumulate-grad hooks, as DDP's buckets), the chunk is reduce-scattered (averaged)
// into this rank's slice, and a parameter's full gradient is dropped once every chunk it touches
// is reduced, so the whole set of gradients never exists on a rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/state_dict.h"
#include "distributed/process_group.h"
#include "optim/optimizer.h"

namespace mg::dist {

struct ZeroOptions {
  // The flat space is cut into chunks of about this size; each chunk is split N ways, and the
  // all-gather after the step runs chunk by chunk, so its temporary is one chunk, not a model.
  double chunk_mb = 32.0;
  // false: .grad already holds the average over ranks (DDP did it), only the owned slice is
  // read. true: reduce-scatter the gradients here (average), for use without DDP.
  bool reduce_gradients = false;
  // 1: shard the optimizer state. 2: also shard the gradients during backward (each rank's own
  // gradients; not with DDP, which would all-reduce them first).
  int stage = 1;
};

// Clips gradients whose elements are split over the ranks (each element in exactly one rank's
// `local_grads`) to a global 2-norm of max_norm, as optim::clip_grad_norm_ would over the whole
// gradients (coefficient min(max_norm / (norm + 1e-6), 1)): each rank's sum of squares, one
// all-reduce. Collective; `op` names the caller in errors. Returns the norm.
double clip_sharded_grad_norm_(const std::vector<Tensor>& local_grads, ProcessGroup& pg, double max_norm,
                               const char* op);

class ZeroRedundancyOptimizer {
 public:
  // Builds the optimizer for this rank's slice; it must update elementwise (SGD, Adam, AdamW:
  // not LARS/LAMB-style per-tensor norms), e.g.
  //   [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, opts); }
  // It receives views of the parameters' own storage (one per piece of a parameter this rank
  // owns), so it updates the parameters in place: no copy of the shard is kept.
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> pieces)>;

  // params: identical on every rank (broadcast them first, as DDP does), contiguous, one dtype,
  // on the process group's device.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> pg, const Factory& make_local,
                          ZeroOptions opts = {});

  // One update of every parameter. Where a piece of a parameter has no gradient it counts as
  // zero (SGD proper skips such a parameter; with DDP every parameter has one).
  void step();
  void zero_grad(bool set_to_none = true);
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // The optimizer state of every parameter, gathered from the ranks' slices chunk by chunk into
  // the layout of one optimizer of the local type stepping all of `params` in one process (one
  // group, the local group's options): what that optimizer's load_state_dict takes, and what
  // load_full_state_dict takes at any world size and chunk size (resharding). Collective: every
  // rank calls it and gets the whole dict. Elementwise state only (SGD's momentum, Adam's
  // moments); a per-block buffer (AdamW8bit's codes) is a ValueError naming it.
  StateDict full_state_dict() const;
  // Takes this rank's slices of a full_state_dict (or of a one-process optimizer's state_dict of
  // the local type over the same parameters); the group's options come with it. Not collective.
  void load_full_state_dict(const StateDict& sd);

  // Sharded checkpoints: every rank writes its slices of the optimizer state, chunk by chunk, to
  // dir/zero-shard-<rank>-of-<N>.safetensors, and the layout (world size, chunks, each
  // parameter's shape and flat offset, the optimizer's type, options and step) goes into every
  // shard's metadata; each file is written atomically, then the ranks meet at a barrier. The
  // directory must exist. Collective.
  void save_sharded(const std::string& dir) const;
  // The whole state dict (full_state_dict's layout) from a directory save_sharded wrote at any
  // world size: every shard is read and its slices placed. A missing shard, or shards of another
  // layout, is an mg::IOError naming the file.
  static StateDict read_sharded(const std::string& dir);
  // This rank's slices from such a directory, at any world size or chunk size (resharding):
  // load_full_state_dict(read_sharded(dir)). Not collective; it holds the whole state while it
  // loads.
  void load_sharded(const std::string& dir) { load_full_state_dict(read_sharded(dir)); }

  // Stage 2: clips the gradients' global 2-norm to max_norm as optim::clip_grad_norm_ does over
  // the full gradients (coefficient min(max_norm / (norm + 1e-6), 1)), from the slices: each
  // rank's sum of squares, one all-reduce. Call between backward and step(); returns the norm.
  // Stage 1 keeps full gradients: clip those with optim::clip_grad_norm_ instead.
  double clip_grad_norm_(double max_norm);

  // Stage 2: bytes of this rank's reduced gradient slices (1/N of the gradients), and the chunks
  // reduce-scattered during backward since construction.
  int64_t shard_grad_nbytes() const;
  int64_t chunks_reduced_in_backward() const { return reduced_in_backward_; }
  size_t num_chunks() const { return chunks_.size(); }

  // The slice's optimizer: its param_groups()[0] holds lr etc. (schedulers act on it).
  optim::Optimizer& local_optimizer() { return *local_; }
  const optim::Optimizer& local_optimizer() const { return *local_; }
  // Bytes of optimizer state on this rank (about 1/N of the unsharded optimizer's).
  int64_t state_nbytes() const { return local_->state_nbytes(); }
  // Elements this rank owns (its slice of the padded flat space) and in all parameters.
  int64_t shard_numel() const { return shard_numel_; }
  int64_t total_numel() const { return total_; }

 private:
  struct Chunk {
    int64_t global_begin;  // in the flat space (padded at the end to a multiple of N)
    int64_t per_rank;      // this chunk's slice per rank
  };
  // A run of one parameter inside this rank's slice of one chunk.
  struct Piece {
    size_t param;
    int64_t param_offset;  // in the parameter's elements
    int64_t slice_offset;  // in this rank's slice of the chunk
    int64_t len;
    size_t chunk;
    Tensor view;  // the local optimizer's parameter: a view of params_[param]
  };
  // Calls fn(param index, offset in that param, offset in [begin, end), length) for every piece
  // of a parameter inside the flat range [begin, end).
  template <class F>
  void for_each_piece(int64_t begin, int64_t end, F&& fn) const;

  std::vector<Tensor> params_;
  std::vector<int64_t> offsets_;  // flat offset of each parameter
  std::shared_ptr<ProcessGroup> pg_;
  ZeroOptions opts_;
  DType dtype_ = DType::f32;
  int64_t total_ = 0;
  int64_t shard_numel_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<Piece> pieces_;
  std::unique_ptr<optim::Optimizer> local_;

  // Stage 2: each chunk's parameters, each parameter's chunks, this round's counts of
  // parameters yet to report per chunk and of unreduced chunks per parameter, and the reduced
  // slices (summed over the backwards of an accumulation).
  void on_gradient(size_t i);
  void reduce_chunk(size_t k);
  Tensor reduced_slice(size_t k) const;
  Tensor state_slice(size_t k, const std::string& name) const;
  void start_round();
  void finish_reduction();
  // The local state's buffer names ("a,b,") and the largest step, agreed over the ranks.
  std::pair<std::string, int64_t> state_layout() const;
  std::vector<std::vector<size_t>> chunk_params_, param_chunks_;
  std::vector<int64_t> waiting_, unreduced_;
  std::vector<uint8_t> reported_, reduced_;
  size_t reduced_count_ = 0;
  std::vector<Tensor> shard_grads_;
  std::vector<uint64_t> hooks_;
  int64_t reduced_in_backward_ = 0;
};

}  // namespace mg::dist
