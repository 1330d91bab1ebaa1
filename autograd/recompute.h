// Gradient checkpointing (activation recomputation): a region's forward keeps only its
// inputs, and its backward replays the region (same RNG stream, same autocast state).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mg {

struct CheckpointOptions {
  // Replay with the RNG state the forward started from, so dropout draws the same masks.
  bool preserve_rng_state = true;
  // Also drop the region's outputs: a later op that saves one for backward keeps a handle
  // to this region instead of the data, and the value is rebuilt from the region's inputs
  // when that op's backward needs it. Meant for cheap regions (norms, activations) whose
  // inputs are saved anyway: this is selective recomputation. Off, the outputs live as long
  // as anything holds them, like any other tensor.
  bool recompute_outputs = false;
  // Names the region in error messages and in the tape ("checkpoint" by default).
  const char* name = "checkpoint";
  // Selective activation checkpointing: the op kinds whose outputs the region keeps from its
  // forward, so that its replay takes them instead of running those ops again (PyTorch's
  // create_selective_checkpoint_contexts with MUST_SAVE). The region then keeps its inputs plus
  // these outputs, and the replay runs only the rest. Kinds that take part:
  //   "attention": the flash kernels' output and logsumexp (attention_packed_qkv,
  //                scaled_dot_product_attention); the replay skips the attention forward;
  //   "gelu_mlp":  the fused MLP's output; the replay runs c_fc and the GELU its backward needs,
  //                not c_proj;
  //   "linear":    a linear's output; the replay skips its GEMM;
  //   "weight_casts": autocast's casts of the weights the region uses; the replay does not cast
  //                them again. They then live until the region's backward (under autocast they
  //                are alive through the forward anyway, in its cast cache).
  // Other names are a ValueError. A region inside another region (its forward or its replay)
  // keeps what the outer region keeps, not its own list.
  std::vector<std::string> keep_ops;
};

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs fn(inputs) without recording its graph and returns its outputs, which take a single
// node as their grad_fn. Backward replays fn with grad enabled on detached copies of the
// inputs and backpropagates through the replay: gradients reach the inputs that require grad
// and every parameter fn used (accumulated into their .grad, as a plain run would).
// Works for several outputs, inputs that do not require grad (a region whose only grad
// source is its parameters) and regions without parameters, and nests. With grad mode off
// it simply runs fn. Undefined tensors are allowed as inputs and outputs.
// fn must be a function of its inputs, the RNG and the autocast state only (like PyTorch's):
// a replay that returns different shapes is an AutogradError.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& opts = {});
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& opts = {});

// Chen et al.'s segmented checkpointing over a chain: functions[0..n) split into
// `segments` contiguous runs of (nearly) equal length; every run but the last is
// checkpointed (the last one's activations are needed right away by backward). 1 <= segments.
Tensor checkpoint_sequential(const std::vector<std::function<Tensor(const Tensor&)>>& functions, int64_t segments,
                             const Tensor& input, const CheckpointOptions& opts = {});

// Checkpoints exactly the runs [bounds[i], bounds[i+1]) whose flag is set; the others run
// plainly. bounds starts at 0, ends at functions.size() and increases (the planner's output).
Tensor checkpoint_segments(const std::vector<std::function<Tensor(const Tensor&)>>& functions,
                           const std::vector<int64_t>& bounds, const std::vector<bool>& checkpointed,
                           const Tensor& input, const CheckpointOptions& opts = {});

// Selective recomputation: a policy per op kind. Inside a SelectiveRecompute scope, each
// op the policy names runs as its own recompute_outputs region: its output is not kept for
// backward but rebuilt from its input (saved anyway) when needed, while everything else
// (matmuls, convolutions, attention) keeps its saved tensors. Names: "gelu", "silu", "relu",
// "layer_norm", "dropout", "softmax".
struct RecomputePolicy {
  std::vector<std::string> ops;
  // gelu, silu, layer_norm, dropout, softmax: outputs a following matmul saves while their
  // own inputs are saved anyway. relu is left out: its backward needs only its output, so
  // recomputing it trades the output for the input and saves nothing.
  static RecomputePolicy cheap_ops();
  bool recomputes(const char* op) const;
};

class SelectiveRecompute {
 public:
  explicit SelectiveRecompute(RecomputePolicy policy);
  ~SelectiveRecompute();
  SelectiveRecompute(const SelectiveRecompute&) = delete;
  SelectiveRecompute& operator=(const SelectiveRecompute&) = delete;

 private:
  RecomputePolicy policy_;
  const RecomputePolicy* prev_;
};

// How many checkpoint replays this thread has run (tests and benches count recomputation).
int64_t checkpoint_replay_count();

}  // namespace mg
