// GPT's memory ladder for fit_to_budget: its training-step configurations from fastest to
// smallest, each applied to the model (and to a StepInBackward, when one is given).
#pragma once

#include <vector>

#include "memory/batch_fit.h"
#include "memory/planner.h"
#include "nn/models/gpt.h"
#include "optim/step_in_backward.h"

namespace mg::memory {

// The rungs, in order (B=8 bf16 GPT-2 124M on the H200, docs/recompute.md: 4.80 GiB at
// about 20 ms down to about 2.35 GiB at about +29 %):
//   0. no recomputation;
//   1. selective recomputation of the GELU output only, with the optimizer step inside
//      backward (when in_backward is given);
//   2 .. n_layer + 1. the first 1 .. n_layer blocks checkpointed on top of rung 1, each keeping
//      its attention and MLP outputs and its weight casts (GPTRecompute::keep_ops);
//   n_layer + 2. every block so, and the head's logits made 2048 rows at a time;
//   n_layer + 3. every block checkpointed keeping only its input, the head in 2048-row chunks.
// With offload_blocks = m > 0, rungs 1 on also offload what the first m blocks save
// (GPTRecompute::offload_blocks), and the checkpointed blocks are the ones after them (1 ..
// n_layer - m). How many blocks offload hides depends on the host link: on the H200 (55 GB/s
// each way) one block of GPT-2 at B=8 costs under 1 %, the second about 24 % (docs/recompute.md).
// Each rung sets model.recompute whole (block mask, selective ops, head chunk rows, offload) and
// enables or disables in_backward; the model and in_backward must outlive the ladder.
// With weight_cast_cache given, each rung also sets it: false on the rungs that checkpoint blocks
// (" casts per use" in their names; their blocks keep no weight casts either), true on the others. The caller's step
// opens its Autocast with it (cache_enabled): a checkpointed block's weight casts then live only while its replay and
// its backward run, where the cache would hold every block's for the whole step (GPT-2 XL with AdamW8bit under a 16 GiB
// cap: 1.22x the uncapped step where the cache gave 1.37x, docs/bigger_than_gpu.md). It must outlive the ladder too.
std::vector<BudgetOption> gpt_memory_ladder(nn::GPT& model, optim::StepInBackward* in_backward = nullptr,
                                            int64_t offload_blocks = 0, bool* weight_cast_cache = nullptr);

// GPT's blocks profiled (memory::profile_segments: bytes each keeps for backward, forward time) on
// a random batch of `batch` sequences of block_size positions on `device`, under the caller's
// autocast: what the checkpoint planner and the offload planner weigh.
std::vector<SegmentProfile> profile_gpt_blocks(nn::GPT& model, int64_t batch, Device device);

// How many of GPT's first blocks offload with their copies hidden (GPTRecompute::offload_blocks):
// plan_offload over the blocks' profile at `batch` and the host link measured on `device`. GPT
// waits for the copies out before its head, so they must finish within the blocks' forward. The
// copies may leave exposed at most max_slowdown of the blocks' forward and backward (1 +
// kOffloadBackwardRatio times their profiled forward time): the cost model is an estimate, and a
// plan that must hide every microsecond would give up a block whose copies cost the step nothing
// measurable. The plan stops before a block that keeps more than
// GPTRecompute::offload.prefetch_bytes (plan_offload's window).
// Nothing is offloaded off CUDA (plan of 0 blocks).
struct GPTOffloadPlan {
  OffloadPlan plan;
  HostLink link;                        // zero off CUDA
  std::vector<SegmentProfile> profile;  // the blocks' (evaluate_offload weighs other counts)
  double max_exposed_ms = 0.0;          // the bound the plan was held to
  std::string summary() const;          // the plan, its bound and the link, one line
};
GPTOffloadPlan plan_gpt_offload(nn::GPT& model, int64_t batch, Device device, double max_slowdown = 0.05);

}  // namespace mg::memory
