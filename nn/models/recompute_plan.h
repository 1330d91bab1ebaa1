// Where a GPT's memory decisions are carried out: which blocks are checkpointed and what they
// keep, which ops are rebuilt, which blocks offload what they save. GPT::forward stays the math
// and hands each block to BlockPlan::run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "autograd/offload.h"
#include "autograd/param_units.h"
#include "autograd/recompute.h"
#include "autograd/residual.h"
#include "nn/transformer.h"

namespace mg::nn {

// Activation recomputation for GPT::forward (autograd/recompute.h). Per-block
// checkpointing keeps each block's input only; selective recomputation keeps the matmul and
// attention outputs and rebuilds the layer norms, GELU and dropout; both can be combined.
struct GPTRecompute {
  bool checkpoint_blocks = false;  // every block
  std::vector<bool> block_mask;    // or exactly these blocks (a planner's choice; size n_layer)
  bool selective = false;
  // The op kinds selective recomputation rebuilds (RecomputePolicy names); empty:
  // RecomputePolicy::cheap_ops(). {"gelu"} alone drops the MLP's GELU output (a quarter of a
  // block's activations) and keeps the fused residual-add + layer norm, which a policy naming
  // layer_norm runs as plain ops.
  std::vector<std::string> selective_ops;
  // The op outputs a checkpointed block keeps (CheckpointOptions::keep_ops): {"attention",
  // "gelu_mlp", "weight_casts"} keeps the attention output and logsumexp, the MLP's output and
  // the block's bf16 weight casts under autocast. The block then keeps twice a plain checkpoint's
  // bytes (GPT-2 at B=8, T=1024: about 50 MB a block against 25, and 230 without checkpointing),
  // and its replay skips the attention forward, the MLP's c_proj GEMM and the casts.
  std::vector<std::string> keep_ops;
  // That set: what `gpt2 --recompute per-block-keep` and gpt_memory_ladder's kept rungs use.
  static std::vector<std::string> block_outputs() { return {"attention", "gelu_mlp", "weight_casts"}; }
  // Rows of logits forward_loss makes at a time (0: linear_cross_entropy's choice, about
  // 512 MiB of logits; fewer rows lower the peak at the head for more, smaller GEMMs).
  int64_t head_chunk_rows = 0;
  // The first N blocks run under an OffloadScope (autograd/offload.h): what they save for
  // backward goes to page-locked host memory while the later blocks run, and comes back as
  // backward nears them. The first blocks because backward needs their tensors last: the copies
  // have the rest of the forward to finish and the rest of backward to return. Before the head
  // (the step's peak) the forward waits for those copies: offload_wait().
  int64_t offload_blocks = 0;
  OffloadOptions offload;
  // Parameters that live elsewhere between uses (ZeRO-3 shards, host memory): the units
  // gpt_param_units made (0 the root, i + 1 block i), not owned. Each block then runs as its unit:
  // gathered before, released after, its output with every add done (the MLP's bias, a
  // parameter of the block, is not left pending for the next block's layer norm).
  ParamUnits* units = nullptr;
  bool checkpointed(int64_t layer) const {
    return checkpoint_blocks || (layer < static_cast<int64_t>(block_mask.size()) && block_mask[layer]);
  }
};

// Carries a GPTRecompute plan out over one forward pass. Constructed before the first block
// (it enters the selective-recompute policy and the offload scope for the whole pass); run(i, ...)
// once per block in order; finish() before the head.
//
// A checkpointed block keeps its input only, so the stream reaches it added up and the region
// holds one tensor: the block before it, and the region itself, end with the add done and the
// MLP's bias in its GEMM (TransformerBlock::output), as no layer norm reads their output. With
// keep_ops naming "gelu_mlp" the region takes and returns the stream with its pending branch
// instead: the branch it returns is the MLP output the region keeps anyway, and the add still
// fuses into the next layer norm.
class BlockPlan {
 public:
  BlockPlan(const GPTRecompute& plan, int64_t n_layer);
  Residual run(int64_t i, TransformerBlock& block, const Residual& x);
  // Ends the offload scope and waits for its copies (the head is the step's peak: the offloaded
  // blocks' memory must be back by then).
  void finish();

 private:
  Residual checkpointed_with_branch(TransformerBlock& block, const Residual& x);
  Residual run_unit(int64_t i, TransformerBlock& block, const Residual& x);
  // Whether a layer norm reads block i's output with its pending add: the next block's ln_1
  // (unless that block is a region that takes the stream added up) or ln_f.
  bool norm_reads_output(int64_t i) const;
  const GPTRecompute& plan_;
  const int64_t n_layer_;
  CheckpointOptions opts_;
  bool keeps_branch_ = false;
  std::optional<SelectiveRecompute> selective_;
  std::optional<OffloadScope> offload_;
};

}  // namespace mg::nn
