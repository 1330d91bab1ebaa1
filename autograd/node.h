// The tape's vocabulary: a Node is one recorded op; its edges point at the nodes that
// produced its inputs; SavedTensor keeps what backward needs and checks it wasn't modified.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd_meta.h"
#include "core/tensor.h"

namespace mg::autograd {

struct Node;

// Where a gradient flows: input `input_nr` of `node` (null node = no gradient needed).
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// A tensor stashed for backward. Remembers the version it was saved at; unpack() raises
// mg::AutogradError naming the op if an in-place op changed it since.
class OffloadedStorage;  // autograd/offload.h

class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op);
  Tensor unpack() const;
  void reset() {
    data_ = Tensor();
    recompute_from_.reset();
    offloaded_.reset();
  }
  bool defined() const { return data_.defined() || recompute_from_ != nullptr; }
  // False when an in-place op has written the tensor since it was saved (unpack() would raise).
  bool unchanged() const {
    if (recompute_from_) return *version_ == saved_version_;
    return !data_.defined() || data_.version() == saved_version_;
  }

 private:
  Tensor data_;  // detached: saving never creates a reference cycle through grad_fn
  // Set instead of data_ when the tensor is an output of a node that recomputes its
  // outputs; version_ still guards against in-place changes of the original.
  std::shared_ptr<Node> recompute_from_;
  // Set when offloaded: data_ then keeps the geometry, dtype and version counter, no storage.
  std::shared_ptr<OffloadedStorage> offloaded_;
  uint32_t output_nr_ = 0;
  std::shared_ptr<uint32_t> version_;
  uint32_t saved_version_ = 0;
  const char* op_ = "";
  bool was_defined_ = false;
};

struct Node : std::enable_shared_from_this<Node> {
  virtual ~Node() = default;
  // Gradients w.r.t. this node's outputs in, gradients w.r.t. its inputs out (one per edge;
  // an undefined Tensor means zero).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  // Drops everything saved for backward (called after apply unless retain_graph).
  virtual void release_saved() {}
  virtual std::string name() const = 0;
  // A node that can rebuild its forward outputs (a checkpoint region marked
  // recompute_outputs): tensors later ops save from it are not kept, SavedTensor::unpack
  // asks for them again. The default node keeps nothing and cannot.
  virtual bool recomputes_outputs() const { return false; }
  virtual Tensor recompute_output(uint32_t /*output_nr*/) { return Tensor(); }

  std::vector<Edge> next_edges;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;  // creation order: later nodes run first on ties
  bool released = false;
  // Whether the engine hands apply() zeros for an output that got no gradient (the default), or
  // leaves it undefined: a fused node whose outputs belong to different ops (the FP8 recipe's
  // norm and linear) skips the part whose output nothing used, as the separate ops would.
  bool materialize_grads = true;
  // Input metadata so undefined/zero grads can be materialized with the right shape.
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  std::vector<Device> output_devices;
  // A dtype besides output_dtypes[0] whose gradient for output 0 this node takes as it is (the
  // engine casts any other mismatch to output_dtypes). Set on a narrowing cast ("to" f32 -> bf16,
  // autocast's weight casts): its backward casts the gradient back to the source dtype anyway, so
  // a GEMM may write a weight gradient in f32 (grad_dtype_for) and save a rounding and a kernel.
  std::optional<DType> accepts_grad_dtype;
  // Weak handles to the tensors this node produced, so the engine can fill the .grad of a
  // non-leaf output that asked for retain_grad() (weak: outputs own their grad_fn, not back).
  std::vector<std::weak_ptr<TensorImpl>> output_tensors;
};

// Accumulates into a leaf's .grad (the sink of every path to a leaf).
struct AccumulateGrad final : Node {
  explicit AccumulateGrad(const Tensor& leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  std::weak_ptr<TensorImpl> leaf;
};

// Post-accumulate-grad hooks: called right after AccumulateGrad has stored a leaf's new
// .grad (the total so far), with the leaf. DDP launches its gradient buckets from here, while
// the rest of backward is still running. A hook may read and replace the leaf's .grad.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
// Returns a handle for remove_post_accumulate_grad_hook. Hooks run in registration order;
// they live in a registry keyed by the leaf's TensorImpl (not in the leaf) and never keep
// the leaf alive.
uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);
void remove_post_accumulate_grad_hook(uint64_t handle);

