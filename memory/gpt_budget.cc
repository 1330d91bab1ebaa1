#include "memory/gpt_budget.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <string>

#include "core/random.h"

namespace mg::memory {

std::vector<BudgetOption> gpt_memory_ladder(nn::GPT& model, optim::StepInBackward* in_backward, int64_t offload_blocks,
                                            bool* weight_cast_cache) {
  const int64_t n = model.config.n_layer, off = std::clamp<int64_t>(offload_blocks, 0, n);
  const std::string sib = in_backward ? " step in backward" : "";
  const std::string offloaded = off > 0 ? " offload " + std::to_string(off) + " blocks" : "";
  const std::string per_use = weight_cast_cache ? " casts per use" : "";
  auto mode = [&model, in_backward, n, off, weight_cast_cache](int64_t blocks, bool lean, bool keep,
                                                               int64_t head_rows) {
    if (weight_cast_cache) *weight_cast_cache = blocks == 0;
    nn::GPTRecompute r;
    r.block_mask.assign(n, false);
    for (int64_t i = 0; i < blocks; ++i) r.block_mask[off + i] = true;
    if (lean) r.selective = true, r.selective_ops = {"gelu"}, r.offload_blocks = off;
    if (keep) r.keep_ops = nn::GPTRecompute::block_outputs();
    // Casting per use, a checkpointed block keeps no weight casts for its replay either: that is
    // the memory the rung gives up the cache for.
    if (keep && weight_cast_cache) std::erase(r.keep_ops, std::string("weight_casts"));
    r.head_chunk_rows = head_rows;
    r.units = model.recompute.units;  // parameter offload's or ZeRO-3's units stay
    model.recompute = r;
    if (in_backward) in_backward->set_enabled(lean);
  };
  std::vector<BudgetOption> ladder;
  ladder.push_back({"no recomputation", [mode] { mode(0, false, false, 0); }});
  ladder.push_back({"selective gelu" + sib + offloaded, [mode] { mode(0, true, false, 0); }});
  // Blocks that keep their attention and MLP outputs first: each saves nearly what a plain
  // checkpoint saves (GPT-2 at B=8: 0.17 GiB against 0.19) for half its replay time.
  const std::string keeping =
      std::string(" keeping attention, gelu_mlp") + (weight_cast_cache ? "" : ", weight_casts") + " selective gelu";
  for (int64_t k = 1; k <= n - off; ++k)
    ladder.push_back({"checkpoint " + std::to_string(k) + " blocks" + keeping + sib + offloaded + per_use,
                      [mode, k] { mode(k, true, true, 0); }});
  // Then the head in smaller chunks, and last the blocks keeping nothing but their inputs.
  const int64_t all = n - off;
  ladder.push_back(
      {"checkpoint " + std::to_string(all) + " blocks" + keeping + " head chunk 2048" + sib + offloaded + per_use,
       [mode, all] { mode(all, true, true, 2048); }});
  ladder.push_back(
      {"checkpoint " + std::to_string(all) + " blocks selective gelu head chunk 2048" + sib + offloaded + per_use,
       [mode, all] { mode(all, true, false, 2048); }});
  return ladder;
}

std::vector<SegmentProfile> profile_gpt_blocks(nn::GPT& model, int64_t batch, Device device) {
  MG_CHECK(batch >= 1, ValueError, "profile_gpt_blocks: batch must be >= 1, got ", batch);
  Generator sample_gen(0);  // the sample draws nothing from the default generator
  Tensor h = randn({batch, model.config.block_size, model.config.n_embd}, {DType::f32, device}, &sample_gen);
  h.requires_grad_(true);
  return profile_segments(segments_of(*model.h), h);
}

std::string GPTOffloadPlan::summary() const {
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << plan.summary() << ", within " << max_exposed_ms << " ms; host link "
    << std::setprecision(1) << link.to_host_bytes_per_ms / 1e6 << " GB/s out, " << link.to_device_bytes_per_ms / 1e6
    << " GB/s back";
  return o.str();
}

GPTOffloadPlan plan_gpt_offload(nn::GPT& model, int64_t batch, Device device, double max_slowdown) {
  MG_CHECK(max_slowdown >= 0.0, ValueError, "plan_gpt_offload: max_slowdown must be >= 0, got ", max_slowdown);
  GPTOffloadPlan g;
  g.profile = profile_gpt_blocks(model, batch, device);
  if (device.is_cuda()) g.link = measure_host_link(device);
  double forward_ms = 0.0;
  for (const SegmentProfile& s : g.profile) forward_ms += s.forward_ms;
  g.max_exposed_ms = max_slowdown * (1.0 + kOffloadBackwardRatio) * forward_ms;  // forward and backward
  g.plan = plan_offload(g.profile, g.link, g.max_exposed_ms, 0.0, kOffloadBackwardRatio,
                        model.recompute.offload.prefetch_bytes);
  return g;
}

}  // namespace mg::memory
