// GPT's memory ladder for fit_to_budget: its training-step configurations from fastest to
// smallest, each applied to the model (and to a StepInBackward, when one is given).
#pragma once

#include <vector>

#include "memory/batch_fit.h"
#include "nn/models/gpt.h"
#include "optim/step_in_backward.h"

namespace mg::nn {

// The rungs, in order (B=8 bf16 GPT-2 124M on the H200, docs/recompute.md: 4.80 GiB at
// 20.4 ms down to 2.35 GiB at about +29 %):
//   0. no recomputation;
//   1. selective recomputation of the GELU output only, with the optimizer step inside
//      backward (when in_backward is given);
//   2 .. n_layer + 1. the first 1 .. n_layer blocks checkpointed on top of rung 1, and the head's
//      logits made 2048 rows at a time.
// Each rung sets model.recompute whole (block mask, selective ops, head chunk rows) and
// enables or disables in_backward; the model and in_backward must outlive the ladder.
std::vector<BudgetOption> gpt_memory_ladder(GPT& model, optim::StepInBackward* in_backward = nullptr);

}  // namespace mg::nn