// A gradient sink takes a leaf's gradients instead of its .grad: each gradient backward
// produces for `leaf` is handed to `sink` as it arrives, in the leaf's dtype (or grad_dtype) and on `device`
// (which may differ from the leaf's: a parameter in host memory read on a CUDA device sinks its
// gradient where it was computed), and nothing accumulates into leaf.grad; post-accumulate-grad
// hooks do not run for it. The sink runs on the thread running backward, and owns what it does
// with the gradient (memory/host_params.h copies it to the host asynchronously). One sink a leaf;
// setting one replaces the last; the registry holds the leaf weakly.
using GradientSink = std::function<void(const Tensor& leaf, Tensor grad)>;
// grad_dtype: a wider floating dtype the sink takes the gradient in, as the op made it (a bf16
// parameter's GEMM writes its weight gradient in f32, grad_dtype_for, as for an f32 weight's
// autocast cast): what the f32 master of a bf16 parameter is updated with (autograd/param_units.h).
void set_gradient_sink(const Tensor& leaf, Device device, GradientSink sink,
                       std::optional<DType> grad_dtype = std::nullopt);
void clear_gradient_sink(const Tensor& leaf);

// A node whose backward is a closure written beside the forward (Flashlight style).
// Saved tensors live in the closure's captures; release_saved() destroys the closure.
struct FunctionNode final : Node {
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
  FunctionNode(std::string op_name, Backward fn) : op_name_(std::move(op_name)), fn_(std::move(fn)) {}
  // Tears the graph down iteratively: a long chain (a loss summed over 1M steps) destroyed
  // recursively would overflow the stack.
  ~FunctionNode() override;
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release_saved() override { fn_ = nullptr; }
  std::string name() const override { return op_name_; }

 private:
  std::string op_name_;
  Backward fn_;
};

// The edge a gradient for `t` should flow into (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

// The dtype a gradient for `t` is best made in: the wider one t's grad_fn takes as it is
// (Node::accepts_grad_dtype: t is a narrowing cast of an f32 weight), else t's own.
DType grad_dtype_for(const Tensor& t);
// Marks `cast`'s grad_fn, the "to" node of a cast from `from`, as taking gradients in `from`
// as they are, when `from` is the wider floating type. No-op for an untracked cast.
void accept_source_dtype_grads(const Tensor& cast, DType from);

// True when grad mode is on and some input requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Records `outputs` as produced by an op with backward `fn` over `inputs`: creates the node,
// wires edges for inputs that require grad, and sets each output's grad_fn. No-op (outputs
// stay plain) when no input requires grad or grad mode is off.
void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            FunctionNode::Backward fn);
inline void record(const char* op, const std::vector<Tensor>& inputs, const Tensor& output, FunctionNode::Backward fn) {
  record(op, inputs, std::vector<Tensor>{output}, std::move(fn));
}

// record() for a node built by the caller (a Node subclass such as the checkpoint node):
// assigns its sequence number, wires an edge for every input that requires grad, and makes
// each floating output require grad with `node` as its grad_fn (even when no input
// requires grad: a checkpoint region's parameters are reached through the node itself).
void record_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs);

// Selective recomputation. While a RecomputePolicy scope (autograd/recompute.h) is active
// this is set, and the cheap ops it may name (gelu, silu, relu, layer_norm, dropout,
// softmax) call it first with a closure of themselves: when it returns a defined tensor the
// op ran as a checkpoint region whose output is rebuilt, not stored, for backward.
using RecomputeHook = Tensor (*)(const char* op, const Tensor& x, const std::function<Tensor(const Tensor&)>& fn);
extern thread_local RecomputeHook recompute_hook;
// Set with the hook: whether the policy would rebuild `op`'s output here (grad mode on, outside
// a rebuilt op's own region). A fused op that holds such an output itself (gelu_mlp's GELU)
// asks it and drops the output from its own saved state instead of splitting into plain ops.
using RecomputeQuery = bool (*)(const char* op);
extern thread_local RecomputeQuery recompute_query;

// Selective activation checkpointing (CheckpointOptions::keep_ops in autograd/recompute.h):
// the outputs a checkpoint region keeps from its forward, so that its replay takes them instead
// of running those ops again (PyTorch's selective activation checkpoint, MUST_SAVE). While such
// a region runs its forward, region_stash points at its stash and the ops it names put their
// outputs in, in call order; while it replays, the same calls take them back out in the same
// order. The entries are SavedTensors: version-checked, and offloaded under an OffloadScope.
class RegionStash {
 public:
  explicit RegionStash(std::vector<std::string> ops, std::string region);
  bool keeps(const char* op) const;
  bool replaying() const { return replaying_; }
  void put(const char* op, const std::vector<Tensor>& outs);
  // The next entry, which must be `op`'s (AutogradError otherwise: the replay called other ops
  // than the forward, so the region was not a function of its inputs). Empty when the region
  // wrote the kept output in place after the op made it: the op then runs again.
  std::vector<Tensor> take(const char* op);
  // "weight_casts": autocast's casts of leaf weights, found by their source (a weight used twice is
  // cast once, and a replay may meet the cache in another state than the forward did).
  void put_cast(const Tensor& source, const Tensor& cast);
  // The forward's cast of `source` to `dtype`, if kept and `source` is unchanged since; else undefined.
  Tensor take_cast(const Tensor& source, DType dtype);
  void start_replay();
  // After the replay: every entry was taken (AutogradError otherwise); the stash is emptied.
  void finish_replay();
  size_t size() const { return entries_.size() + casts_.size(); }

