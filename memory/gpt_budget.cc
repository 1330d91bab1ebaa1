#include "memory/gpt_budget.h"

#include <algorithm>
#include <string>

namespace mg::nn {

std::vector<BudgetOption> gpt_memory_ladder(GPT& model, optim::StepInBackward* in_backward, int64_t offload_blocks) {
  const int64_t n = model.config.n_layer, off = std::clamp<int64_t>(offload_blocks, 0, n);
  const std::string sib = in_backward ? " step in backward" : "";
  const std::string offloaded = off > 0 ? " offload " + std::to_string(off) + " blocks" : "";
  auto mode = [&model, in_backward, n, off](int64_t blocks, bool lean) {
    GPTRecompute r;
    r.block_mask.assign(n, false);
    for (int64_t i = 0; i < blocks; ++i) r.block_mask[off + i] = true;
    if (lean) r.selective = true, r.selective_ops = {"gelu"}, r.offload_blocks = off;
    r.head_chunk_rows = blocks > 0 ? 2048 : 0;
    model.recompute = r;
    if (in_backward) in_backward->set_enabled(lean);
  };
  std::vector<BudgetOption> ladder;
  ladder.push_back({"no recomputation", [mode] { mode(0, false); }});
  ladder.push_back({"selective gelu" + sib + offloaded, [mode] { mode(0, true); }});
  for (int64_t k = 1; k <= n - off; ++k)
    ladder.push_back({"checkpoint " + std::to_string(k) + " blocks selective gelu head chunk 2048" + sib + offloaded,
                      [mode, k] { mode(k, true); }});
  return ladder;
}

}  // namespace mg::nn
