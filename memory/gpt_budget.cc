#include "memory/gpt_budget.h"

#include <string>

namespace mg::nn {

std::vector<BudgetOption> gpt_memory_ladder(GPT& model, optim::StepInBackward* in_backward) {
  const std::string sib = in_backward ? " step in backward" : "";
  auto mode = [&model, in_backward](int64_t blocks, bool lean) {
    GPTRecompute r;
    r.block_mask.assign(model.config.n_layer, false);
    for (int64_t i = 0; i < blocks; ++i) r.block_mask[i] = true;
    if (lean) r.selective = true, r.selective_ops = {"gelu"};
    r.head_chunk_rows = blocks > 0 ? 2048 : 0;
    model.recompute = r;
    if (in_backward) in_backward->set_enabled(lean);
  };
  std::vector<BudgetOption> ladder;
  ladder.push_back({"no recomputation", [mode] { mode(0, false); }});
  ladder.push_back({"selective gelu" + sib, [mode] { mode(0, true); }});
  for (int64_t k = 1; k <= model.config.n_layer; ++k)
    ladder.push_back({"checkpoint " + std::to_string(k) + " blocks selective gelu head chunk 2048" + sib,
                      [mode, k] { mode(k, true); }});
  return ladder;
}

}  // namespace mg::nn