 private:
  struct Entry {
    const char* op;
    std::vector<SavedTensor> outs;
  };
  struct CastEntry {
    std::weak_ptr<TensorImpl> source;
    uint32_t version;
    Tensor cast;
  };
  std::vector<std::string> ops_;
  std::string region_;
  std::vector<Entry> entries_;
  std::vector<CastEntry> casts_;
  size_t next_ = 0;
  bool replaying_ = false;
};
extern thread_local RegionStash* region_stash;
// The scales of the FP8 casts a checkpoint region makes (the FP8 recipe's forward casts,
// autograd/fp8_linear.h): its forward puts each cast's scale in, in call order, and its replay
// casts with them in the same order, so the replay's codes are the forward's although delayed
// scaling's histories moved in between (and current scaling's replay skips its amax pass).
// checkpoint() makes one for each region it records.
class RegionScales {
 public:
  explicit RegionScales(std::string region) : region_(std::move(region)) {}
  // Keeps the scale here and in every enclosing region whose forward is running (a region made
  // with grad on inside another's forward: the outer replay makes the inner casts again, taking
  // them from its own list).
  void put(const Tensor& scale, const Tensor& scale_inv);
  // The region whose forward this one's forward runs inside, while it does (checkpoint() sets it
  // for the forward's span; null otherwise).
  RegionScales* enclosing = nullptr;
  // The next cast's scale and scale_inv (AutogradError where the forward made no more casts: the
  // region was not a function of its inputs).
  std::pair<Tensor, Tensor> take();
  void start_replay() { next_ = 0; }
  // After the replay: every scale was taken (AutogradError otherwise).
  void finish_replay() const;
  size_t size() const { return scales_.size(); }

 private:
  std::string region_;
  std::vector<std::pair<Tensor, Tensor>> scales_;
  size_t next_ = 0;
};
// While a region's forward runs, where its FP8 casts put their scales (null outside); while a
// region replays, where they take them. Both are set inside a region's replay whose forward makes
// a region of its own (the inner forward takes the outer's scales and keeps them for its replay).
extern thread_local RegionScales* region_scales_put;
extern thread_local RegionScales* region_scales_take;

// autocast's weight casts ("weight_casts"): in a region's replay, the forward's cast of `source`
// (undefined when there is none); in its forward, keep `cast` for the replay.
Tensor stash_take_cast(const Tensor& source, DType dtype);
void stash_put_cast(const Tensor& source, const Tensor& cast);

// The ops that take part ("attention", "gelu_mlp", "linear") compute their outputs through this
// one call: in a region's replay, the outputs its forward kept for this call of `op`; otherwise
// run()'s, kept for the replay when the region keeps `op`. `want` is the shape this call makes
// for its first output: a kept one of another shape is an AutogradError (the region was not a
// function of its inputs).
std::vector<Tensor> kept_or_run(const char* op, const Shape& want, const std::function<std::vector<Tensor>()>& run);
// How many times this thread's replays took kept outputs instead of running the op (tests and
// benches count what selective checkpointing saved).
int64_t stash_reuse_count();

// Checks an in-place op on `t` is allowed (not a leaf requiring grad while grad mode is on)
// and bumps its version counter. `op` names the in-place op for the error message.
void check_inplace(const Tensor& t, const char* op);

// ---- helpers for writing differentiable ops (used across autograd/*_ops.cc) ----

// Runs `write` as the in-place op `op` on `t`: check_inplace first, then the write. The
// version ends exactly one higher whether or not `write` bumps it itself, and is restored
// if `write` throws (bad input leaves the tensor as it was).
void inplace_update(const Tensor& t, const char* op, const std::function<void()>& write);

// record() for an op that modified `self` in place: the node's first edge is self's previous
// history, then one per tensor in `others`; self's grad_fn becomes the new node (history
// rebase). `fn` returns {grad for old self, grads for others...}. No-op when nothing
// requires grad or grad mode is off.
void record_inplace(const char* op, const Tensor& self, const std::vector<Tensor>& others, FunctionNode::Backward fn);

// True when `t` is defined and requires grad (decides what an op must save).
inline bool needs_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace mg::autograd
