// GPT with per-block checkpointing, selective recomputation, both, and a planner's block
// mask: the same loss and bitwise the same gradients as the plain run (dropout on), and
// less memory kept after the forward; on CUDA the same within rounding (skips without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/recompute.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/random.h"
#include "memory/gpt_budget.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "optim/step_in_backward.h"

namespace mg::nn {

using namespace mg::memory;  // the module under test
namespace {

struct StepResult {
  double loss = 0;
  int64_t kept = 0;
  std::vector<std::vector<float>> grads;
};

StepResult train_step(GPT& m, const Tensor& idx, const Tensor& targets) {
  m.zero_grad(true);
  manual_seed(11);
  StepResult r;
  const int64_t before = memory_allocated(idx.device());
  Tensor loss = GPT::loss(m(idx), targets);
  r.kept = memory_allocated(idx.device()) - before;
  loss.backward();
  r.loss = loss.item();
  for (const Tensor& p : m.parameters()) r.grads.push_back(p.grad().to_vector<float>());
  return r;
}

// An f32 GPT on the first CUDA device with a batch of 4 sequences of block_size tokens.
struct CudaGpt {
  Generator g;
  GPT m;
  Tensor idx, targets;
  CudaGpt(const GPTConfig& c, uint64_t seed)
      : g(seed),
        m(c, {DType::f32, Device::cuda(0)}, &g),
        idx(randint(0, c.vocab_size, {4, c.block_size}, {DType::i64, Device::cuda(0)}, &g)),
        targets(randint(0, c.vocab_size, {4, c.block_size}, {DType::i64, Device::cuda(0)}, &g)) {}
  StepResult step() { return train_step(m, idx, targets); }
};

// A CUDA step against the plain one. Not bitwise: f32 atomics (the one-pass attention backward's
// dQ, the embedding's scatter of repeated tokens) sum in another order each run. Such a sum has
// at most B * T = 256 terms here, so it moves by at most 256 roundings of 2^-24 of its largest
// partial sum, under 2e-5 of a gradient's scale; 1e-4 leaves room for that to pass through the
// layers. The loss is a forward-only result of the same kernels: 1e-6 of it.
void expect_within_rounding(const StepResult& r, const StepResult& plain, const std::string& what) {
  EXPECT_NEAR(r.loss, plain.loss, 1e-6 * std::abs(plain.loss)) << what;
  ASSERT_EQ(r.grads.size(), plain.grads.size()) << what;
  for (size_t i = 0; i < r.grads.size(); ++i) {
    double worst = 0, scale = 0;
    for (size_t k = 0; k < r.grads[i].size(); ++k) {
      worst = std::max(worst, static_cast<double>(std::abs(r.grads[i][k] - plain.grads[i][k])));
      scale = std::max(scale, static_cast<double>(std::abs(plain.grads[i][k])));
    }
    EXPECT_LE(worst, 1e-4 * scale + 1e-7) << what << " param " << i;
  }
}

TEST(GPTRecompute, AllModesMatchThePlainRunBitwise) {
  const GPTConfig c{.vocab_size = 64, .block_size = 16, .n_layer = 3, .n_head = 2, .n_embd = 32, .dropout = 0.1};
  Generator g(1);
  GPT m(c, {}, &g);
  Tensor idx = randint(0, 64, {4, 16}, {DType::i64}, &g), targets = randint(0, 64, {4, 16}, {DType::i64}, &g);
  const StepResult plain = train_step(m, idx, targets);
  struct Mode {
    const char* name;
    GPTRecompute r;
  };
  std::vector<Mode> modes(5);
  modes[0] = {"per-block", {}};
  modes[0].r.checkpoint_blocks = true;
  modes[1] = {"selective", {}};
  modes[1].r.selective = true;
  modes[2] = {"per-block + selective", {}};
  modes[2].r.checkpoint_blocks = modes[2].r.selective = true;
  modes[3] = {"mask", {}};
  modes[3].r.block_mask = {true, false, true};
  // On the CPU attention runs as plain ops (nothing to keep); the MLP and the linears keep.
  modes[4] = {"per-block keeping attention, gelu_mlp, linear", {}};
  modes[4].r.checkpoint_blocks = true;
  modes[4].r.keep_ops = {"attention", "gelu_mlp", "linear"};
  for (const Mode& mode : modes) {
    m.recompute = mode.r;
    const StepResult r = train_step(m, idx, targets);
    EXPECT_EQ(r.loss, plain.loss) << mode.name;
    ASSERT_EQ(r.grads.size(), plain.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i) EXPECT_EQ(r.grads[i], plain.grads[i]) << mode.name << " param " << i;
    EXPECT_LT(r.kept, plain.kept) << mode.name;
  }
  m.recompute = {};
}

TEST(GPTRecompute, CudaModesMatchThePlainRunWithinRounding) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CudaGpt t({.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .dropout = 0.1}, 2);
  GPT& m = t.m;
  const StepResult plain = t.step();
  for (int mode = 0; mode < 3; ++mode) {
    m.recompute = {};
    m.recompute.checkpoint_blocks = mode != 1;
    m.recompute.selective = mode != 0;
    const StepResult r = t.step();
    expect_within_rounding(r, plain, "mode " + std::to_string(mode));
    EXPECT_LT(r.kept, plain.kept) << "mode " << mode;
  }
  m.recompute = {};
}

// Checkpointed blocks keeping the flash attention's and the MLP's outputs: the replay takes both
// (two reuses a block) instead of running them, the gradients agree with the plain run within
// the same rounding bound as above, and the forward keeps more than plain checkpointing and less
// than no recomputation. Dropout 0: the flash kernels only run without it.
TEST(GPTRecompute, CudaBlocksKeepingAttentionAndMlpOutputs) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const GPTConfig c{.vocab_size = 256, .block_size = 64, .n_layer = 3, .n_head = 4, .n_embd = 128};
  CudaGpt t(c, 3);
  GPT& m = t.m;
  const StepResult plain = t.step();
  m.recompute.checkpoint_blocks = true;
  const StepResult ck = t.step();
  m.recompute.keep_ops = {"attention", "gelu_mlp"};
  const int64_t reuses = autograd::stash_reuse_count();
  const StepResult kept = t.step();
  EXPECT_EQ(autograd::stash_reuse_count() - reuses, 2 * c.n_layer);
  expect_within_rounding(kept, plain, "keeping attention, gelu_mlp");
  // Per block it keeps the attention output [4, 64, 128] f32, its logsumexp and the MLP output.
  EXPECT_GT(kept.kept, ck.kept);
  EXPECT_LT(kept.kept, plain.kept);
  EXPECT_GE(kept.kept - ck.kept, c.n_layer * 2 * 4 * 64 * 128 * 4);
  m.recompute = {};
}

