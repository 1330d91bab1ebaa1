// GPT with per-block checkpointing, selective recomputation, both, and a planner's block
// mask: the same loss and bitwise the same gradients as the plain run (dropout on), and
// less memory kept after the forward.
#include <gtest/gtest.h>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "nn/models/gpt.h"

namespace mg::nn {
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
  const int64_t before = memory_allocated();
  Tensor loss = GPT::loss(m(idx), targets);
  r.kept = memory_allocated() - before;
  loss.backward();
  r.loss = loss.item();
  for (const Tensor& p : m.parameters()) r.grads.push_back(p.grad().to_vector<float>());
  return r;
}

TEST(GPTRecompute, AllModesMatchThePlainRunBitwise) {
  GPTConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = 0.1;
  Generator g(1);
  GPT m(c, {}, &g);
  Tensor idx = randint(0, 64, {4, 16}, {DType::i64}, &g), targets = randint(0, 64, {4, 16}, {DType::i64}, &g);
  const StepResult plain = train_step(m, idx, targets);
  struct Mode {
    const char* name;
    GPTRecompute r;
  };
  std::vector<Mode> modes(4);
  modes[0] = {"per-block", {}};
  modes[0].r.checkpoint_blocks = true;
  modes[1] = {"selective", {}};
  modes[1].r.selective = true;
  modes[2] = {"per-block + selective", {}};
  modes[2].r.checkpoint_blocks = modes[2].r.selective = true;
  modes[3] = {"mask", {}};
  modes[3].r.block_mask = {true, false, true};
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

}  // namespace
}  // namespace mg::nn