// gpt_memory_ladder on a tiny CPU GPT: each rung sets the mode it names (model.recompute whole,
// the StepInBackward on or off), and fit_to_budget with a budget at the last rung's measured
// peak picks a rung past plain whose peak fits and leaves that mode applied.
TEST(GPTMemoryLadder, RungsSetTheirModesAndFitToBudgetChoosesOne) {
  const GPTConfig c{.vocab_size = 64, .block_size = 16, .n_layer = 3, .n_head = 2, .n_embd = 32};
  Generator g(2);
  GPT m(c, {}, &g);
  optim::AdamW opt(m.parameters(), {});
  optim::StepInBackward sib(opt);
  const std::vector<BudgetOption> ladder = gpt_memory_ladder(m, &sib);
  ASSERT_EQ(ladder.size(), 2u + 3u + 2u);
  EXPECT_EQ(ladder[0].name, "no recomputation");
  EXPECT_EQ(ladder[3].name,
            "checkpoint 2 blocks keeping attention, gelu_mlp, weight_casts selective gelu step in backward");
  ladder[3].apply();
  EXPECT_EQ(m.recompute.block_mask, (std::vector<bool>{true, true, false}));
  EXPECT_TRUE(m.recompute.selective);
  EXPECT_EQ(m.recompute.selective_ops, std::vector<std::string>{"gelu"});
  EXPECT_EQ(m.recompute.keep_ops, (std::vector<std::string>{"attention", "gelu_mlp", "weight_casts"}));
  EXPECT_EQ(m.recompute.head_chunk_rows, 0);
  EXPECT_TRUE(sib.enabled());
  ladder[5].apply();  // every block, keeping, the head in 2048-row chunks
  EXPECT_EQ(m.recompute.block_mask, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(m.recompute.head_chunk_rows, 2048);
  EXPECT_EQ(m.recompute.keep_ops.size(), 3u);
  ladder[6].apply();  // the smallest: every block keeping only its input
  EXPECT_EQ(ladder[6].name, "checkpoint 3 blocks selective gelu head chunk 2048 step in backward");
  EXPECT_TRUE(m.recompute.keep_ops.empty());
  EXPECT_EQ(m.recompute.head_chunk_rows, 2048);
  ladder[0].apply();
  EXPECT_EQ(m.recompute.block_mask, (std::vector<bool>{false, false, false}));
  EXPECT_FALSE(m.recompute.selective);
  EXPECT_EQ(m.recompute.head_chunk_rows, 0);
  EXPECT_FALSE(sib.enabled());

  // With offloaded blocks: the checkpointed ones come after them, one rung fewer.
  const std::vector<BudgetOption> off = gpt_memory_ladder(m, &sib, 1);
  ASSERT_EQ(off.size(), 2u + 2u + 2u);
  EXPECT_EQ(off[1].name, "selective gelu step in backward offload 1 blocks");
  off[3].apply();
  EXPECT_EQ(off[3].name,
            "checkpoint 2 blocks keeping attention, gelu_mlp, weight_casts selective gelu step in backward offload 1 "
            "blocks");
  EXPECT_EQ(m.recompute.block_mask, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(m.recompute.offload_blocks, 1);
  off[0].apply();
  EXPECT_EQ(m.recompute.offload_blocks, 0);

  // With a weight-cast cache setting to drive: off on the rungs that checkpoint blocks, named so.
  bool cache = true;
  const std::vector<BudgetOption> cast = gpt_memory_ladder(m, &sib, 0, &cache);
  ASSERT_EQ(cast.size(), ladder.size());
  cast[2].apply();
  EXPECT_FALSE(cache);
  EXPECT_EQ(cast[2].name,
            "checkpoint 1 blocks keeping attention, gelu_mlp selective gelu step in backward casts per use");
  EXPECT_EQ(m.recompute.keep_ops, (std::vector<std::string>{"attention", "gelu_mlp"}));
  cast[1].apply();
  EXPECT_TRUE(cache);
  EXPECT_EQ(cast[1].name, ladder[1].name);
  cast[6].apply();
  EXPECT_FALSE(cache);
  cast[0].apply();
  EXPECT_TRUE(cache);

  Tensor idx = randint(0, 64, {4, 16}, {DType::i64}, &g), targets = randint(0, 64, {4, 16}, {DType::i64}, &g);
  auto step = [&] {
    opt.zero_grad();
    m.forward_loss(idx, targets).backward();
    if (sib.enabled())
      sib.finish();
    else
      opt.step();
  };
  step();  // the optimizer's state, before anything is measured
  auto peak_of = [&](size_t i) {
    ladder[i].apply();
    reset_peak_memory_stats(Device::cpu());
    step();
    return max_memory_allocated(Device::cpu());
  };
  const int64_t plain = peak_of(0), last = peak_of(ladder.size() - 1);
  ASSERT_LT(last, plain) << "the smallest rung should lower this step's peak";
  const BudgetFitResult r = fit_to_budget(ladder, step, last, Device::cpu());
  ASSERT_TRUE(r.fits()) << r.summary(last);
  EXPECT_GE(r.chosen, 1);
  EXPECT_LE(r.peaks[r.chosen].second, last);
  const int64_t blocks = std::min<int64_t>(r.chosen - 1, c.n_layer);  // the last two rungs: every block
  for (int64_t i = 0; i < c.n_layer; ++i) EXPECT_EQ(m.recompute.block_mask[i], i < blocks) << "block " << i;
  EXPECT_TRUE(sib.enabled());
}

// plan_gpt_offload off CUDA: the blocks are profiled (one row each, the bytes they keep), there is
// no host link, and nothing is offloaded.
TEST(GPTOffloadPlan, OnTheCpuProfilesTheBlocksAndOffloadsNothing) {
  const GPTConfig c{.vocab_size = 64, .block_size = 16, .n_layer = 3, .n_head = 2, .n_embd = 32};
  Generator g(3);
  GPT m(c, {}, &g);
  const GPTOffloadPlan p = plan_gpt_offload(m, 2, Device::cpu());
  ASSERT_EQ(p.profile.size(), 3u);
  for (const SegmentProfile& s : p.profile) EXPECT_GT(s.kept_bytes, 0);
  EXPECT_EQ(p.plan.segments, 0);
  EXPECT_EQ(p.plan.total_segments, 3);
  EXPECT_EQ(p.link.to_host_bytes_per_ms, 0.0);
  EXPECT_EQ(p.summary().rfind("offload 0 of 3 segments (0 B), exposed 0.00 ms", 0), 0u) << p.summary();
  double forward_ms = 0.0;
  for (const SegmentProfile& s : p.profile) forward_ms += s.forward_ms;
  EXPECT_DOUBLE_EQ(p.max_exposed_ms, 0.05 * 3.0 * forward_ms);  // the default max_slowdown, 5 %
  EXPECT_THROW(profile_gpt_blocks(m, 0, Device::cpu()), ValueError);
  EXPECT_THROW(plan_gpt_offload(m, 2, Device::cpu(), -0.1), ValueError);
}

}  // namespace
}  // namespace mg::nn
